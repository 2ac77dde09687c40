"""What every answer-selection reader shares: the PAIRS shape, the published sizes, the Corpus it returns, and
how a bad record is raised or skipped."""

from __future__ import annotations

import gzip
import io
import os
from dataclasses import dataclass, field
from typing import BinaryIO, cast

import pyarrow as pa

PAIRS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("aid", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),
    ]
)


# Published split sizes: (questions, pairs). Sources: the WikiQA paper and the castorini/jacana releases as
# counted in ../shared/data/*/PROVENANCE.md; TrecQA clean dev/test as in Rao et al. 2016.
PUBLISHED: dict[tuple[str, bool | None], dict[str, tuple[int, int | None]]] = {
    ("wikiqa", True): {"train": (873, 8_672), "dev": (126, 1_130), "test": (243, 2_351)},
    ("wikiqa", False): {"train": (2_118, 20_360), "dev": (296, 2_733), "test": (633, 6_165)},
    ("trecqa", True): {"train": (94, 4_718), "train-all": (1_229, 53_417), "dev": (65, 1_117), "test": (68, 1_442)},
    ("trecqa", False): {"train": (94, 4_718), "train-all": (1_229, 53_417), "dev": (82, 1_148), "test": (100, 1_517)},
    # Feng et al. 2015 (and the GGSA paper's Table 1): train lists only each question's correct answers;
    # dev/test pools hold 500 candidates.
    ("insuranceqa", None): {
        "train": (12_887, 18_540),
        "dev": (1_000, 500_000),
        "test1": (1_800, 900_000),
        "test2": (1_800, 900_000),
    },
    # Tay et al. 2017 splits as counted in the GGSA paper's Table 1 (five candidates per question); the CTRN
    # paper's rounded "253K / 31.7K / 31.7K" pairs disagree with 5 x questions, so pairs are not checked.
    ("yahooqa", None): {"train": (50_112, None), "dev": (6_289, None), "test": (6_283, None)},
    # Reading comprehension (pipelines/readers/passages.py; rows are questions). SearchQA: Dunn et al. 2017
    # (processed train/val/test); Quasar-T: Dhingra et al. 2017; WikiHop: Welbl et al. 2018 (test hidden); SQuAD
    # 1.1: Rajpurkar et al. 2016.
    ("searchqa", None): {"train": (99_820, 99_820), "dev": (13_393, 13_393), "test": (27_248, 27_248)},
    ("quasart", None): {"train": (37_012, 37_012), "dev": (3_000, 3_000), "test": (3_000, 3_000)},
    ("wikihop", None): {"train": (43_738, 43_738), "dev": (5_129, 5_129)},
    ("squad", None): {"train": (87_599, 87_599), "dev": (10_570, 10_570)},
}


class ReaderError(ValueError):
    """A corpus file that does not match its published format; the message names the file and line."""


@dataclass
class Corpus:
    name: str
    splits: dict[str, pa.Table]
    skipped: list[str] = field(default_factory=list)  # "file:line: reason" for each record skipped
    dropped_by_filter: dict[str, int] = field(default_factory=dict)  # questions removed by `clean`, per split
    clean: bool | None = True  # None: a set without a filtered variant (reading comprehension)
    # Questions the file lists with no candidate at all (jacana TrecQA has some): not in the pairs, but in
    # the published question counts.
    without_candidates: dict[str, int] = field(default_factory=dict)
    rows_are_questions: bool = False  # reading comprehension: one row per question

    def sizes(self) -> dict[str, tuple[int, int]]:
        """(questions, pairs) per split; questions include those listed without candidates."""
        return {
            split: (len(set(t.column("qid").to_pylist())) + self.without_candidates.get(split, 0), t.num_rows)
            for split, t in self.splits.items()
        }

    def published(self) -> dict[str, tuple[int, int | None]]:
        return PUBLISHED.get((self.name, self.clean), PUBLISHED.get((self.name, None), {}))

    def check_sizes(self) -> list[str]:
        """Differences from the published sizes, one line each (empty when every split matches)."""
        problems = []
        for split, (questions, pairs) in self.sizes().items():
            want = self.published().get(split)
            if want is not None and not _matches(want, (questions, pairs)):
                problems.append(
                    f"{self.name} {split}: {questions:,} questions, published {_count(want[0])}"
                    if self.rows_are_questions
                    else f"{self.name} {split}: {questions:,} questions / {pairs:,} pairs, published "
                    f"{_count(want[0])} / {_count(want[1])}"
                )
        return problems

    def summary(self) -> str:
        lines = []
        for split, (questions, pairs) in self.sizes().items():
            want = self.published().get(split)
            mark = (
                ""
                if want is None
                else " (as published)"
                if _matches(want, (questions, pairs))
                else f" (published {_count(want[0])} / {_count(want[1])})"
            )
            if self.rows_are_questions:
                mark = (
                    ""
                    if want is None
                    else " (as published)"
                    if _matches(want, (questions, pairs))
                    else f" (published {_count(want[0])})"
                )
                lines.append(f"{self.name} {split}: {questions:,} questions{mark}")
            else:
                lines.append(f"{self.name} {split}: {questions:,} questions, {pairs:,} pairs{mark}")
        if self.skipped:
            lines.append(f"{self.name}: {len(self.skipped)} bad records skipped, first: {self.skipped[0]}")
        return "\n".join(lines)


def _matches(published: tuple, found: tuple) -> bool:
    return all(want is None or want == got for want, got in zip(published, found))


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def open_binary(path: str) -> BinaryIO:
    """The file's bytes, gunzipped when its name ends in .gz, for the caller's with-block to close."""
    # GzipFile reads as a BinaryIO does, though typeshed does not declare it one
    return cast(BinaryIO, gzip.open(path, "rb")) if path.endswith(".gz") else open(path, "rb")


def open_text(path: str) -> io.TextIOBase:
    """The file as UTF-8 text (a byte-order mark skipped, line ends kept), plain or gzipped."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def check_begins(path: str, opening: str, what: str) -> None:
    """ReaderError unless the file's first character other than white space is `opening` ("<" for XML, "[" for a
    JSON array, "{" for a JSON object): a file of another set, given by name, is refused before any work, not
    after the job has started."""
    try:
        with open_text(path) as f:
            head = f.read(4096).lstrip()
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise ReaderError(f"{path}: cannot be read as UTF-8 text ({error})") from None
    if not head.startswith(opening):
        begins = f"it begins {' '.join(head[:80].split())[:24]!r}" if head else "it is empty"
        raise ReaderError(f"{path}: not {what} ({begins}); is --input another set's file?")


def find_file(folder: str, name: str) -> str | None:
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    return None


def pairs_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=PAIRS)


class Errors:
    def __init__(self, on_error: str):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.skipped: list[str] = []

    def __call__(self, where: str, reason: str) -> None:
        if self.on_error == "raise":
            raise ReaderError(f"{where}: {reason}")
        self.skipped.append(f"{where}: {reason}")


def keep_clean(rows: list[dict], drop_all_positive: bool) -> tuple[list[dict], int]:
    """Questions with at least one positive (and, when `drop_all_positive`, at least one negative)."""
    labels: dict[str, set[int]] = {}
    for r in rows:
        labels.setdefault(r["qid"], set()).add(r["label"])
    keep = {q for q, seen in labels.items() if 1 in seen and (0 in seen or not drop_all_positive)}
    return [r for r in rows if r["qid"] in keep], len(labels) - len(keep)

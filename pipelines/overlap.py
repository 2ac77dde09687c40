"""Remove Stack Exchange posts that overlap the test sets the corpus will be evaluated on.

A model pretrained on StackExchangeQA and fine-tuned on WikiQA, TrecQA, InsuranceQA or SemEval must not have
seen their test questions or answers. A post overlaps a test set when
  - its normalised text, or its first line (a question's title), equals a normalised test text, or
  - it shares a word n-gram (default 13, the decontamination length GPT-3 used) with a test text of at least
    n words.
Test sets are read from their published files (`NAME=PATH`, NAME one of READERS); the n-gram set is small
(tens of thousands of hashes per set) and is shipped once to each worker of the `OverlapFilter` stage.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
import re
from collections.abc import Iterator

import pyarrow as pa
from lxml import etree

_WORDS = re.compile(r"\w+", re.UNICODE)


def _open_text(path: str):
    """A test set's file as text, undecodable bytes replaced: overlap only needs its words."""
    from pipelines.readers.common import open_binary

    return io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="replace", newline="")


def _find(path: str, *names: str) -> str:
    """`path` itself when a file, else the first of `names` (with or without .gz) inside it."""
    if os.path.isfile(path):
        return path
    for name in names:
        for candidate in (name, name + ".gz"):
            if os.path.isfile(os.path.join(path, candidate)):
                return os.path.join(path, candidate)
    raise FileNotFoundError(f"{path}: none of {', '.join(names)} (or .gz) found")


def wikiqa_texts(path: str) -> Iterator[str]:
    """WikiQA-test.tsv: the Question and Sentence columns."""
    with _open_text(_find(path, "WikiQA-test.tsv")) as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if not {"Question", "Sentence"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{path}: not a WikiQA TSV (columns {reader.fieldnames})")
        seen = set()
        for row in reader:
            if row["Question"] not in seen:
                seen.add(row["Question"])
                yield row["Question"]
            yield row["Sentence"]


def trecqa_texts(path: str) -> Iterator[str]:
    """TrecQA test: the jacana TEST.xml (first line of each block is the tab-separated tokens) or a castorini
    folder with a.toks (questions) and b.toks (answers)."""
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "a.toks")):
        for name in ("a.toks", "b.toks"):
            with _open_text(os.path.join(path, name)) as f:
                yield from (line.strip() for line in f if line.strip())
        return
    with _open_text(_find(path, "TEST.xml")) as f:
        expect_tokens = False
        for line in f:
            stripped = line.strip()
            if stripped in ("<question>", "<positive>", "<negative>"):
                expect_tokens = True
            elif expect_tokens:
                expect_tokens = False
                yield " ".join(stripped.split("\t"))


def semeval_texts(path: str) -> Iterator[str]:
    """SemEval-2016 Task 3 XML: question subjects and bodies and comment texts."""
    tags = {"OrgQSubject", "OrgQBody", "RelQSubject", "RelQBody", "RelCText"}
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        try:
            for _, element in etree.iterparse(f, events=("end",), recover=False):
                if element.tag in tags and element.text:
                    yield element.text
                if element.tag in ("RelComment", "Thread"):
                    element.clear()
        except etree.XMLSyntaxError as err:
            raise ValueError(f"{path}: line {err.lineno}: malformed SemEval XML: {err.msg}") from err


def insuranceqa_texts(path: str) -> Iterator[str]:
    """InsuranceQA v1 folder: test questions (and answers when `answers.label.token_idx` is there), token ids
    mapped through `vocabulary`."""
    vocab = {}
    with _open_text(_find(path, "vocabulary")) as f:
        for line in f:
            key, _, word = line.rstrip("\n").partition("\t")
            vocab[key] = word

    def words(ids):
        return " ".join(vocab.get(i, "") for i in ids.split())

    found = False
    for name in ("question.test1.label.token_idx.pool", "question.test2.label.token_idx.pool"):
        try:
            questions = _find(path, name)
        except FileNotFoundError:
            continue
        found = True
        with _open_text(questions) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 2:
                    yield words(parts[1])
    try:
        answers = _find(path, "answers.label.token_idx")
    except FileNotFoundError:
        answers = None
    if answers:
        with _open_text(answers) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 2:
                    yield words(parts[1])
    if not found:
        raise FileNotFoundError(f"{path}: no InsuranceQA test file (question.test1/test2.label.token_idx.pool)")


def lines_texts(path: str) -> Iterator[str]:
    with _open_text(path) as f:
        yield from (line.strip() for line in f if line.strip())


READERS = {
    "wikiqa": wikiqa_texts,
    "trecqa": trecqa_texts,
    "semeval": semeval_texts,
    "insuranceqa": insuranceqa_texts,
    "lines": lines_texts,
}


def normalise(text: str) -> str:
    return " ".join(_WORDS.findall(text.lower()))


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def ngrams(words: list[str], n: int) -> Iterator[int]:
    for i in range(len(words) - n + 1):
        yield _hash(" ".join(words[i : i + n]))


def check_test_sets(specs: dict[str, str]) -> None:
    """Raise ValueError (or OSError) naming `NAME=PATH` unless each test set to exclude is known by name and its
    file reads as that set up to its first text: a build's check before any work (the index itself is built in the
    build; another file given as WikiQA failed there, after Ray had started)."""
    for name, path in specs.items():
        kind = name.split(":")[0]
        if kind not in READERS:
            raise ValueError(f"{name}={path}: unknown test set {kind!r} (one of {', '.join(READERS)})")
        try:
            first = next(iter(READERS[kind](path)), None)
        except (OSError, ValueError) as error:
            why = str(error).removeprefix(f"{path}: ")  # the readers name the path; the spec names it here
            raise type(error)(f"{name}={path}: {why}") from None
        if first is None:
            raise ValueError(f"{name}={path}: no texts in it")


def reference_index(specs: dict[str, str], n: int = 13) -> dict:
    """{name: {"texts": set of hashes of normalised texts, "ngrams": set of n-gram hashes, "count": N}}."""
    index = {}
    for name, path in specs.items():
        kind = name.split(":")[0]
        if kind not in READERS:
            raise ValueError(f"unknown test set {name!r}: expected one of {', '.join(READERS)} (NAME=PATH)")
        texts: set[int] = set()
        grams: set[int] = set()
        count = 0
        for text in READERS[kind](path):
            words = normalise(text).split()
            if not words:
                continue
            count += 1
            texts.add(_hash(" ".join(words)))
            grams.update(ngrams(words, n))
        if not count:
            raise ValueError(f"{path}: no texts read for test set {name!r}")
        index[name] = {"texts": texts, "ngrams": grams, "count": count}
    return index


class OverlapFilter:
    """Adds `overlap`: the names of the test sets a post's text overlaps ('' for none)."""

    def __init__(self, index_ref, n: int = 13):
        import ray

        index = index_ref[0]
        self.index = ray.get(index) if isinstance(index, ray.ObjectRef) else index
        self.n = n

    def overlaps(self, text: str) -> str:
        if not text:
            return ""
        words = normalise(text).split()
        first = normalise(text.split("\n", 1)[0]).split()
        whole, title = _hash(" ".join(words)), _hash(" ".join(first))
        grams = set(ngrams(words, self.n))
        hits = [
            name
            for name, ref in self.index.items()
            if whole in ref["texts"] or title in ref["texts"] or not grams.isdisjoint(ref["ngrams"])
        ]
        return ",".join(sorted(hits))

    def __call__(self, batch: pa.Table) -> pa.Table:
        found = [self.overlaps(t) for t in batch.column("text").to_pylist()]
        return batch.append_column("overlap", pa.array(found, pa.string()))

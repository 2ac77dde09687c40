"""Readers for the answer-selection sets in their published formats, each checked against published sizes.

Every reader returns `{split: pa.Table}` in the PAIRS shape (qid, question, aid, answer, label), candidates in
file order. Bad input raises `ReaderError` naming the file and line; with `on_error="skip"` the bad record is
skipped and counted instead (`Corpus.skipped`), never dropped silently.

- WikiQA (Yang et al. 2015): the original `WikiQA-{train,dev,test}.tsv` (CRLF, a header, no quoting: sentences
  hold bare `"`). `clean=True` (the papers' setting) keeps questions with at least one correct answer:
  873/126/243 questions, 8,672/1,130/2,351 pairs.
- TrecQA (Wang et al. 2007, Yao et al. 2013): the jacana pseudo-XML (`TRAIN.xml`, `DEV.xml`, `TEST.xml`,
  `TRAIN-ALL.xml` when there; five tab-separated lines per sentence of which the first is the tokens), or the
  tokenised castorini layout (`train/`, `raw-dev/`, `clean-test/`, ...: line-aligned `a.toks`, `b.toks`,
  `sim.txt`, `id.txt`). `clean=True` drops dev/test questions whose candidates are all positive or all
  negative: 65/68 questions, 1,117/1,442 pairs.
- SemEval-2016 Task 3 Qatar Living (English XML): task A (a thread's question against its ten comments, Good
  positive), as the CTRN paper's QatarLiving (its Table 3, full release: 4.8K/224/327 questions,
  36K/2.4K/3.2K pairs), or task C (the original question against the comments of all its threads).
- InsuranceQA v1 (`insuranceqa`) and YahooQA (`yahooqa`): see their readers.

A module per format family: `wikiqa`, `trecqa`, `semeval`, `insuranceqa`, `yahooqa`, `stackexchangeqa` (our own
build, checked from its footers), and `passages` (the multi-passage reading-comprehension sets, PASSAGE_RECORDS
rows); `common` holds the PAIRS shape, the published sizes, `Corpus` and the error policy.
"""

import os
from collections.abc import Callable, Mapping

from pipelines.readers.common import PAIRS, PUBLISHED, Corpus, ReaderError
from pipelines.readers.insuranceqa import insuranceqa_files, read_insuranceqa
from pipelines.readers.passages import (
    PASSAGE_READERS,
    quasart_files,
    searchqa_splits,
    squad_files,
    wikihop_files,
)
from pipelines.readers.semeval import read_semeval, semeval_files, semeval_split_of
from pipelines.readers.stackexchangeqa import stackexchangeqa_found
from pipelines.readers.trecqa import read_trecqa, trecqa_sources
from pipelines.readers.wikiqa import read_wikiqa, wikiqa_files
from pipelines.readers.yahooqa import read_yahooqa, yahooqa_files
from pipelines.schemas import QA_PAIRS, SchemaMismatch, check_parquet_files, parquet_files

READERS = {
    "wikiqa": read_wikiqa,
    "trecqa": read_trecqa,
    "semeval-ql": read_semeval,
    "insuranceqa": read_insuranceqa,
    "yahooqa": read_yahooqa,
}


def splits_at(dataset: str, path: str, clean: bool = True, quasart_contexts: str = "short") -> list[str]:
    """The splits `dataset`'s reader would read at `path`, found from the files' names and checked by what is
    cheap to read (an XML or JSON file's first character, castorini's four files a split, SearchQA's first
    question files, a build's shard footers), since the names of other sets' files match too: what
    jobs/tokenize_corpora.py checks before any work. FileNotFoundError or ReaderError names what is wrong."""
    if dataset == "stackexchangeqa":  # our own build: {train,dev,test}/*.parquet
        splits = [split for split in ("train", "dev", "test") if os.path.isdir(os.path.join(path, split))]
        for split in splits:  # another set's train/ (TrecQA's castorini folders) failed after Ray had started
            try:  # the shards' footers, as the run checks them
                check_parquet_files(parquet_files(os.path.join(path, split)), QA_PAIRS)
            except SchemaMismatch as error:
                raise ReaderError(f"{error} (not a split of jobs/build_stackexchangeqa.py)") from None
        return splits
    locate: dict[str, Callable[[], Mapping[str, object]]] = {
        "wikiqa": lambda: wikiqa_files(path),
        "trecqa": lambda: trecqa_sources(path, clean)[1],
        "semeval-ql": lambda: {semeval_split_of(file) or "train": file for file in semeval_files(path)},
        "insuranceqa": lambda: insuranceqa_files(path)[2],
        "yahooqa": lambda: yahooqa_files(path),
        "searchqa": lambda: searchqa_splits(path),
        "quasart": lambda: quasart_files(path, quasart_contexts),
        "wikihop": lambda: wikihop_files(path),
        "squad": lambda: squad_files(path),
    }
    if dataset not in locate:
        raise ValueError(f"unknown dataset {dataset!r}: one of stackexchangeqa, {', '.join(locate)}")
    return sorted(locate[dataset]())


__all__ = [
    "PAIRS",
    "PASSAGE_READERS",
    "PUBLISHED",
    "READERS",
    "Corpus",
    "ReaderError",
    "read_insuranceqa",
    "read_semeval",
    "read_trecqa",
    "read_wikiqa",
    "read_yahooqa",
    "splits_at",
    "stackexchangeqa_found",
]

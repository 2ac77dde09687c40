"""TrecQA (Wang et al. 2007, Yao et al. 2013) in the jacana pseudo-XML or the castorini tokenised layout."""

from __future__ import annotations

import os
import re

from pipelines.readers.common import (
    Corpus,
    Errors,
    ReaderError,
    check_begins,
    find_file,
    keep_clean,
    open_text,
    pairs_table,
)

_JACANA_FILES = {"train": "TRAIN.xml", "train-all": "TRAIN-ALL.xml", "dev": "DEV.xml", "test": "TEST.xml"}
_CASTORINI_FILES = ("a.toks", "b.toks", "sim.txt", "id.txt")  # each split folder's


_CASTORINI_DIRS = {
    "train": ["train"],
    "train-all": ["train-all"],
    "dev": ["clean-dev", "raw-dev"],
    "test": ["clean-test", "raw-test"],
}


def _jacana_questions(file: str, errors: Errors) -> tuple[list[dict], int]:
    """One jacana file: rows of every `<QApairs>` block (text is the first line of each 5-line element), and
    how many blocks had no candidate."""
    rows: list[dict] = []
    empty = 0
    qid = question = None
    element = None  # "question", "positive" or "negative" while inside one
    first_line = None
    count = 0
    in_block = False
    with open_text(file) as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            where = f"{file}: line {number}"
            opening = re.fullmatch(r"<QApairs id=['\"]([^'\"]+)['\"]>", line)
            if opening:
                if in_block:
                    errors(where, f"<QApairs> opened before question {qid} was closed")
                qid, question, in_block, count = opening.group(1), None, True, 0
                continue
            if line == "</QApairs>":
                if not in_block:
                    errors(where, "</QApairs> without an opening tag")
                elif count == 0:
                    empty += 1
                in_block = False
                continue
            tag = re.fullmatch(r"<(/?)(question|positive|negative)>", line)
            if tag:
                closing, name = tag.group(1) == "/", tag.group(2)
                if not in_block:
                    errors(where, f"<{name}> outside a <QApairs> block")
                    continue
                if not closing:
                    element, first_line = name, None
                    continue
                if element != name:
                    errors(where, f"</{name}> closes <{element}>")
                    element = None
                    continue
                text = " ".join((first_line or "").split("\t")).strip()
                element = None
                if not text:
                    errors(where, f"empty <{name}> in question {qid}")
                    continue
                if name == "question":
                    question = text
                elif question is None:
                    errors(where, f"a candidate before the question in block {qid}")
                else:
                    count += 1
                    rows.append(
                        {
                            "qid": qid,
                            "question": question,
                            "aid": f"{qid}-{count}",
                            "answer": text,
                            "label": int(name == "positive"),
                        }
                    )
                continue
            if element is not None and first_line is None:
                first_line = line
            elif element is None and line.strip():
                errors(where, f"unexpected line outside an element: {line[:60]!r}")
    if in_block or element is not None:
        errors(f"{file}: end", f"file ends inside question {qid} (truncated?)")
    return rows, empty


def _check_castorini(folder: str) -> None:
    for name in _CASTORINI_FILES:
        if not os.path.isfile(os.path.join(folder, name)):
            raise ReaderError(f"{folder}: {name} missing (castorini layout: a.toks, b.toks, sim.txt, id.txt)")


def _castorini_split(folder: str, errors: Errors) -> list[dict]:
    paths = {name: os.path.join(folder, name) for name in _CASTORINI_FILES}
    columns = {}
    for name, p in paths.items():
        with open(p, encoding="utf-8", newline="") as f:
            columns[name] = f.read().splitlines()
    lengths = {name: len(v) for name, v in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ReaderError(f"{folder}: files are not line-aligned: {lengths}")
    rows: list[dict] = []
    per_question: dict[str, int] = {}
    for i, (q, a, sim, qid) in enumerate(
        zip(columns["a.toks"], columns["b.toks"], columns["sim.txt"], columns["id.txt"])
    ):
        where = f"{paths['sim.txt']}: line {i + 1}"
        if sim.strip() not in ("0", "1"):
            errors(where, f"label {sim!r} is not 0 or 1")
            continue
        qid = qid.strip()
        per_question[qid] = per_question.get(qid, 0) + 1
        rows.append(
            {
                "qid": qid,
                "question": q.strip(),
                "aid": f"{qid}-{per_question[qid]}",
                "answer": a.strip(),
                "label": int(sim.strip()),
            }
        )
    return rows


def trecqa_sources(path: str, clean: bool = True) -> tuple[str, dict[str, str]]:
    """The layout ("jacana" or "castorini") and `{split: file or folder}` found in `path`; an error when neither
    layout is there, or when a file of it is not what its name says (checked before any work: a folder of another
    set has a train/ too). With castorini folders, `clean` picks `clean-*` over `raw-*`."""
    found = {split: find_file(path, name) for split, name in _JACANA_FILES.items()}
    jacana = {split: file for split, file in found.items() if file}
    if jacana:
        for file in jacana.values():
            check_begins(file, "<", "jacana TrecQA XML")
        return "jacana", jacana
    folders = {}
    for split, names in _CASTORINI_DIRS.items():
        choices = names if clean else list(reversed(names))
        folder = next((os.path.join(path, n) for n in choices if os.path.isdir(os.path.join(path, n))), None)
        if folder is not None:
            folders[split] = folder
    if not folders:
        raise FileNotFoundError(f"{path}: no TrecQA files (jacana TRAIN/DEV/TEST.xml or castorini train/, dev/...)")
    for folder in folders.values():
        _check_castorini(folder)
    return "castorini", folders


def read_trecqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """`path`: a folder with the jacana files (`TRAIN.xml`, `DEV.xml`, `TEST.xml`, optionally `TRAIN-ALL.xml`,
    plain or .gz) or the castorini folders (`train/`, `clean-dev/` or `raw-dev/`, ...). With castorini folders,
    `clean` picks `clean-*` over `raw-*` (and filters `raw-*` when only those are there)."""
    layout, sources = trecqa_sources(path, clean)
    errors = Errors(on_error)
    corpus = Corpus("trecqa", {}, clean=clean)
    if layout == "jacana":
        for split, file in sources.items():
            rows, empty = _jacana_questions(file, errors)
            if clean and split in ("dev", "test"):
                rows, dropped = keep_clean(rows, drop_all_positive=True)
                corpus.dropped_by_filter[split] = dropped + empty
            elif empty:
                corpus.without_candidates[split] = empty
            corpus.splits[split] = pairs_table(rows)
    else:
        for split, folder in sources.items():
            rows = _castorini_split(folder, errors)
            if clean and split in ("dev", "test") and os.path.basename(folder).startswith("raw"):
                rows, corpus.dropped_by_filter[split] = keep_clean(rows, drop_all_positive=True)
            corpus.splits[split] = pairs_table(rows)
    corpus.skipped = errors.skipped
    return corpus

"""SemEval-2016 Task 3 (Qatar Living, English) XML: task A (question-comment) and task C (question-external
comment)."""

from __future__ import annotations

import os
import re

from pipelines.readers.common import (
    Corpus,
    Errors,
    ReaderError,
    check_begins,
    keep_clean,
    open_binary,
    pairs_table,
)

_SEMEVAL_SPLITS = {"train": ("train-part1", "train-part2", "train"), "dev": ("dev",), "test": ("test",)}


def semeval_split_of(file: str) -> str | None:
    name = os.path.basename(file).lower()
    if not re.search(r"semeval.*task3.*\.xml(\.gz)?$", name):
        return None
    for split, marks in _SEMEVAL_SPLITS.items():
        if any(f"-{mark}" in name for mark in marks):
            return split
    return None


def _semeval_text(subject: str | None, body: str | None) -> str:
    return " ".join(part.strip() for part in (subject or "", body or "") if part and part.strip())


def semeval_files(path: str) -> list[str]:
    """`path` itself when it is a file, else the official files inside it; an error when there are none, or when
    one is not XML."""
    files = (
        [path]
        if os.path.isfile(path)
        else sorted(os.path.join(path, f) for f in os.listdir(path) if semeval_split_of(f))
        if os.path.isdir(path)
        else []
    )
    if not files:
        raise FileNotFoundError(f"{path}: no SemEval2016-Task3-CQA-QL-*.xml(.gz) files")
    for file in files:
        check_begins(file, "<", "SemEval XML")
    return files


def read_semeval(path: str, clean: bool = True, on_error: str = "raise", task: str = "A") -> Corpus:
    """SemEval-2016 Task 3, Qatar Living (English) XML: `path` a folder of the official files
    (`SemEval2016-Task3-CQA-QL-{train-part1,train-part2,dev,test}*.xml[.gz]`) or one of them.

    Task A (the CTRN paper's QatarLiving): each thread's related question against its ten comments,
    `RELC_RELEVANCE2RELQ` Good positive, PotentiallyUseful and Bad negative; one question per thread.
    Task C: the original question against the comments of all its related threads (`RELC_RELEVANCE2ORGQ`),
    grouped by `ORGQ_ID` (an original question is repeated once per thread in the file). Part 1 of the
    training release has no task A labels (`N/A`), so task A over it is an error that says so. `clean` drops
    questions with no Good comment (they carry no ranking signal: every metric is undefined for them)."""
    from lxml import etree

    if task not in ("A", "C"):
        raise ValueError(f"SemEval task must be 'A' or 'C', got {task!r}")
    files = semeval_files(path)
    errors = Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    label_field = "RELC_RELEVANCE2RELQ" if task == "A" else "RELC_RELEVANCE2ORGQ"
    for file in files:
        split = semeval_split_of(file) or "train"
        rows = by_split.setdefault(split, [])
        seen = {(r["qid"], r["aid"]) for r in rows}
        unlabelled = 0
        with open_binary(file) as raw:
            try:
                root = etree.parse(raw, etree.XMLParser(huge_tree=True)).getroot()
            except etree.XMLSyntaxError as err:
                raise ReaderError(f"{file}: line {err.lineno}: malformed XML: {err.msg}") from None
        # Threads sit inside their <OrgQuestion> (the full release) or at the top (task A only files).
        for thread in root.iter("Thread"):
            org = thread.getparent()
            rel = thread.find("RelQuestion")
            if rel is None:
                errors(f"{file}: line {thread.sourceline}", "a <Thread> without <RelQuestion>")
                continue
            if task == "A":
                qid = rel.get("RELQ_ID")
                question = _semeval_text(rel.findtext("RelQSubject"), rel.findtext("RelQBody"))
            elif org is None or org.tag != "OrgQuestion":
                errors(f"{file}: line {thread.sourceline}", "task C needs each <Thread> inside an <OrgQuestion>")
                continue
            else:
                qid = org.get("ORGQ_ID")
                question = _semeval_text(org.findtext("OrgQSubject"), org.findtext("OrgQBody"))
            for comment in thread.iter("RelComment"):
                where = f"{file}: line {comment.sourceline}"
                label = comment.get(label_field)
                aid = comment.get("RELC_ID")
                if label == "N/A":
                    unlabelled += 1
                    continue
                if label not in ("Good", "PotentiallyUseful", "Bad"):
                    errors(where, f"{label_field}={label!r} is not Good, PotentiallyUseful or Bad")
                    continue
                text = (comment.findtext("RelCText") or "").strip()
                if not aid or not text or not question:
                    errors(where, "a comment without RELC_ID or text, or an empty question")
                    continue
                if (qid, aid) in seen:  # the same comment for the same question twice (a repeated thread)
                    continue
                seen.add((qid, aid))
                rows.append(
                    {"qid": qid, "question": question, "aid": aid, "answer": text, "label": int(label == "Good")}
                )
        if unlabelled and not rows:
            raise ReaderError(
                f"{file}: every comment's {label_field} is N/A: this file has no task {task} labels"
                + (" (part 1 of the 2016 training release has task C labels: use task C)" if task == "A" else "")
            )
    corpus = Corpus("semeval-ql", {}, clean=clean)
    for split, rows in by_split.items():
        if clean:
            rows, corpus.dropped_by_filter[split] = keep_clean(rows, drop_all_positive=False)
        corpus.splits[split] = pairs_table(rows)
    corpus.skipped = errors.skipped
    return corpus

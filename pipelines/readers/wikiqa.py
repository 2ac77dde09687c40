"""WikiQA (Yang et al. 2015) in its original TSV files."""

from __future__ import annotations

import csv
import os
import re

from pipelines.readers.common import Corpus, Errors, ReaderError, find_file, keep_clean, open_text, pairs_table

_WIKIQA_HEADER = ["QuestionID", "Question", "DocumentID", "DocumentTitle", "SentenceID", "Sentence", "Label"]


def wikiqa_files(path: str) -> dict[str, str]:
    """`{split: file}`: `path` itself when it is one of the files, else those inside it; an error when none is."""
    files = {}
    if os.path.isfile(path):
        match = re.search(r"WikiQA-(train|dev|test)\.tsv", os.path.basename(path))
        if not match:
            raise ReaderError(f"{path}: not a WikiQA-{{train,dev,test}}.tsv file")
        files[match.group(1)] = path
    else:
        for split in ("train", "dev", "test"):
            found = find_file(path, f"WikiQA-{split}.tsv")
            if found:
                files[split] = found
        if not files:
            raise FileNotFoundError(f"{path}: no WikiQA-{{train,dev,test}}.tsv(.gz) found")
    return files


def read_wikiqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """`path`: the folder with `WikiQA-{train,dev,test}.tsv` (or `.tsv.gz`), or one of those files."""
    files = wikiqa_files(path)
    errors = Errors(on_error)
    corpus = Corpus("wikiqa", {}, clean=clean)
    for split, file in files.items():
        rows = []
        with open_text(file) as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader, None)
            if header != _WIKIQA_HEADER:
                raise ReaderError(f"{file}: line 1: header {header!r}, expected {_WIKIQA_HEADER}")
            for number, fields in enumerate(reader, start=2):
                where = f"{file}: line {number}"
                if len(fields) != len(_WIKIQA_HEADER):
                    errors(where, f"{len(fields)} columns, expected {len(_WIKIQA_HEADER)}")
                    continue
                qid, question, _, _, sid, sentence, label = fields
                if label not in ("0", "1"):
                    errors(where, f"label {label!r} is not 0 or 1")
                    continue
                if not question.strip() or not sentence.strip():
                    errors(where, "empty question or sentence")
                    continue
                rows.append({"qid": qid, "question": question, "aid": sid, "answer": sentence, "label": int(label)})
        if clean:
            rows, dropped = keep_clean(rows, drop_all_positive=False)
            corpus.dropped_by_filter[split] = dropped
        corpus.splits[split] = pairs_table(rows)
    corpus.skipped = errors.skipped
    return corpus

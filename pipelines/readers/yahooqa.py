"""YahooQA in the Tay et al. 2017 splits, as text (question, answer, label per line)."""

from __future__ import annotations

import os

from pipelines.readers.common import Corpus, Errors, find_file, keep_clean, open_text, pairs_table


# -------------------------------------------------------------------------------------------------- YahooQA
def yahooqa_files(path: str) -> dict[str, str]:
    """`{split: file}` inside the folder `path`; an error when there are none."""
    files = {}
    for split in ("train", "dev", "test"):
        for name in (f"{split}.tsv", f"{split}.txt"):
            found = find_file(path, name) if os.path.isdir(path) else None
            if found:
                files[split] = found
                break
    if not files:
        raise FileNotFoundError(f"{path}: no YahooQA {{train,dev,test}}.tsv(.gz) (question<TAB>answer<TAB>label)")
    return files


def read_yahooqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """YahooQA in the Tay et al. 2017 splits (github.com/vanzytay/YahooQA_Splits) written out as one TSV per
    split, `{train,dev,test}.tsv` (or `.txt`, plain or .gz): `question<TAB>answer<TAB>label`, no header, a
    question's five candidates (one positive, four Lucene negatives) on consecutive lines. The authors ship
    the splits as a Python pickle; unpickling runs code, so this reader takes the text form only. Questions are
    grouped by their text within a split, ids `SPLIT-N` in order of appearance. `clean` drops questions
    without a positive."""
    files = yahooqa_files(path)
    errors = Errors(on_error)
    corpus = Corpus("yahooqa", {}, clean=clean)
    for split, file in files.items():
        rows: list[dict] = []
        qids: dict[str, str] = {}
        answers_seen: dict[str, int] = {}
        with open_text(file) as f:
            for number, line in enumerate(f, start=1):
                where = f"{file}: line {number}"
                fields = line.rstrip("\r\n").split("\t")
                if fields == [""]:
                    continue
                if len(fields) != 3:
                    errors(where, f"{len(fields)} columns, expected 3 (question, answer, label)")
                    continue
                question, text, label = (x.strip() for x in fields)
                if label not in ("0", "1"):
                    errors(where, f"label {label!r} is not 0 or 1")
                    continue
                if not question or not text:
                    errors(where, "empty question or answer")
                    continue
                qid = qids.setdefault(question, f"{split}-{len(qids) + 1}")
                answers_seen[qid] = answers_seen.get(qid, 0) + 1
                rows.append(
                    {
                        "qid": qid,
                        "question": question,
                        "aid": f"{qid}-{answers_seen[qid]}",
                        "answer": text,
                        "label": int(label),
                    }
                )
        if clean:
            rows, corpus.dropped_by_filter[split] = keep_clean(rows, drop_all_positive=False)
        corpus.splits[split] = pairs_table(rows)
    corpus.skipped = errors.skipped
    return corpus

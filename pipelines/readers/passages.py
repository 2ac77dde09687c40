"""Multi-passage reading-comprehension sets in their published formats, each question one row of the
PASSAGE_RECORDS shape: its passages in rank order, answer strings, character spans where the set gives them (SQuAD),
and candidates for multiple choice (WikiHop). Sizes are checked against the published ones (`PUBLISHED`), bad records
raised or skipped and counted as the answer-selection readers do. `pipelines/passages.py` tokenises them."""

from __future__ import annotations

import glob
import json
import os
import re

import pyarrow as pa

from pipelines.readers.common import Corpus, Errors, ReaderError, check_begins, find_file, open_text

SPAN = pa.struct([("passage", pa.int32()), ("start", pa.int32()), ("end", pa.int32())])  # chars, end exclusive
PASSAGE_RECORDS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("passages", pa.list_(pa.string()), nullable=False),  # rank order
        pa.field("passage_ranks", pa.list_(pa.int32()), nullable=False),  # the source's rank of each passage
        pa.field("answers", pa.list_(pa.string()), nullable=False),
        pa.field("answer_spans", pa.list_(SPAN), nullable=False),  # given spans (SQuAD); empty: find every occurrence
        pa.field("candidates", pa.list_(pa.string()), nullable=False),  # multiple choice; empty otherwise
        pa.field("answer_index", pa.int32(), nullable=False),  # the answer's index in candidates, or -1
    ]
)


def _record(qid, question, passages, ranks=None, answers=(), spans=(), candidates=(), answer_index=-1) -> dict:
    return {
        "qid": str(qid),
        "question": question,
        "passages": list(passages),
        "passage_ranks": list(ranks) if ranks is not None else list(range(1, len(passages) + 1)),
        "answers": list(answers),
        "answer_spans": list(spans),
        "candidates": list(candidates),
        "answer_index": answer_index,
    }


def _corpus(name: str, by_split: dict[str, list[dict]], errors: Errors, dropped: dict[str, int]) -> Corpus:
    corpus = Corpus(
        name,
        {s: pa.Table.from_pylist(rows, schema=PASSAGE_RECORDS) for s, rows in by_split.items()},
        clean=None,
        rows_are_questions=True,
    )
    corpus.skipped, corpus.dropped_by_filter = errors.skipped, dropped
    return corpus


_SPLIT_NAMES = {"train": "train", "val": "dev", "dev": "dev", "test": "test"}


# ------------------------------------------------------------------------------------------------ SearchQA
_SNIPPET = re.compile(r"<s>(.*?)</s>", re.DOTALL)


def searchqa_sources(path: str) -> tuple[str, dict[str, str]]:
    """The layout ("text": the processed files; "json": folders of per-question files) and `{split: file or
    folder}` found at `path`; an error when neither is there."""
    texts = {}
    for name, split in _SPLIT_NAMES.items():
        found = find_file(path, f"{name}.txt") if os.path.isdir(path) else None
        if found:
            texts[split] = found
    if os.path.isfile(path) and path.endswith((".txt", ".txt.gz")):
        texts = {_SPLIT_NAMES.get(os.path.basename(path).split(".")[0], "train"): path}
    if texts:
        return "text", texts
    folders = {  # a split folder without .json files is another layout's (TrecQA's castorini train/, say)
        split: os.path.join(path, name)
        for name, split in _SPLIT_NAMES.items()
        if glob.glob(os.path.join(path, name, "*.json"))
    }
    if not folders and glob.glob(os.path.join(path, "*.json")):
        folders = {_SPLIT_NAMES.get(os.path.basename(os.path.normpath(path)), "train"): path}
    if not folders:
        raise FileNotFoundError(f"{path}: no SearchQA {{train,val,test}}.txt(.gz) or {{train,val,test}}/*.json")
    return "json", folders


def _not_a_searchqa_question(file: str) -> str:
    """What `file` holds instead of one SearchQA question (an object with a 'search_results' list), in words: "it
    holds data, version" (its keys), "it holds a JSON list", "it is not valid JSON"; "" where it is one."""
    try:
        with open(file, encoding="utf-8") as f:
            item = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return "it is not valid JSON"
    if not isinstance(item, dict):
        return f"it holds a JSON {type(item).__name__}"
    if isinstance(item.get("search_results"), list):
        return ""
    return f"it holds {', '.join(sorted(map(str, item))[:6]) or 'an empty object'}"


def check_searchqa_json(folders: dict[str, str], sample: int = 3) -> None:
    """Any folder of .json files passes for the per-question layout by name, so a few files of each split are
    read: where none of the first `sample` is a SearchQA question (a SQuAD folder named as SearchQA), ReaderError
    names the first and what it holds. One bad file among good ones is left to the reader (--skip-bad-records)."""
    for folder in folders.values():
        files = sorted(glob.glob(os.path.join(folder, "*.json")))[:sample]
        found = [_not_a_searchqa_question(file) for file in files]
        if files and all(found):
            others = f", nor is any of the first {len(files)} .json files of {folder}" if len(files) > 1 else ""
            raise ReaderError(
                f"{files[0]}: not a SearchQA question file (an object with 'question', 'answer' and a "
                f"'search_results' list; {found[0]}){others}; is --input another set's folder?"
            )


def searchqa_splits(path: str) -> dict[str, str]:
    """`searchqa_sources`' splits, the per-question layout's checked by content (`check_searchqa_json`)."""
    layout, sources = searchqa_sources(path)
    if layout == "json":
        check_searchqa_json(sources)
    return sources


def read_searchqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """SearchQA (Dunn et al. 2017), either layout the authors published:
    - processed `{train,val,test}.txt` (plain or .gz), one question per line, `<s> snippet </s> <s> ... ||| question
      ||| answer`: lower-cased and tokenised, the version DynSAN used;
    - the per-question JSON files (`{train,val,test}/*.json`, or a folder of them read as one split named after
      it): `question`, `answer`, `search_results` in rank order, each with a `snippet`.
    `val` is called `dev`. A question with an empty question text or no snippet is dropped and counted (the
    processed files have some; the authors' readers skip them). Ranks are the search result positions (1 = top),
    kept when an empty snippet in between is left out."""
    layout, sources = searchqa_sources(path)
    errors = Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    dropped: dict[str, int] = {}
    texts = sources if layout == "text" else {}
    for split, file in texts.items():
        rows = by_split.setdefault(split, [])
        with open_text(file) as f:
            for number, line in enumerate(f, start=1):
                where = f"{file}: line {number}"
                fields = line.rstrip("\r\n").split("|||")
                if len(fields) != 3:
                    errors(where, f"{len(fields)} '|||'-separated fields, expected 3 (snippets, question, answer)")
                    continue
                snippets, question, answer = (x.strip() for x in fields)
                passages = [s.strip() for s in _SNIPPET.findall(snippets)]
                ranks = [i + 1 for i, s in enumerate(passages) if s]
                passages = [s for s in passages if s]
                if not answer:
                    errors(where, "empty answer")
                    continue
                if not question or not passages:
                    dropped[split] = dropped.get(split, 0) + 1
                    continue
                rows.append(_record(f"{split}-{number}", question, passages, ranks, [answer]))
    if layout == "json":
        for split, folder in sources.items():
            rows = by_split.setdefault(split, [])
            for file in sorted(glob.glob(os.path.join(folder, "*.json"))):
                try:
                    with open(file, encoding="utf-8") as f:
                        item = json.load(f)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    errors(file, f"not valid JSON: {err}")
                    continue
                if (
                    not isinstance(item, dict)
                    or not isinstance(item.get("search_results"), list)
                    or not item.get("answer")
                ):
                    errors(file, "expected an object with 'question', 'answer' and a 'search_results' list")
                    continue
                results = [
                    (i + 1, " ".join(((r or {}).get("snippet") or "").split()))
                    for i, r in enumerate(item["search_results"])
                ]
                results = [(rank, text) for rank, text in results if text]
                question = (item.get("question") or "").strip()
                if not question or not results:
                    dropped[split] = dropped.get(split, 0) + 1
                    continue
                qid = item.get("id", os.path.splitext(os.path.basename(file))[0])
                rows.append(
                    _record(qid, question, [t for _, t in results], [r for r, _ in results], [item["answer"].strip()])
                )
    return _corpus("searchqa", by_split, errors, dropped)


# ------------------------------------------------------------------------------------------------ Quasar-T
def quasart_files(path: str, contexts: str = "short") -> dict[str, tuple[str, str]]:
    """`{split: (questions file, contexts file)}` in the release folder `path`; an error when there are no
    questions, or questions without their contexts."""
    if contexts not in ("short", "long"):
        raise ValueError(f"Quasar-T contexts must be 'short' or 'long', got {contexts!r}")
    files = {}
    for split in ("train", "dev", "test"):
        questions = find_file(os.path.join(path, "questions"), f"{split}_questions.json")
        if questions is None:
            continue
        context_file = find_file(os.path.join(path, "contexts", contexts), f"{split}_contexts.json")
        if context_file is None:
            raise ReaderError(f"{path}: {questions} has no contexts/{contexts}/{split}_contexts.json(.gz) beside it")
        files[split] = (questions, context_file)
    if not files:
        raise FileNotFoundError(f"{path}: no Quasar-T questions/{{train,dev,test}}_questions.json(.gz)")
    return files


def read_quasart(path: str, clean: bool = True, on_error: str = "raise", contexts: str = "short") -> Corpus:
    """Quasar-T (Dhingra et al. 2017), the release's layout: `questions/{split}_questions.json.gz`, one JSON object
    per line (`uid`, `question`, `answer`, `tags`), and `contexts/{short,long}/{split}_contexts.json.gz`, one line
    per question in the same order (`uid`, `contexts`: `[[score, text], ...]` ranked by the search engine).
    `contexts` picks the short (sentence) or long (paragraph) passages. A contexts line whose uid differs from its
    question line is an error: the files are out of step and every later pair would be wrong."""
    errors = Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    dropped: dict[str, int] = {}
    for split, (questions, context_file) in quasart_files(path, contexts).items():
        rows = by_split.setdefault(split, [])
        with open_text(questions) as fq, open_text(context_file) as fc:
            number = 0
            while True:
                qline, cline = fq.readline(), fc.readline()
                if not qline or not cline:
                    break
                number += 1
                where = f"{questions}: line {number}"
                try:
                    q, c = json.loads(qline), json.loads(cline)
                except json.JSONDecodeError as err:
                    errors(
                        where,
                        f"a line of {os.path.basename(questions)} or {os.path.basename(context_file)} "
                        f"is not JSON: {err}",
                    )
                    continue
                if q.get("uid") != c.get("uid"):
                    raise ReaderError(
                        f"{where}: uid {q.get('uid')!r} but {context_file} line {number} has "
                        f"{c.get('uid')!r}: the files are not line-aligned"
                    )
                if not q.get("question") or not q.get("answer"):
                    errors(where, "a question without 'question' or 'answer'")
                    continue
                ranked = [" ".join(str(text).split()) for _, text in c.get("contexts") or []]
                ranks = [i + 1 for i, t in enumerate(ranked) if t]
                passages = [t for t in ranked if t]
                if not passages:
                    dropped[split] = dropped.get(split, 0) + 1
                    continue
                rows.append(_record(q["uid"], q["question"].strip(), passages, ranks, [q["answer"].strip()]))
            if qline or cline:
                raise ReaderError(
                    f"{questions if qline else context_file}: more lines than "
                    f"{context_file if qline else questions} (which ends after line {number})"
                )
    return _corpus("quasart", by_split, errors, dropped)


# ------------------------------------------------------------------------------------------------- WikiHop
def _json_files(path: str, names: dict[str, str], split_of_file) -> dict[str, str]:
    """`{split: file}`: `path` itself when it is a file (its split from `split_of_file(basename)`), else the
    official `names` (split to file name, plain or .gz) found inside it."""
    if os.path.isfile(path):
        return {split_of_file(os.path.basename(path)): path}
    found = {split: find_file(path, name) for split, name in names.items()}
    return {split: file for split, file in found.items() if file}


def _load_json_array(file: str):
    with open_text(file) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        hint = " (the file ends early: truncated?)" if err.pos >= len(text.rstrip()) - 1 else ""
        raise ReaderError(f"{file}: line {err.lineno} column {err.colno}: not valid JSON: {err.msg}{hint}") from None


def wikihop_files(path: str) -> dict[str, str]:
    files = _json_files(
        path, {"train": "train.json", "dev": "dev.json"}, lambda name: _SPLIT_NAMES.get(name.split(".")[0], "train")
    )
    if not files:
        raise FileNotFoundError(f"{path}: no WikiHop train.json / dev.json(.gz)")
    for file in files.values():
        check_begins(file, "[", "a WikiHop JSON array")
    return files


def read_wikihop(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """WikiHop (and MedHop) from QAngaroo v1.1: `train.json`, `dev.json` (plain or .gz), each a JSON array of
    `{id, query, answer, candidates, supports}` (dev also `annotations`, ignored), or one such file. The query
    `"<relation> <subject>"` becomes the question with the relation's underscores as spaces; supports are the
    passages in file order (WikiHop does not rank them: ranks are positions). The answer must be one of the
    candidates."""
    files = wikihop_files(path)
    errors = Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    for split, file in files.items():
        records = _load_json_array(file)
        if not isinstance(records, list):
            raise ReaderError(f"{file}: expected a JSON array of records")
        rows = by_split.setdefault(split, [])
        for number, r in enumerate(records):
            where = f"{file}: record {number} ({r.get('id') if isinstance(r, dict) else '?'})"
            if not isinstance(r, dict) or not all(k in r for k in ("id", "query", "candidates", "supports")):
                errors(where, "expected id, query, candidates and supports")
                continue
            candidates = [c.strip() for c in r["candidates"]]
            answer = (r.get("answer") or "").strip()
            if answer and answer not in candidates:
                errors(where, f"answer {answer!r} is not among the candidates")
                continue
            relation, _, subject = r["query"].partition(" ")
            question = f"{relation.replace('_', ' ')} {subject}".strip()
            supports = [" ".join(s.split()) for s in r["supports"]]
            rows.append(
                _record(
                    r["id"],
                    question,
                    supports,
                    None,
                    [answer] if answer else [],
                    (),
                    candidates,
                    candidates.index(answer) if answer else -1,
                )
            )
    return _corpus("wikihop", by_split, errors, {})


# --------------------------------------------------------------------------------------------------- SQuAD
def squad_files(path: str) -> dict[str, str]:
    files = _json_files(
        path,
        {"train": "train-v1.1.json", "dev": "dev-v1.1.json"},
        lambda name: "train" if name.startswith("train") else "dev",
    )
    if not files:
        raise FileNotFoundError(f"{path}: no SQuAD train-v1.1.json / dev-v1.1.json(.gz)")
    for file in files.values():
        check_begins(file, "{", "a SQuAD JSON object")
    return files


def read_squad(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """SQuAD 1.1 (`{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
    [{"answer_start", "text"}]}]}]}]}`), the single-passage case of DynSAN's Table 4: the folder of the official
    `train-v1.1.json` / `dev-v1.1.json` (plain or .gz), or one file (its split from the name: `train...` or
    anything else `dev`). Each question's given spans are kept; a span whose characters differ from its text is a
    bad record."""
    files = squad_files(path)
    errors = Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    for split, file in files.items():
        data = _load_json_array(file)
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise ReaderError(f"{file}: expected {{'data': [articles], 'version': ...}}")
        rows = by_split.setdefault(split, [])
        for article in data["data"]:
            for p_number, paragraph in enumerate(article.get("paragraphs", [])):
                context = paragraph["context"]
                for qa in paragraph.get("qas", []):
                    where = f"{file}: {article.get('title')} paragraph {p_number} question {qa.get('id')}"
                    answers, spans, bad = [], [], None
                    for a in qa.get("answers", []):
                        start, text = a.get("answer_start"), a.get("text", "")
                        if not isinstance(start, int) or context[start : start + len(text)] != text or not text:
                            bad = f"answer {text!r} is not at character {start} of the context"
                            break
                        answers.append(text)
                        spans.append({"passage": 0, "start": start, "end": start + len(text)})
                    if bad or not answers:
                        errors(where, bad or "no answer")
                        continue
                    rows.append(_record(qa["id"], qa["question"].strip(), [context], [1], answers, spans))
    return _corpus("squad", by_split, errors, {})


PASSAGE_READERS = {"searchqa": read_searchqa, "quasart": read_quasart, "wikihop": read_wikihop, "squad": read_squad}

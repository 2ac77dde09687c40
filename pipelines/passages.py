"""Multi-passage reading comprehension: readers for SearchQA, Quasar-T, WikiHop and SQuAD 1.1, and the stage that
tokenises a question's passages into one rank-ordered context with token-level answer spans.

DynSAN (Zhang et al., `../shared/papers/002_5aab4da64e84e715.txt`, section 4.1) concatenates every supporting
passage in rank order, tokenises with spaCy and keeps at most 5k tokens, discarding the few longer cases. A
reader returns a `Corpus` (pipelines/readers.py) whose tables have the PASSAGE_RECORDS shape: one row per
question with its passages in rank order, answer strings, character spans where the set gives them (SQuAD), and
candidates for multiple choice (WikiHop). `PassageTokenizer` then maps every occurrence of an answer (or of a
candidate: WikiHop's mentions) from characters to token positions, as the HAS model's multi-occurrence
supervision needs; rows whose context is over the cap, or whose answer occurs nowhere, are marked with a
status so the job can count them (and, for training, stop or skip by option) instead of losing them silently.
"""
from __future__ import annotations

import glob
import json
import os
import re

import pyarrow as pa

from pipelines.readers import PUBLISHED, Corpus, ReaderError, _Errors, _find, _open_text

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

# Published question counts (rows are questions). SearchQA: Dunn et al. 2017 (processed train/val/test);
# Quasar-T: Dhingra et al. 2017; WikiHop: Welbl et al. 2018 (test hidden); SQuAD 1.1: Rajpurkar et al. 2016.
PUBLISHED.update({
    ("searchqa", None): {"train": (99_820, 99_820), "dev": (13_393, 13_393), "test": (27_248, 27_248)},
    ("quasart", None): {"train": (37_012, 37_012), "dev": (3_000, 3_000), "test": (3_000, 3_000)},
    ("wikihop", None): {"train": (43_738, 43_738), "dev": (5_129, 5_129)},
    ("squad", None): {"train": (87_599, 87_599), "dev": (10_570, 10_570)},
})

MAX_CONTEXT_TOKENS = 5_000  # DynSAN section 4.1
OK, NO_ANSWER, OVER_CAP = "ok", "answer_not_found", "over_token_cap"


def _record(qid, question, passages, ranks=None, answers=(), spans=(), candidates=(), answer_index=-1) -> dict:
    return {"qid": str(qid), "question": question, "passages": list(passages),
            "passage_ranks": list(ranks) if ranks is not None else list(range(1, len(passages) + 1)),
            "answers": list(answers), "answer_spans": list(spans), "candidates": list(candidates),
            "answer_index": answer_index}


def _corpus(name: str, by_split: dict[str, list[dict]], errors: _Errors, dropped: dict[str, int]) -> Corpus:
    corpus = Corpus(name, {s: pa.Table.from_pylist(rows, schema=PASSAGE_RECORDS) for s, rows in by_split.items()},
                    clean=None, rows_are_questions=True)
    corpus.skipped, corpus.dropped_by_filter = errors.skipped, dropped
    return corpus


_SPLIT_NAMES = {"train": "train", "val": "dev", "dev": "dev", "test": "test"}


# ------------------------------------------------------------------------------------------------ SearchQA
_SNIPPET = re.compile(r"<s>(.*?)</s>", re.DOTALL)


def read_searchqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """SearchQA (Dunn et al. 2017), either layout the authors published:
    - processed `{train,val,test}.txt` (plain or .gz), one question per line, `<s> snippet </s> <s> ... ||| question
      ||| answer`: lower-cased and tokenised, the version DynSAN used;
    - the per-question JSON files (`{train,val,test}/*.json`, or a folder of them read as one split named after
      it): `question`, `answer`, `search_results` in rank order, each with a `snippet`.
    `val` is called `dev`. A question with an empty question text or no snippet is dropped and counted (the
    processed files have some; the authors' readers skip them). Ranks are the search result positions (1 = top),
    kept when an empty snippet in between is left out."""
    errors = _Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    dropped: dict[str, int] = {}
    texts = {}
    for name, split in _SPLIT_NAMES.items():
        found = _find(path, f"{name}.txt") if os.path.isdir(path) else None
        if found:
            texts[split] = found
    if os.path.isfile(path) and path.endswith((".txt", ".txt.gz")):
        texts = {_SPLIT_NAMES.get(os.path.basename(path).split(".")[0], "train"): path}
    for split, file in texts.items():
        rows = by_split.setdefault(split, [])
        with _open_text(file) as f:
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
    if not texts:
        folders = {split: os.path.join(path, name) for name, split in _SPLIT_NAMES.items()
                   if os.path.isdir(os.path.join(path, name))}
        if not folders and glob.glob(os.path.join(path, "*.json")):
            folders = {_SPLIT_NAMES.get(os.path.basename(os.path.normpath(path)), "train"): path}
        for split, folder in folders.items():
            rows = by_split.setdefault(split, [])
            for file in sorted(glob.glob(os.path.join(folder, "*.json"))):
                try:
                    with open(file, encoding="utf-8") as f:
                        item = json.load(f)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    errors(file, f"not valid JSON: {err}")
                    continue
                if not isinstance(item, dict) or not isinstance(item.get("search_results"), list) \
                        or not item.get("answer"):
                    errors(file, "expected an object with 'question', 'answer' and a 'search_results' list")
                    continue
                results = [(i + 1, " ".join(((r or {}).get("snippet") or "").split()))
                           for i, r in enumerate(item["search_results"])]
                results = [(rank, text) for rank, text in results if text]
                question = (item.get("question") or "").strip()
                if not question or not results:
                    dropped[split] = dropped.get(split, 0) + 1
                    continue
                qid = item.get("id", os.path.splitext(os.path.basename(file))[0])
                rows.append(_record(qid, question, [t for _, t in results], [r for r, _ in results],
                                    [item["answer"].strip()]))
    if not by_split:
        raise FileNotFoundError(f"{path}: no SearchQA {{train,val,test}}.txt(.gz) or {{train,val,test}}/*.json")
    return _corpus("searchqa", by_split, errors, dropped)


# ------------------------------------------------------------------------------------------------ Quasar-T
def read_quasart(path: str, clean: bool = True, on_error: str = "raise", contexts: str = "short") -> Corpus:
    """Quasar-T (Dhingra et al. 2017), the release's layout: `questions/{split}_questions.json.gz`, one JSON object
    per line (`uid`, `question`, `answer`, `tags`), and `contexts/{short,long}/{split}_contexts.json.gz`, one line
    per question in the same order (`uid`, `contexts`: `[[score, text], ...]` ranked by the search engine).
    `contexts` picks the short (sentence) or long (paragraph) passages. A contexts line whose uid differs from its
    question line is an error: the files are out of step and every later pair would be wrong."""
    if contexts not in ("short", "long"):
        raise ValueError(f"Quasar-T contexts must be 'short' or 'long', got {contexts!r}")
    errors = _Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    dropped: dict[str, int] = {}
    for split in ("train", "dev", "test"):
        questions = _find(os.path.join(path, "questions"), f"{split}_questions.json")
        if questions is None:
            continue
        context_file = _find(os.path.join(path, "contexts", contexts), f"{split}_contexts.json")
        if context_file is None:
            raise ReaderError(f"{path}: {questions} has no contexts/{contexts}/{split}_contexts.json(.gz) beside it")
        rows = by_split.setdefault(split, [])
        with _open_text(questions) as fq, _open_text(context_file) as fc:
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
                    errors(where, f"a line of {os.path.basename(questions)} or {os.path.basename(context_file)} "
                                  f"is not JSON: {err}")
                    continue
                if q.get("uid") != c.get("uid"):
                    raise ReaderError(f"{where}: uid {q.get('uid')!r} but {context_file} line {number} has "
                                      f"{c.get('uid')!r}: the files are not line-aligned")
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
                raise ReaderError(f"{questions if qline else context_file}: more lines than "
                                  f"{context_file if qline else questions} (which ends after line {number})")
    if not by_split:
        raise FileNotFoundError(f"{path}: no Quasar-T questions/{{train,dev,test}}_questions.json(.gz)")
    return _corpus("quasart", by_split, errors, dropped)


# ------------------------------------------------------------------------------------------------- WikiHop
def _json_files(path: str, names: dict[str, str], split_of_file) -> dict[str, str]:
    """`{split: file}`: `path` itself when it is a file (its split from `split_of_file(basename)`), else the
    official `names` (split to file name, plain or .gz) found inside it."""
    if os.path.isfile(path):
        return {split_of_file(os.path.basename(path)): path}
    found = {split: _find(path, name) for split, name in names.items()}
    return {split: file for split, file in found.items() if file}


def _load_json_array(file: str):
    with _open_text(file) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        hint = " (the file ends early: truncated?)" if err.pos >= len(text.rstrip()) - 1 else ""
        raise ReaderError(f"{file}: line {err.lineno} column {err.colno}: not valid JSON: {err.msg}{hint}") from None


def read_wikihop(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """WikiHop (and MedHop) from QAngaroo v1.1: `train.json`, `dev.json` (plain or .gz), each a JSON array of
    `{id, query, answer, candidates, supports}` (dev also `annotations`, ignored), or one such file. The query
    `"<relation> <subject>"` becomes the question with the relation's underscores as spaces; supports are the
    passages in file order (WikiHop does not rank them: ranks are positions). The answer must be one of the
    candidates."""
    files = _json_files(path, {"train": "train.json", "dev": "dev.json"},
                        lambda name: _SPLIT_NAMES.get(name.split(".")[0], "train"))
    if not files:
        raise FileNotFoundError(f"{path}: no WikiHop train.json / dev.json(.gz)")
    errors = _Errors(on_error)
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
            rows.append(_record(r["id"], question, supports, None, [answer] if answer else [], (), candidates,
                                candidates.index(answer) if answer else -1))
    return _corpus("wikihop", by_split, errors, {})


# --------------------------------------------------------------------------------------------------- SQuAD
def read_squad(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """SQuAD 1.1 (`{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
    [{"answer_start", "text"}]}]}]}]}`), the single-passage case of DynSAN's Table 4: the folder of the official
    `train-v1.1.json` / `dev-v1.1.json` (plain or .gz), or one file (its split from the name: `train...` or
    anything else `dev`). Each question's given spans are kept; a span whose characters differ from its text is a
    bad record."""
    files = _json_files(path, {"train": "train-v1.1.json", "dev": "dev-v1.1.json"},
                        lambda name: "train" if name.startswith("train") else "dev")
    if not files:
        raise FileNotFoundError(f"{path}: no SQuAD train-v1.1.json / dev-v1.1.json(.gz)")
    errors = _Errors(on_error)
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
                        if not isinstance(start, int) or context[start:start + len(text)] != text or not text:
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


# ------------------------------------------------------------------------------------------- tokenisation
def _pattern(text: str) -> re.Pattern:
    """Every occurrence of `text` as whole words, any case, any whitespace between its words."""
    words = [re.escape(w) for w in text.split()]
    return re.compile(r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)", re.IGNORECASE)


def char_to_token_span(starts: list[int], ends: list[int], start: int, end: int) -> tuple[int, int] | None:
    """The tokens covering characters [start, end): first token ending after `start`, last starting before `end`."""
    import bisect

    first = bisect.bisect_right(ends, start)
    last = bisect.bisect_left(starts, end) - 1
    return (first, last) if first <= last else None


class PassageTokenizer:
    """A batch of PASSAGE_RECORDS rows to tokens: `question_tokens`, `context_tokens` (the passages concatenated
    in rank order), `passage_starts` (token offset of each passage), answer spans (token positions, end
    inclusive, every occurrence), WikiHop's candidate mentions, and a `status` (ok, answer_not_found,
    over_token_cap)."""

    def __init__(self, lowercase: bool = True, max_context_tokens: int = MAX_CONTEXT_TOKENS, batch_size: int = 64):
        import spacy

        self.nlp = spacy.blank("en")
        self.nlp.max_length = 10_000_000
        self.lowercase, self.max_context_tokens, self.batch_size = lowercase, max_context_tokens, batch_size

    def _words(self, doc) -> tuple[list[str], list[int], list[int]]:
        tokens = [t for t in doc if not t.is_space]
        words = [t.text.lower() if self.lowercase else t.text for t in tokens]
        return words, [t.idx for t in tokens], [t.idx + len(t.text) for t in tokens]

    def record(self, row: dict, question_doc, passage_docs) -> dict:
        context, passage_starts, offsets = [], [], []
        for doc in passage_docs:
            words, starts, ends = self._words(doc)
            passage_starts.append(len(context))
            offsets.append((starts, ends))
            context.extend(words)
        spans: set[tuple[int, int]] = set()
        if row["answer_spans"]:
            for s in row["answer_spans"]:
                starts, ends = offsets[s["passage"]]
                found = char_to_token_span(starts, ends, s["start"], s["end"])
                if found:
                    spans.add((found[0] + passage_starts[s["passage"]], found[1] + passage_starts[s["passage"]]))
        mentions: set[tuple[int, int, int]] = set()
        searched = [(i, c) for i, c in enumerate(row["candidates"])] if row["candidates"] else \
            ([] if row["answer_spans"] else [(-1, a) for a in row["answers"]])
        for index, text in searched:
            if not text.split():
                continue
            pattern = _pattern(text)
            for p, passage in enumerate(row["passages"]):
                starts, ends = offsets[p]
                for m in pattern.finditer(passage):
                    found = char_to_token_span(starts, ends, m.start(), m.end())
                    if found is None:
                        continue
                    span = (found[0] + passage_starts[p], found[1] + passage_starts[p])
                    if index >= 0:
                        mentions.add((*span, index))
                    if index == row["answer_index"]:
                        spans.add(span)  # -1 == -1 for extractive sets; the answer's mentions for WikiHop
        spans_sorted, mentions_sorted = sorted(spans), sorted(mentions)
        # A span whose tokens spell something else: the answer starts or ends inside a token ("8" of "20-18").
        wanted = {"".join(a.split()).lower() for a in row["answers"]}
        inexact = sum("".join(context[s:e + 1]).lower() not in wanted for s, e in spans_sorted)
        question, _, _ = self._words(question_doc)
        status = OVER_CAP if len(context) > self.max_context_tokens else OK if spans_sorted else NO_ANSWER
        return {
            "question_tokens": question, "context_tokens": context, "passage_starts": passage_starts,
            "answer_starts": [s for s, _ in spans_sorted], "answer_ends": [e for _, e in spans_sorted],
            "mention_starts": [m[0] for m in mentions_sorted], "mention_ends": [m[1] for m in mentions_sorted],
            "mention_candidates": [m[2] for m in mentions_sorted], "status": status, "inexact_spans": inexact,
        }

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        questions = list(self.nlp.pipe([r["question"] for r in rows], batch_size=self.batch_size))
        flat = [p for r in rows for p in r["passages"]]
        docs = iter(self.nlp.pipe(flat, batch_size=self.batch_size))
        out = [self.record(r, q, [next(docs) for _ in r["passages"]]) for r, q in zip(rows, questions)]
        for name, kind in TOKEN_COLUMNS:
            batch = batch.append_column(name, pa.array([o[name] for o in out], kind))
        return batch.drop_columns(["passages", "answer_spans"])


TOKEN_COLUMNS = [("question_tokens", pa.list_(pa.string())), ("context_tokens", pa.list_(pa.string())),
                 ("passage_starts", pa.list_(pa.int32())), ("answer_starts", pa.list_(pa.int32())),
                 ("answer_ends", pa.list_(pa.int32())), ("mention_starts", pa.list_(pa.int32())),
                 ("mention_ends", pa.list_(pa.int32())), ("mention_candidates", pa.list_(pa.int32())),
                 ("status", pa.string()), ("inexact_spans", pa.int32())]


def count_passage_tokens(batch: pa.Table) -> pa.Table:
    from collections import Counter

    from pipelines.vocabulary import counts_table

    counts: Counter = Counter()
    for column in ("question_tokens", "context_tokens"):
        for tokens in batch.column(column).to_pylist():
            counts.update(tokens)
    return counts_table(counts)


class PassageIds:
    """Token columns to word and character ids; conforms to TOKENISED_PASSAGES."""

    def __init__(self, vocab_tokens: list[str], vocab_chars: list[str], max_word_chars: int):
        from pipelines.vocabulary import Vocabulary

        self.vocab, self.max_word_chars = Vocabulary(vocab_tokens, vocab_chars), max_word_chars

    def __call__(self, batch: pa.Table) -> pa.Table:
        from pipelines.schemas import TOKENISED_PASSAGES, conform

        columns = {}
        for side in ("question", "context"):
            tokens = batch.column(f"{side}_tokens").to_pylist()
            columns[f"{side}_ids"] = pa.array([self.vocab.ids(t) for t in tokens], pa.list_(pa.int32()))
            columns[f"{side}_char_ids"] = pa.array([self.vocab.char_ids(t, self.max_word_chars) for t in tokens],
                                                   pa.list_(pa.list_(pa.int32())))
        table = pa.table({**{name: batch.column(name) for name in batch.column_names
                             if name not in ("question_tokens", "status", "inexact_spans", "split")}, **columns})
        return conform(table, TOKENISED_PASSAGES, "tokenised passages")


def _no_counts() -> dict[str, int]:
    return {OK: 0, NO_ANSWER: 0, OVER_CAP: 0, "answer_spans": 0, "answer_spans_inexact": 0}


def _split_counts(ds) -> dict[str, dict[str, int]]:
    """Per split: questions per status, and answer spans (all, and inexact ones) over the rows the split keeps;
    one streaming pass over four small columns."""
    import pyarrow.compute as pc

    counts: dict[str, dict[str, int]] = {}
    for batch in ds.select_columns(["split", "status", "answer_starts", "inexact_spans"]).iter_batches(
            batch_size=4096, batch_format="pyarrow"):
        for split in pc.unique(batch.column("split")).to_pylist():
            part = batch.filter(pc.equal(batch.column("split"), split))
            c = counts.setdefault(split, _no_counts())
            status = part.column("status")
            for name, n in zip(*pc.value_counts(status).flatten()):
                c[name.as_py()] += n.as_py()
            kept = pc.equal(status, OK) if split == "train" else pc.not_equal(status, OVER_CAP)
            c["answer_spans"] += pc.sum(pc.list_value_length(part.column("answer_starts").filter(kept))).as_py() or 0
            c["answer_spans_inexact"] += pc.sum(part.column("inexact_spans").filter(kept)).as_py() or 0
    return counts


def write_passages(cfg) -> dict:
    """Read, tokenise, cap, count the vocabularies on train, and write TOKENISED_PASSAGES shards with a manifest.

    Contexts over `cfg.max_context_tokens` are dropped in every split and counted (DynSAN's 5k-token rule).
    A training question whose answer occurs in no passage is an error naming it, or with `on_error="skip"` is
    dropped and counted; dev and test keep theirs (scored against the answer strings, so dropping them would
    inflate EM/F1) and count them."""
    import sys

    import ray.data
    from ray.data import ActorPoolStrategy
    from ray.data.expressions import col

    from pipelines.atomic import staged_dir
    from pipelines.shards import JOB, earlier_tokenisation, manifest_for, write_shards
    from pipelines.vocabulary import vocabulary_for

    options = {"contexts": cfg.quasart_contexts} if cfg.dataset == "quasart" else {}
    corpus = PASSAGE_READERS[cfg.dataset](cfg.input, on_error=cfg.on_error, **options)
    print(corpus.summary(), file=sys.stderr, flush=True)
    if "train" not in corpus.splits:
        raise FileNotFoundError(f"{cfg.input}: {cfg.dataset} has no train split (found {', '.join(corpus.splits)})")
    found = {"sizes": {s: {"questions": q} for s, (q, _) in corpus.sizes().items()},
             "differences_from_published": corpus.check_sizes(), "skipped": corpus.skipped,
             "dropped_without_question_or_passages": corpus.dropped_by_filter}
    with staged_dir(cfg.output, JOB, cfg.input_paths(), earlier_tokenisation) as staging:
        # Every split through one actor pool: the split rides along as a column.
        blocks = []
        for split, table in corpus.splits.items():
            table = table.append_column("split", pa.array([split] * table.num_rows, pa.string()))
            blocks += [table.slice(i, 256) for i in range(0, table.num_rows, 256)]  # ~2k context tokens a question
        tokenised = ray.data.from_arrow(blocks).map_batches(
            PassageTokenizer, batch_format="pyarrow", batch_size=64,
            fn_constructor_kwargs={"lowercase": cfg.lowercase, "max_context_tokens": cfg.max_context_tokens},
            compute=ActorPoolStrategy(min_size=1, max_size=max(1, int(ray.cluster_resources().get("CPU", 1))))
        ).materialize()
        counts = _split_counts(tokenised)
        kept = {split: tokenised.filter(expr=(col("split") == split) & ((col("status") == OK) if split == "train"
                                                                         else (col("status") != OVER_CAP)))
                for split in corpus.splits}
        missing = counts["train"][NO_ANSWER]
        if missing and cfg.on_error == "raise":
            examples = tokenised.filter(expr=(col("split") == "train") & (col("status") == NO_ANSWER)).take(3)
            raise ReaderError(
                f"{cfg.input}: {missing:,} training questions whose answer occurs in no passage (first: "
                + ", ".join(f"{r['qid']} {r['answers']}" for r in examples)
                + "); pass --skip-bad-records to drop and count them")
        vocab = vocabulary_for(kept["train"], cfg, counter=count_passage_tokens)
        vocab.save(os.path.join(staging, "vocab.json"))
        manifest = manifest_for(cfg, "tokenised_passages", vocab, found, staging)
        manifest["max_context_tokens"] = cfg.max_context_tokens
        for split, ds in kept.items():
            ids = ds.map_batches(PassageIds, batch_format="pyarrow", batch_size=64, fn_constructor_kwargs={
                "vocab_tokens": vocab.tokens, "vocab_chars": vocab.chars, "max_word_chars": cfg.max_word_chars},
                compute=ActorPoolStrategy(min_size=1, max_size=2))
            files = write_shards(ids, staging, split, cfg, size_from=tokenised)
            c = counts.get(split) or _no_counts()
            rows = sum(f["rows"] for f in files)
            manifest["splits"][split] = {
                "questions": rows, "rows": rows, "answer_spans": c["answer_spans"],
                "answer_spans_inexact": c["answer_spans_inexact"], "dropped_over_token_cap": c[OVER_CAP],
                "answer_not_found": c[NO_ANSWER], "answer_not_found_action": "dropped" if split == "train" else "kept",
                "files": files,
            }
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    return manifest

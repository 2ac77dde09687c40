"""Multi-passage reading comprehension: the stage that tokenises a question's passages into one rank-ordered context
with token-level answer spans, and the job's writer (the readers of SearchQA, Quasar-T, WikiHop and SQuAD 1.1 are in
pipelines/readers/passages.py).

DynSAN (Zhuang & Wang, "Token-level Dynamic Self-Attention Network for Multi-Passage Reading Comprehension", ACL
2019, section 4.1) concatenates every supporting passage in rank order, tokenises with spaCy and keeps at most 5k
tokens, discarding the few longer cases. A reader returns a `Corpus` (pipelines/readers/) whose tables have the
PASSAGE_RECORDS shape: one row per question with its passages in rank order, answer strings, character spans where
the set gives them (SQuAD), and candidates for multiple choice (WikiHop). `PassageTokenizer` then maps every
occurrence of an answer (or of a candidate: WikiHop's mentions) from characters to token positions, as the HAS
model's multi-occurrence supervision needs; rows whose context is over the cap, or whose answer occurs nowhere, are
marked with a status so the job can count them (and, for training, stop or skip by option) instead of losing them
silently.
"""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa

from pipelines.blocks import materialize_saying_progress
from pipelines.readers.common import ReaderError
from pipelines.readers.passages import PASSAGE_READERS

MAX_CONTEXT_TOKENS = 5_000  # DynSAN section 4.1
OK, NO_ANSWER, OVER_CAP = "ok", "answer_not_found", "over_token_cap"


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
        context: list[str] = []
        passage_starts: list[int] = []
        offsets: list = []
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
        searched = (
            [(i, c) for i, c in enumerate(row["candidates"])]
            if row["candidates"]
            else ([] if row["answer_spans"] else [(-1, a) for a in row["answers"]])
        )
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
        inexact = sum("".join(context[s : e + 1]).lower() not in wanted for s, e in spans_sorted)
        question, _, _ = self._words(question_doc)
        status = OVER_CAP if len(context) > self.max_context_tokens else OK if spans_sorted else NO_ANSWER
        return {
            "question_tokens": question,
            "context_tokens": context,
            "passage_starts": passage_starts,
            "answer_starts": [s for s, _ in spans_sorted],
            "answer_ends": [e for _, e in spans_sorted],
            "mention_starts": [m[0] for m in mentions_sorted],
            "mention_ends": [m[1] for m in mentions_sorted],
            "mention_candidates": [m[2] for m in mentions_sorted],
            "status": status,
            "inexact_spans": inexact,
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


TOKEN_COLUMNS = [
    ("question_tokens", pa.list_(pa.string())),
    ("context_tokens", pa.list_(pa.string())),
    ("passage_starts", pa.list_(pa.int32())),
    ("answer_starts", pa.list_(pa.int32())),
    ("answer_ends", pa.list_(pa.int32())),
    ("mention_starts", pa.list_(pa.int32())),
    ("mention_ends", pa.list_(pa.int32())),
    ("mention_candidates", pa.list_(pa.int32())),
    ("status", pa.string()),
    ("inexact_spans", pa.int32()),
]


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
            columns[f"{side}_char_ids"] = pa.array(
                [self.vocab.char_ids(t, self.max_word_chars) for t in tokens], pa.list_(pa.list_(pa.int32()))
            )
        table = pa.table(
            {
                **{
                    name: batch.column(name)
                    for name in batch.column_names
                    if name not in ("question_tokens", "status", "inexact_spans", "split")
                },
                **columns,
            }
        )
        return conform(table, TOKENISED_PASSAGES, "tokenised passages")


def _no_counts() -> dict[str, int]:
    return {OK: 0, NO_ANSWER: 0, OVER_CAP: 0, "answer_spans": 0, "answer_spans_inexact": 0}


def _split_counts(ds) -> dict[str, dict[str, int]]:
    """Per split: questions per status, and answer spans (all, and inexact ones) over the rows the split keeps;
    one streaming pass over four small columns."""
    import pyarrow.compute as pc

    counts: dict[str, dict[str, int]] = {}
    for batch in ds.select_columns(["split", "status", "answer_starts", "inexact_spans"]).iter_batches(
        batch_size=4096, batch_format="pyarrow"
    ):
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
    from pipelines.shards import JOB, earlier_tokenisation, manifest_for, say_progress, write_shards
    from pipelines.vocabulary import vocabulary_for

    options = {"contexts": cfg.quasart_contexts} if cfg.dataset == "quasart" else {}
    corpus = PASSAGE_READERS[cfg.dataset](cfg.input, on_error=cfg.on_error, **options)
    print(corpus.summary(), file=sys.stderr, flush=True)
    if "train" not in corpus.splits:
        raise FileNotFoundError(f"{cfg.input}: {cfg.dataset} has no train split (found {', '.join(corpus.splits)})")
    if not corpus.splits["train"].num_rows:  # the vocabulary and the counts below are the train split's
        raise ReaderError(f"{cfg.input}: {cfg.dataset}'s train split holds no question with passages")
    found = {
        "sizes": {s: {"questions": q} for s, (q, _) in corpus.sizes().items()},
        "differences_from_published": corpus.check_sizes(),
        "skipped": corpus.skipped,
        "dropped_without_question_or_passages": corpus.dropped_by_filter,
    }
    with staged_dir(cfg.output, JOB, cfg.input_paths(), earlier_tokenisation) as staging:
        # Every split through one actor pool: the split rides along as a column.
        blocks = []
        for split, table in corpus.splits.items():
            table = table.append_column("split", pa.array([split] * table.num_rows, pa.string()))
            blocks += [table.slice(i, 256) for i in range(0, table.num_rows, 256)]  # ~2k context tokens a question
        tokenised = materialize_saying_progress(
            ray.data.from_arrow(blocks).map_batches(
                PassageTokenizer,
                batch_format="pyarrow",
                batch_size=64,
                fn_constructor_kwargs={"lowercase": cfg.lowercase, "max_context_tokens": cfg.max_context_tokens},
                compute=ActorPoolStrategy(min_size=1, max_size=max(1, int(ray.cluster_resources().get("CPU", 1)))),
            ),
            say_progress,
            "every split",
            sum(table.num_rows for table in corpus.splits.values()),
        )
        counts = _split_counts(tokenised)
        kept = {
            split: tokenised.filter(
                expr=(col("split") == split)
                & ((col("status") == OK) if split == "train" else (col("status") != OVER_CAP))
            )
            for split in corpus.splits
        }
        missing = counts["train"][NO_ANSWER]
        if missing and cfg.on_error == "raise":
            examples = tokenised.filter(expr=(col("split") == "train") & (col("status") == NO_ANSWER)).take(3)
            raise ReaderError(
                f"{cfg.input}: {missing:,} training questions whose answer occurs in no passage (first: "
                + ", ".join(f"{r['qid']} {r['answers']}" for r in examples)
                + "); pass --skip-bad-records to drop and count them"
            )
        vocab = vocabulary_for(kept["train"], cfg, counter=count_passage_tokens)
        vocab.save(os.path.join(staging, "vocab.json"))
        manifest = manifest_for(cfg, "tokenised_passages", vocab, found, staging)
        manifest["max_context_tokens"] = cfg.max_context_tokens
        for split, ds in kept.items():
            ids = ds.map_batches(
                PassageIds,
                batch_format="pyarrow",
                batch_size=64,
                fn_constructor_kwargs={
                    "vocab_tokens": vocab.tokens,
                    "vocab_chars": vocab.chars,
                    "max_word_chars": cfg.max_word_chars,
                },
                compute=ActorPoolStrategy(min_size=1, max_size=2),
            )
            files = write_shards(ids, staging, split, cfg, size_from=tokenised)
            c = counts.get(split) or _no_counts()
            rows = sum(f["rows"] for f in files)
            manifest["splits"][split] = {
                "questions": rows,
                "rows": rows,
                "answer_spans": c["answer_spans"],
                "answer_spans_inexact": c["answer_spans_inexact"],
                "dropped_over_token_cap": c[OVER_CAP],
                "answer_not_found": c[NO_ANSWER],
                "answer_not_found_action": "dropped" if split == "train" else "kept",
                "files": files,
            }
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    return manifest

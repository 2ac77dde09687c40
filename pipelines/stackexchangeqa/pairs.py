"""Stage 6: positives and drawn negatives as pairs, each question's pairs together in an order drawn from the
seed, written as `{train,dev,test}/part-NNNNN.parquet` shards."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.blocks import release_unused_memory, trim_when_idle
from pipelines.schemas import QA_PAIRS, conform
from pipelines.shards import consecutive_groups, write_parquet_atomically
from pipelines.stackexchangeqa.config import KEPT_QUESTION, SPLITS
from pipelines.stackexchangeqa.threads import stable_unit

QUESTION_ROW = -1  # the label of the rows that bring each question's text into the pairs shuffle


_PAIRS_WITH_SPLIT = pa.schema(list(QA_PAIRS) + [pa.field("split", pa.string())])


def questions_in_seeded_order(batch: pa.Table, seed: int) -> pa.Table:
    """A block of whole questions' pairs, split by split (so that a split's rows are one zero-copy slice when the
    shards are written), within a split questions in an order drawn from (seed, qid), each question's positives
    first, then its negatives, each by answer id: the same rows in the same order on every run. Pairs come without
    their question's text and take it from their question's row (label QUESTION_ROW), which is then left out."""
    trim_when_idle(now=True)
    if batch.num_rows == 0:
        return batch
    is_question = pc.equal(batch["label"], QUESTION_ROW)
    question_ids, question_texts = pc.filter(batch["qid"], is_question), pc.filter(batch["question"], is_question)
    rows = np.flatnonzero(~is_question.to_numpy(zero_copy_only=False))
    keys = batch.select(["split", "qid", "label", "aid"]).take(pa.array(rows, pa.int64()))
    questions = pc.unique(keys["qid"])  # a question has many pairs: hash each once
    units = pa.array([stable_unit(seed, qid) for qid in questions.to_pylist()], pa.float64())
    keys = keys.append_column("key", pc.take(units, pc.index_in(keys["qid"], value_set=questions)))
    order = pc.sort_indices(
        keys,
        sort_keys=[
            ("split", "ascending"),
            ("key", "ascending"),
            ("qid", "ascending"),
            ("label", "descending"),
            ("aid", "ascending"),
        ],
    )
    pairs = batch.take(pa.array(rows[order.to_numpy()], pa.int64()))
    source = pc.index_in(pairs["qid"], value_set=question_ids)
    if source.null_count:
        missing = pc.filter(pairs["qid"], pc.is_null(source))[0].as_py()
        raise ValueError(f"pairs of question {missing} arrived without their question's row")
    return pairs.set_column(pairs.schema.get_field_index("question"), "question", pc.take(question_texts, source))


def pairs_in_seeded_order(block: pa.Table, seed: int) -> tuple[pa.Table, dict]:
    """`questions_in_seeded_order`'s block, and its summary for the shard writer."""
    ordered = questions_in_seeded_order(block, seed)
    return ordered, summarise_pairs_block(ordered)


def negative_pairs(batch: pa.Table) -> pa.Table:
    """The sampler's drawn negatives as rows of pairs (its shortfall rows, which have no answer, left out)."""
    return as_pairs(batch.filter(pc.not_equal(batch["aid"], "")))


def as_pairs(batch: pa.Table) -> pa.Table:
    """Thread rows (positives: label 1; kept questions: QUESTION_ROW, the only rows with the question's text) or
    drawn negatives (no `status`: label 0) as rows of pairs."""
    n = batch.num_rows
    if "status" in batch.column_names:
        label = pc.if_else(
            pc.equal(batch["status"], KEPT_QUESTION), pa.scalar(QUESTION_ROW, pa.int8()), pa.scalar(1, pa.int8())
        )
        accepted = batch["accepted"]
    else:
        label, accepted = pa.array(np.zeros(n, np.int8)), pa.array(np.zeros(n, bool))
    return pa.table(
        {
            "qid": batch["qid"],
            "question": batch["question"],
            "aid": batch["aid"],
            "answer": batch["answer"],
            "label": label,
            "score": batch["score"],
            "accepted": accepted,
            "site": batch["site"],
            "split": batch["split"],
        }
    ).cast(_PAIRS_WITH_SPLIT)


def split_pairs(batch: pa.Table, split: str) -> pa.Table:
    """One split's rows of a block of pairs (QA_PAIRS columns, checked; the split is the folder), as a slice of the
    block: `questions_in_seeded_order` put each split's rows together, so nothing is copied (a filter copied
    every row of the split into the write task's heap: 270 MB a task at 1M posts)."""
    splits = batch["split"]
    start = pc.index(splits, split).as_py()
    if start < 0:
        return QA_PAIRS.empty_table()
    rows = int(pc.sum(pc.equal(splits, split)).as_py())
    piece = batch.slice(start, rows)
    if pc.count_distinct(piece["split"]).as_py() != 1:
        raise ValueError(f"the {split} rows of a block of pairs are not contiguous (sort them by split first)")
    return conform(piece.drop_columns(["split"]), QA_PAIRS, "StackExchangeQA pairs")


def summarise_pairs_block(block: pa.Table) -> dict:
    """A block's first question id (its place in the shards) and its rows per (split, label)."""
    if block.num_rows == 0:
        return {"first": None, "counts": []}
    counts = block.group_by(["split", "label"], use_threads=False).aggregate([([], "count_all")])
    return {
        "first": block["qid"][0].as_py(),
        "counts": list(zip(counts["split"].to_pylist(), counts["label"].to_pylist(), counts["count_all"].to_pylist())),
    }


def _write_pair_shard(path: str, split: str, *blocks: pa.Table) -> int:
    """One shard: `split`'s rows of `blocks` (slices of the object store's blocks, so nothing is copied but a row
    group at a time), to `path` through a temporary name; returns the rows written."""
    trim_when_idle(now=True)  # a worker that ran a reducer just before holds what it freed
    rows = write_parquet_atomically(path, QA_PAIRS, (split_pairs(block, split) for block in blocks))
    release_unused_memory()
    return rows


def write_pair_shards(
    pairs: list, summaries: list[dict], directory: str, rows_per_shard: int, questions_per_split: dict
) -> dict:
    """`directory/{train,dev,test}/part-NNNNN.parquet` from the pairs' blocks (references to blocks of whole
    questions, each split's rows together) and their summaries (`summarise_pairs_block`), and the rows,
    positives, negatives, questions and shards of each split.

    Blocks are taken in the order of their first question id, so the same build writes the same rows to the same
    shard names; a shard gathers consecutive blocks until it holds at least `rows_per_shard` rows of its split (the
    last of a split may hold fewer). The shards are written by tasks that read the blocks in place in the object
    store and stream them out a row group at a time: Ray Data's writer concatenated each shard's rows in a
    worker's heap (the build's peak at 1M posts)."""
    import ray

    blocks = sorted((s["first"], ref, s["counts"]) for s, ref in zip(summaries, pairs) if s["first"] is not None)
    totals: dict[tuple[str, int], int] = {}
    for _, _, counts in blocks:
        for split, label, n in counts:
            totals[(split, label)] = totals.get((split, label), 0) + n
    write = ray.remote(num_cpus=1)(_write_pair_shard)
    pending, result = [], {}
    for split in SPLITS:
        target = os.path.join(directory, split)
        os.makedirs(target, exist_ok=True)
        here = [sum(n for s, _, n in counts if s == split) for _, _, counts in blocks]
        groups = consecutive_groups(here, rows_per_shard)
        for number, group in enumerate(groups):
            path = os.path.join(target, f"part-{number:05d}.parquet")
            shard = write.remote(path, split, *(blocks[i][1] for i in group))
            pending.append((split, sum(here[i] for i in group), shard))
        positive, negative = totals.get((split, 1), 0), totals.get((split, 0), 0)
        result[split] = {
            "questions": questions_per_split.get(split, 0),
            "rows": positive + negative,
            "positive": positive,
            "negative": negative,
            "shards": len(groups),
        }
    for split, planned, ref in pending:
        written = ray.get(ref)
        if written != planned:
            raise RuntimeError(f"a {split} shard of StackExchangeQA pairs holds {written:,} rows, {planned:,} planned")
    return result

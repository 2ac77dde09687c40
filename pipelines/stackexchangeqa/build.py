"""The build end to end: the stages as Ray tasks over object references (three hash shuffles), timed one by
one, and `write`, which stages the whole output and replaces the old one only when complete."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import pyarrow as pa

from crawl.dump import ANSWER
from pipelines.atomic import staged_dir
from pipelines.blocks import materialised_blocks, materialize, wait_saying_progress
from pipelines.datacard import write_card
from pipelines.dedup import duplicate_answers
from pipelines.hard_negatives import Miner, mined_negative_blocks, mined_summary
from pipelines.negatives import negative_blocks
from pipelines.shards import write_blocks
from pipelines.shuffle import composed, hash_shuffle
from pipelines.stackexchangeqa.config import JOB, KEPT_QUESTION, PAPER, POSITIVE, BuildConfig, earlier_build
from pipelines.stackexchangeqa.funnel import (
    ATTRIBUTION,
    attribution_rows_of,
    funnel,
    mining_candidates,
    negative_candidates,
    rows_with_status,
    summarise_threads,
)
from pipelines.stackexchangeqa.pairs import as_pairs, negative_pairs, pairs_in_seeded_order, write_pair_shards
from pipelines.stackexchangeqa.posts import analyse_posts, mark_rows, source_posts
from pipelines.stackexchangeqa.threads import assemble_threads


class _Stages:
    """Times each stage, logs it to stderr with its row rate, and keeps the timings for stats.json."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.last = time.time()

    def done(self, name: str, rows: int | None = None, unit: str = "rows") -> None:
        now = time.time()
        took = now - self.last
        self.seconds[name] = round(took, 2)
        rate = f" ({rows / took:,.0f} {unit}/s)" if rows and took > 0 else ""
        counted = f": {rows:,} {unit}" if rows is not None else ""
        self.say(f"{name}{counted} in {took:.1f} s{rate}")
        self.last = now

    def say(self, line: str) -> None:
        print(f"[build] {line}", file=sys.stderr, flush=True)


def _threads_and_summary(block: pa.Table, pool_mode: str, **rules) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A partition of posts (whole threads) as thread rows (`assemble_threads`), with their funnel counts and
    attribution rows (`summarise_threads`), counted while the worker holds the rows (a pass of their own would read
    every stored thread again)."""
    threads = assemble_threads(block, **rules)
    return (threads, *summarise_threads(threads, pool_mode))


def thread_blocks(cfg: BuildConfig, stages: _Stages) -> tuple[tuple[list, list[int]], list, list]:
    """Stages 1-4: every post of every source with its status, role, split and text, as references to the
    thread blocks (with their bytes), their funnel counts and their attribution rows; each stage waited for and
    timed in turn into `stages` (analysed posts, duplicate marks, threads), for the stage profile."""
    import ray
    from ray.data.expressions import col

    posts = source_posts(cfg)
    index_ref = None
    if cfg.exclude_test_sets:
        from pipelines.overlap import reference_index

        index_ref = [ray.put(reference_index(cfg.exclude_test_sets, cfg.overlap_ngram))]
    posts = posts.map_batches(
        analyse_posts,
        batch_format="pyarrow",
        fn_kwargs={
            "keep_code": cfg.keep_code,
            "unsure_below": cfg.fasttext_threshold,
            "index_ref": index_ref,
            "overlap_ngram": cfg.overlap_ngram,
            "language_chars": cfg.language_chars,
        },
    )
    # Materialised, not streamed into the thread shuffle: streamed, the first stage and the shuffle together
    # took 98 s at 1M posts against 54 + 12 s one after the other (Ray Data's shuffle, one run each).
    posts = materialize(posts)
    count = posts.count()
    stages.done("read, text, language", count, "posts")
    refs, _, sizes = materialised_blocks(posts)
    sources: list[tuple[list, list[int], Callable | None]] = [(refs, sizes, None)]
    if cfg.dedup != "off":
        answers = posts.filter(expr=(col("post_type") == ANSWER) & (col("text") != ""))
        answers = answers.select_columns(["site", "id", "thread", "score", "text"])
        marks = duplicate_answers(
            answers, mode=cfg.dedup, threshold=cfg.near_duplicate_threshold, partitions=_partitions(cfg)
        )
        marks = materialize(marks)
        stages.done("dedup", marks.count(), "duplicates")
        refs, _, sizes = materialised_blocks(marks)
        sources.append((refs, sizes, partial(mark_rows, schema=posts.schema().base_schema)))
        del marks
    if not sum(len(blocks) for blocks, _, _ in sources):
        raise NoPosts(cfg, [])
    del posts  # from here the shuffle's map tasks hold the blocks, and free each once they have cut it
    # A hash shuffle by thread whose partitions stay whole blocks; the threads of a block are assembled in one
    # call (per-thread calls cost more than the assembly itself).
    results = hash_shuffle(
        sources,
        ["site", "thread"],
        _partitions(cfg),
        _threads_and_summary,
        {
            "pool_mode": cfg.negative_pool,
            "min_score": cfg.min_score,
            "english_threshold": cfg.english_threshold,
            "dev_fraction": cfg.dev_fraction,
            "test_fraction": cfg.test_fraction,
        },
        returns=3,
        task_bytes=cfg.partition_mb << 20,
    )
    del sources
    threads, counts, attribution, thread_bytes = (list(refs) for refs in zip(*results))
    thread_bytes = ray.get(thread_bytes)
    stages.done("threads", count, "posts")
    return (threads, thread_bytes), counts, attribution


class NoPosts(ValueError):
    """Raised when the sources gave no post at all: names them, and the first fetch failure if any."""

    def __init__(self, cfg: BuildConfig, failures: list[dict]):
        sources = cfg.dumps + cfg.api_sites + cfg.urls[:3]
        hint = (
            f"; {len(failures)} fetch failures, first: {failures[0]['url']}: {failures[0]['reason']}"
            if failures
            else ""
        )
        super().__init__(f"no posts found in {', '.join(sources)}{hint}")


# The fewest shuffle partitions: enough tasks to keep a small cluster busy on a small build. A constant, not the
# cluster's CPUs: the partitions decide which questions share a block, and so the shards' row order; from the
# cluster's size, a build on 2 CPUs and one on 3 wrote the same rows in other orders (other files, another
# training stream), so a corpus built on a laptop was not the one a cluster builds.
MIN_PARTITIONS = 16


def _partitions(cfg: BuildConfig) -> int:
    """Shuffle partitions: about `partition_mb` of dump each (so a partition's size does not grow with the input),
    at least MIN_PARTITIONS, at most 4,000 (past that, partitions grow: Stack Overflow's 100 GB of XML gives 25 MB
    each). From the input and the options only, never the cluster: the same build writes the same shards on any
    cluster (a smaller --partition-mb gives a large cluster more tasks, and another order)."""
    size = sum(os.path.getsize(p) for p in cfg.dumps) + 20_000 * (len(cfg.urls) + 1000 * len(cfg.api_sites))
    return max(MIN_PARTITIONS, min(4000, size // (cfg.partition_mb << 20) + 1))


def _bound_shuffle_memory(cfg: BuildConfig) -> None:
    """For Ray Data's shuffles (the dedup stage's; the build's own are `pipelines.shuffle`, sized by the same
    `partition_mb`). A shuffle's map side merges its input blocks up to `DataContext.shuffle_input_batch_bytes`
    (1 GiB by default) before partitioning them in one task, so a worker's heap grew with the input until 1 GiB
    (1.2 GB at 1M posts against 0.15 GB at 100k); `partition_mb` of input per map task keeps it the same at any
    size."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.shuffle_input_batch_bytes = cfg.partition_mb << 20
    # LZ4 for the shuffles' shards, not Ray's default zstd: a map task compresses one shard per partition, and at
    # 1M posts (33 partitions) the pairs shuffle's map tasks held 350 MB of heap at the peak with zstd against
    # 200 MB with LZ4 (bench/stackexchangeqa.py, one run each; the build took 141 s and 128 s). Shards live in
    # the object store for seconds: a lighter codec costs little there.
    if "RAY_DATA_SHUFFLE_COMPRESSION" not in os.environ:
        context.shuffle_compression = "lz4"


@dataclass
class Built:
    """What `build` makes, as object references (not waited for, but where said): the pairs' blocks (QA_PAIRS
    columns plus `split`, blocks of whole questions) with a summary of each (`summarise_pairs_block`), the
    attribution rows' blocks, and the funnel (waited for)."""

    pairs: list
    pair_summaries: list
    attribution: list
    attribution_rows: list[int]
    stats: dict


def build_blocks(cfg: BuildConfig, stages: _Stages | None = None, miner: Miner | None = None) -> Built:
    """The build as Ray tasks over object references: three hash shuffles (`pipelines.shuffle`), by thread, by
    negative-pool bucket and by question, each reducer returning its block and what the next steps need to know
    of it (funnel counts, shortfall, first question and counts), so no stage reads another's output twice.
    Negatives are sampled at random, or mined by `miner` where cfg.hard_negatives names one."""
    import ray

    _check_miner_given(cfg, miner)
    _bound_shuffle_memory(cfg)
    stages = stages or _Stages()
    threads, counts, attribution = thread_blocks(cfg, stages)
    counts = ray.get(counts)
    stats = funnel(counts)
    pool_sizes = stats.pop("pool_groups")
    stages.done("funnel")
    if stats["posts_in"] == 0:
        raise NoPosts(cfg, stats["failures"])
    if miner is None:
        # The sampler's pool: a thread row carries its question's text, which neither the pool nor the requests read.
        drawn = negative_blocks(
            threads,
            "asks",
            k=cfg.negatives,
            seed=cfg.seed,
            pool_sizes=pool_sizes,
            mode=cfg.negative_pool,
            bucket_size=cfg.negative_bucket_size,
            partitions=_partitions(cfg),
            question_text=False,
            select=negative_candidates,
            task_bytes=cfg.partition_mb << 20,
        )
    else:
        prepare = partial(
            mining_candidates, k=cfg.negatives, seed=cfg.seed, mode=cfg.negative_pool, sizes_ref=[ray.put(pool_sizes)]
        )
        # A map task per thread block (there are at least MIN_PARTITIONS), not blocks gathered to partition_mb:
        # embedding costs far more per byte than cutting blocks, and one task would embed a small build alone.
        embedding: list = []
        drawn = mined_negative_blocks(
            threads, prepare, miner, _partitions(cfg), task_bytes=1, gpus=cfg.mine_gpus, map_done=embedding
        )
        # The embedding tasks are the long part (403 s of the eleven-site build's 423 on 2 CPUs), said as they go.
        wait_saying_progress(embedding, stages.say, "blocks of threads embedded by the miner")
        wait_saying_progress([summary for _, summary, _ in drawn], stages.say, "partitions of pool groups mined")
    negatives = [block for block, _, _ in drawn]
    drawn_counts, negative_bytes = ray.get([summary for _, summary, _ in drawn]), ray.get([b for _, _, b in drawn])
    stats["negatives_short"] = sum(c["short"] for c in drawn_counts)
    stats["negatives"] = (
        {"drawn": "random", "pool": cfg.negative_pool, "seed": cfg.seed}
        if miner is None
        else dict(mined_summary(miner.spec, drawn_counts), pool=cfg.negative_pool, seed=cfg.seed)
    )
    stages.done("negatives", sum(c["rows"] for c in drawn_counts))
    stats["stage_seconds"] = stages.seconds
    # Positives and kept questions (which carry the question's text into the shuffle) are taken from the
    # threads inside the shuffle's map tasks, and drawn negatives (not their shortfall rows) from the sampler's
    # blocks. Shards in source order would hold every positive, then every negative: a training stream of one
    # label for thousands of steps. A hash shuffle by question brings each question's pairs together, in an
    # order drawn from the seed; the pairs cross it without their question's text, which they take there from
    # their question's row, the only one to carry it.
    kept = partial(
        rows_with_status,
        statuses=[POSITIVE, KEPT_QUESTION],
        columns=["status", "qid", "question", "aid", "answer", "score", "accepted", "site", "split"],
    )
    ordered = hash_shuffle(
        [(*threads, composed(kept, as_pairs)), (negatives, negative_bytes, negative_pairs)],
        ["qid"],
        _partitions(cfg),
        pairs_in_seeded_order,
        {"seed": cfg.seed},
        returns=2,
        task_bytes=cfg.partition_mb << 20,
    )
    pairs, summaries, _ = (list(refs) for refs in zip(*ordered))
    return Built(
        pairs=pairs,
        pair_summaries=summaries,
        attribution=attribution,
        attribution_rows=[attribution_rows_of(c) for c in counts],
        stats=stats,
    )


def _check_miner_given(cfg: BuildConfig, miner: Miner | None) -> None:
    """A miner exactly where the configuration names one: a build of mined negatives never falls back to random
    ones, nor the other way round."""
    if bool(cfg.hard_negatives) != (miner is not None):
        raise ValueError(
            f"BuildConfig.hard_negatives is {cfg.hard_negatives!r} but the miner given is {miner!r}: "
            "pass inference.miner.miner_of(cfg)"
        )


def build(cfg: BuildConfig, miner: Miner | None = None):
    """The pairs dataset (QA_PAIRS columns plus `split`), the post funnel, and the attribution rows (a dataset)."""
    import ray.data

    built = build_blocks(cfg, miner=miner)
    return ray.data.from_arrow_refs(built.pairs), built.stats, ray.data.from_arrow_refs(built.attribution)


def write(cfg: BuildConfig, miner: Miner | None = None) -> dict:
    """Build and write `output/{train,dev,test}/*.parquet` and `output/stats.json`, atomically (negatives mined by
    `miner` where cfg.hard_negatives names one: `inference.miner.miner_of(cfg)`).

    Everything is written to a staging folder that replaces `output` only once complete: a crash leaves the
    previous output (or none) and no half-written shards. The build is deterministic, so a re-run after a
    crash writes the same rows, in the same shards, on a cluster of any size (`_partitions`)."""
    import ray
    import ray.data

    _check_miner_given(cfg, miner)
    started = time.time()
    with staged_dir(cfg.output, JOB, cfg.input_paths(), earlier_build) as staging:
        built = build_blocks(cfg, miner=miner)
        stats = built.stats
        stages = _Stages()
        summaries = ray.get(built.pair_summaries)
        stages.done("pairs", sum(n for s in summaries for _, _, n in s["counts"]))
        splits = write_pair_shards(
            built.pairs, summaries, staging, cfg.rows_per_shard, stats.pop("questions_per_split")
        )
        write_blocks(
            built.attribution,
            built.attribution_rows,
            os.path.join(staging, "attribution"),
            ATTRIBUTION,
            cfg.rows_per_shard,
        )
        stages.done("shards")
        positive = sum(s["positive"] for s in splits.values())
        negative = sum(s["negative"] for s in splits.values())
        stats["pairs"] = {
            "positive": positive,
            "negative": negative,
            "total": positive + negative,
            "negatives_per_positive": round(negative / positive, 2) if positive else 0.0,
            "negatives_short": stats.pop("negatives_short"),
        }
        stats["splits"] = splits
        stats["paper"] = PAPER
        stats["config"] = asdict(cfg)
        stats["config"]["api_key"] = "***" if cfg.api_key else None  # never written to disk
        stats["config"]["urls"] = len(cfg.urls)
        stats["seconds"] = round(time.time() - started, 1)
        failures = stats.pop("failures")
        reasons: dict[str, int] = {}
        for failure in failures:
            key = re.sub(r"https?://\S+", "URL", failure["reason"])[:80]
            reasons[key] = reasons.get(key, 0) + 1
        stats["fetch_failure_reasons"] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
        with open(os.path.join(staging, "failures.jsonl"), "w") as f:
            for failure in failures:
                f.write(json.dumps(failure) + "\n")
        write_card(stats, staging)
        stages.done("card")
        stats["stage_seconds"].update(stages.seconds)
        with open(os.path.join(staging, "stats.json"), "w") as f:
            json.dump(stats, f, indent=2, sort_keys=True)
    return stats

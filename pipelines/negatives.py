"""Negative answers sampled at cluster scale, without gathering the answer pool anywhere.

For each positive pair the paper adds real answers to *other* questions as negatives (15.7 per positive in
its corpus). Here every candidate answer belongs to a pool group (same site and split by default; any site;
or same site, tag and split) and, inside the group, to one of B buckets by a hash of its id, B chosen so a
bucket holds about `bucket_size` answers. Each positive asks for its negatives bucket by bucket (buckets drawn
uniformly by a SplitMix64 stream seeded with (seed, answer id)); the requests and the pool meet in one shuffle keyed
by (group, bucket), and each bucket draws, without replacement, from its answers that do not belong to the
asking question. So:

- no node ever holds more than a bucket of answers, whatever the corpus size;
- a question never gets its own answers, nor the same negative twice (buckets split a group, and a question
  draws from one group);
- the result depends on (seed, question id, answer ids) only, not on partitioning or worker count;
- k may be fractional (the paper's 15.71): each positive asks for floor(k) or floor(k)+1 negatives, seeded;
- only one shuffle: requests are made batch by batch, and group sizes are counted per batch;
- every draw comes from a counter-based generator (SplitMix64 over hashed ids), computed column-wise: builds
  before it drew from numpy generators seeded the same way, so the negatives they chose differ from today's,
  with the same rules.

A bucket too small for what is asked gives all it has; the shortfall is reported.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.blocks import trim_when_idle

POOL_MODES = ("site", "any", "tag")

# Where a question's negatives come from, by --negative-pool (pool_rows): what a shortfall is short of.
POOL_WORDS = {
    "site": "its site's answers in its split",
    "any": "every site's answers in its split",
    "tag": "its site's answers under one of its tags (seeded) in its split",
}


def shortfall_text(short: int, asked: float, mode: str, mined: bool = False) -> str:
    """Why a build has fewer negatives per positive than asked, in words for its summary and data card."""
    guard = ", nor those the false-negative guard passes over" if mined else ""
    return (
        f"{short:,} negatives short of {asked:g} per positive: a question draws from {POOL_WORDS[mode]} "
        f"(not its own answers{guard}; none twice), and some of those hold too few"
    )


REQUESTS = pa.schema(
    [
        ("kind", pa.string()),
        ("group", pa.string()),
        ("bucket", pa.int64()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("question", pa.string()),
        ("answer", pa.string()),
        ("score", pa.int32()),
        ("wanted", pa.int64()),
        ("site", pa.string()),
        ("split", pa.string()),
    ]
)
NEGATIVES = pa.schema(
    [
        ("qid", pa.string()),
        ("question", pa.string()),
        ("aid", pa.string()),
        ("answer", pa.string()),
        ("score", pa.int32()),
        ("site", pa.string()),
        ("split", pa.string()),
        ("short", pa.int64()),
    ]
)


def _hash64(*parts) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "big")


def bucket_of(aid: str, buckets: int) -> int:
    return _hash64("bucket", aid) % buckets


def buckets_for(count: int, bucket_size: int) -> int:
    return max(1, math.ceil(count / bucket_size))


def pool_groups(batch: pa.Table, mode: str) -> tuple[pa.Array, np.ndarray]:
    """Each row's pool groups as one string array, and for each of them the index of its row (several groups a
    row in tag mode, one otherwise)."""
    import pyarrow.compute as pc

    rows = np.arange(batch.num_rows)
    if mode == "site":
        return pc.binary_join_element_wise(batch["split"], batch["site"], "|"), rows
    if mode == "any":
        return batch["split"].combine_chunks() if isinstance(batch["split"], pa.ChunkedArray) else batch["split"], rows
    if mode == "tag":
        tags = batch["tags"].combine_chunks()
        parents = pc.list_parent_indices(tags).to_numpy()
        flat = pc.list_flatten(tags)
        return pc.binary_join_element_wise(
            pc.take(batch["split"], parents), pc.take(batch["site"], parents), flat, "|"
        ), parents
    raise ValueError(f"pool mode must be one of {POOL_MODES}, got {mode!r}")


def pool_rows(batch: pa.Table, mode: str) -> pa.Table:
    """Candidate answers as `pool` rows keyed by group (one row per group; several in tag mode)."""
    groups, rows = pool_groups(batch, mode)
    n = len(rows)
    taken = batch.select(["qid", "aid", "answer", "score", "site", "split"])
    if mode == "tag":  # a row per (answer, tag); otherwise the rows as they are, not copied
        taken = taken.take(pa.array(rows, pa.int64()))
    return pa.table(
        {
            "kind": pa.array(["pool"] * n, pa.string()),
            "group": groups,
            "bucket": pa.array(np.full(n, -1, np.int64)),
            "qid": taken["qid"],
            "aid": taken["aid"],
            "question": pa.array([""] * n, pa.string()),
            "answer": taken["answer"],
            "score": taken["score"],
            "wanted": pa.array(np.zeros(n, np.int64)),
            "site": taken["site"],
            "split": taken["split"],
        }
    ).cast(REQUESTS)


class AssignBuckets:
    """Sets `bucket` on pool rows from the group sizes (one small dict, loaded once per actor)."""

    def __init__(self, sizes_ref, bucket_size: int):
        import ray

        sizes = sizes_ref[0]
        self.sizes = ray.get(sizes) if isinstance(sizes, ray.ObjectRef) else sizes
        self.bucket_size = bucket_size

    def __call__(self, batch: pa.Table) -> pa.Table:
        groups = batch.column("group").to_pylist()
        aids = batch.column("aid").to_pylist()
        buckets = [bucket_of(a, buckets_for(self.sizes[g], self.bucket_size)) for g, a in zip(groups, aids)]
        index = batch.schema.get_field_index("bucket")
        return batch.set_column(index, "bucket", pa.array(buckets, pa.int64()))


_GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over uint64 counters: the i-th number of a stream is splitmix64(base + i x
    golden). Counter-based, so any draw can be computed alone, in any order, on any worker."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _stream(base: int, count: int) -> list[int]:
    """`count` numbers of the SplitMix64 stream that starts at `base`."""
    return _streams(np.array([base], dtype=np.uint64), np.array([count]))[0]


def _streams(bases: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    """For each (base, count), `count` numbers of the stream at `base`, all computed in one vectorised call (a
    call per stream cost more in numpy's overhead than the draws themselves)."""
    counts = np.asarray(counts, dtype=np.int64)
    numbers = _concatenated_streams(bases, counts)[1].tolist()
    ends = np.cumsum(counts).tolist()
    return [numbers[end - n : end] for end, n in zip(ends, counts.tolist())]


def _concatenated_streams(bases: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The streams of `_streams` one after another, and for each number the index of its stream."""
    which = np.repeat(np.arange(len(counts)), counts)
    step = np.arange(len(which)) - np.repeat(np.cumsum(counts) - counts, counts)
    with np.errstate(over="ignore"):
        return which, splitmix64(bases.astype(np.uint64)[which] + step.astype(np.uint64) * np.uint64(_GOLDEN))


def negatives_wanted(k: float, seed: int, aid: str) -> int:
    """The negatives positive `aid` asks for: floor(k), or floor(k)+1 with probability frac(k), seeded by its id
    (the mined negatives of `pipelines.hard_negatives` give a question as many as this sampler would)."""
    whole, frac = int(k), k - int(k)
    return whole + (1 if frac and (_hash64("k", seed, aid) / 2**64) < frac else 0)


def chosen_group(options: list[str], seed: int, qid: str) -> str:
    """The one pool group a question draws from among those it belongs to (several in tag mode), seeded by its
    id; "" where it belongs to none with answers."""
    options = sorted(set(options))
    if len(options) > 1:
        return options[_hash64("group", seed, qid) % len(options)]
    return options[0] if options else ""


class RequestNegatives:
    """Positive pairs to `request` rows: how many negatives each wants from which (group, bucket).

    Works batch-wise (no shuffle): a positive's count, floor(k) or floor(k)+1, is seeded by its answer id; its
    pool group (one per question: tag mode offers several) by (seed, question id); its buckets by a SplitMix64
    stream seeded by (seed, answer id), for all positives of a batch in one vectorised call. Requests of one
    question that land in the same bucket are merged there and drawn together, without replacement.
    """

    def __init__(self, sizes_ref, k: float, seed: int, mode: str, bucket_size: int, question_text: bool = True):
        import ray

        sizes = sizes_ref[0]
        self.sizes = ray.get(sizes) if isinstance(sizes, ray.ObjectRef) else sizes
        self.k, self.seed, self.mode, self.bucket_size = k, seed, mode, bucket_size
        self.question_text = question_text

    def wanted(self, aid: str) -> int:
        return negatives_wanted(self.k, self.seed, aid)

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        if n == 0:
            return REQUESTS.empty_table()
        groups, parents = pool_groups(batch, self.mode)
        choices: list[list[str]] = [[] for _ in range(n)]
        for group, row in zip(groups.to_pylist(), parents.tolist()):
            if self.sizes.get(group):
                choices[row].append(group)
        qids, aids = batch["qid"].to_pylist(), batch["aid"].to_pylist()
        wanted = np.array([self.wanted(a) for a in aids], dtype=np.int64)
        chosen: list[str] = [""] * n
        buckets = np.ones(n, dtype=np.int64)
        for i, options in enumerate(choices):
            if options and wanted[i]:
                pick = chosen_group(options, self.seed, qids[i])
                chosen[i], buckets[i] = pick, buckets_for(self.sizes[pick], self.bucket_size)
        drawing = np.array([bool(c) for c in chosen]) & (wanted > 0)
        short_rows = np.flatnonzero(~drawing & (wanted > 0))
        rows = np.flatnonzero(drawing)
        counts = wanted[rows]
        # One draw per negative wanted: row r's j-th bucket is splitmix64(hash(seed, aid) + j x golden) mod B_r.
        bases = np.array([_hash64("buckets", self.seed, aids[r]) for r in rows], dtype=np.uint64)
        which, draws = _concatenated_streams(bases, counts)
        bucket = (draws % buckets[rows][which].astype(np.uint64)).astype(np.int64)
        most = int(buckets.max())
        keys, per_key = np.unique(which * most + bucket, return_counts=True)  # (row, bucket) pairs, counted
        request_rows = rows[keys // most]
        tables = [
            self._rows(
                batch,
                request_rows,
                "request",
                [chosen[r] for r in request_rows.tolist()],
                keys % most,
                per_key,
                self.question_text,
            )
        ]
        if len(short_rows):
            tables.append(
                self._rows(
                    batch,
                    short_rows,
                    "short",
                    [""] * len(short_rows),
                    np.full(len(short_rows), -1),
                    wanted[short_rows],
                    False,
                )
            )
        return pa.concat_tables(tables)

    @staticmethod
    def _rows(
        batch: pa.Table,
        rows: np.ndarray,
        kind: str,
        groups: list[str],
        buckets: np.ndarray,
        wanted: np.ndarray,
        question_text: bool,
    ) -> pa.Table:
        m = len(rows)
        taken = batch.select(["qid", "site", "split"] + (["question"] if question_text else [])).take(
            pa.array(rows, pa.int64())
        )
        question = taken["question"] if question_text else pa.array([""] * m, pa.string())
        return pa.table(
            {
                "kind": pa.array([kind] * m, pa.string()),
                "group": pa.array(groups, pa.string()),
                "bucket": pa.array(np.asarray(buckets, np.int64)),
                "qid": taken["qid"],
                "aid": pa.array([""] * m, pa.string()),
                "question": question,
                "answer": pa.array([""] * m, pa.string()),
                "score": pa.array(np.zeros(m, np.int32)),
                "wanted": pa.array(np.asarray(wanted, np.int64)),
                "site": taken["site"],
                "split": taken["split"],
            }
        ).cast(REQUESTS)


def _draw_without_replacement(base: int, population: int, count: int) -> list[int]:
    """`count` distinct indices of range(population) in a uniformly random order, from the SplitMix64 stream at
    `base`."""
    return _shuffle_head(population, _stream(base, count))


def _shuffle_head(population: int, stream: list[int]) -> list[int]:
    """The first len(stream) places of a Fisher-Yates shuffle of range(population) driven by `stream` (a partial
    shuffle kept in a dict, so O(len(stream)))."""
    swapped: dict[int, int] = {}
    out = []
    for i, r in enumerate(stream):
        j = i + r % (population - i)
        out.append(swapped.get(j, j))
        swapped[j] = swapped.get(i, i)
    return out


def sample_buckets(block: pa.Table, seed: int) -> pa.Table:
    """Negative pairs for every (group, bucket) of a block that holds whole buckets (after a shuffle by them):
    each request draws, without replacement, from its bucket's answers that are not its own question's."""
    trim_when_idle(now=True)
    import pyarrow.compute as pc

    if block.num_rows == 0:
        return NEGATIVES.empty_table()
    is_pool = pc.equal(block["kind"], "pool")
    # The pool's keys sorted, and where each sorted row is in the block: the answers' texts are copied once, for
    # the answers drawn, not by the filter and the sort.
    pool_rows = np.flatnonzero(is_pool.to_numpy(zero_copy_only=False))
    pool = block.select(["group", "bucket", "aid", "qid"]).take(pa.array(pool_rows, pa.int64()))
    order = pc.sort_indices(pool, [("group", "ascending"), ("bucket", "ascending"), ("aid", "ascending")])
    pool, pool_rows = pool.take(order), pool_rows[order.to_numpy()]
    segments: dict[tuple[str, int], tuple[int, int]] = {}
    groups, pool_buckets, pool_qids = (pool[c].to_pylist() for c in ("group", "bucket", "qid"))
    own: dict[tuple[str, int, str], int] = {}
    for i, key in enumerate(zip(groups, pool_buckets)):
        start, _ = segments.get(key, (i, i))
        segments[key] = (start, i + 1)
        own_key = (*key, pool_qids[i])
        own[own_key] = own.get(own_key, 0) + 1
    requests = (
        block.filter(pc.invert(is_pool))
        .group_by(["group", "bucket", "kind", "qid"], use_threads=False)
        .aggregate([("wanted", "sum"), ("question", "first"), ("site", "first"), ("split", "first")])
        .rename_columns({"question_first": "question", "site_first": "site", "split_first": "split"})
    )
    requests = requests.take(
        pc.sort_indices(
            requests, [("group", "ascending"), ("bucket", "ascending"), ("qid", "ascending"), ("kind", "ascending")]
        )
    )
    short_request, short_count = [], []
    draws = []  # (request row, bucket start, population, what it asks for, how many it draws)
    request_qids = requests["qid"].to_pylist()
    columns = zip(*(requests[c].to_pylist() for c in ("group", "bucket", "kind", "wanted_sum")), request_qids)
    for r, (group, bucket, kind, wanted, qid) in enumerate(columns):
        if kind == "short":
            short_request.append(r)
            short_count.append(wanted)
            continue
        start, end = segments.get((group, bucket), (0, 0))
        mine = own.get((group, bucket, qid), 0)
        take = max(0, min(wanted, end - start - mine))
        if take:
            draws.append(
                (r, start, end - start, take, min(end - start, take + mine), _hash64("draw", seed, qid, group, bucket))
            )
        if take < wanted:
            short_request.append(r)
            short_count.append(wanted - take)
    picked_pool, picked_request = [], []
    if draws:
        streams = _streams(np.array([d[5] for d in draws], dtype=np.uint64), np.array([d[4] for d in draws]))
        for (r, start, population, take, _, _), stream in zip(draws, streams):
            qid = request_qids[r]
            chosen = [start + i for i in _shuffle_head(population, stream) if pool_qids[start + i] != qid][:take]
            chosen.sort()  # by answer id
            picked_pool += chosen
            picked_request += [r] * len(chosen)
    answers = block.select(["aid", "answer", "score"]).take(pa.array(pool_rows[picked_pool], pa.int64()))
    asking = requests.select(["qid", "question", "site", "split"]).take(pa.array(picked_request, pa.int64()))
    drawn = pa.table(
        {
            "qid": asking["qid"],
            "question": asking["question"],
            "aid": answers["aid"],
            "answer": answers["answer"],
            "score": answers["score"],
            "site": asking["site"],
            "split": asking["split"],
            "short": pa.array(np.zeros(len(picked_pool), np.int64)),
        }
    )
    shortfall = shortfall_rows(requests, np.asarray(short_request, np.int64), np.asarray(short_count, np.int64))
    return pa.concat_tables([drawn.cast(NEGATIVES), shortfall])


def shortfall_rows(asking: pa.Table, rows: np.ndarray, short: np.ndarray) -> pa.Table:
    """NEGATIVES rows that carry only a shortfall: for each of `asking`'s `rows` (a table with qid, site and split)
    the negatives it fell `short` of, with no answer."""
    m = len(rows)
    lacking = asking.select(["qid", "site", "split"]).take(pa.array(rows, pa.int64()))
    return pa.table(
        {
            "qid": lacking["qid"],
            "question": pa.array([""] * m, pa.string()),
            "aid": pa.array([""] * m, pa.string()),
            "answer": pa.array([""] * m, pa.string()),
            "score": pa.array(np.zeros(m, np.int32)),
            "site": lacking["site"],
            "split": lacking["split"],
            "short": pa.array(np.asarray(short, np.int64)),
        }
    ).cast(NEGATIVES)


def count_pool_groups(pool, mode: str) -> dict[str, int]:
    """Answers per pool group, counted per batch and summed on the driver (no shuffle)."""

    def count(batch: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        groups, _ = pool_groups(batch, mode)
        counts = pc.value_counts(groups)
        return pa.table({"group": counts.field("values"), "count": counts.field("counts").cast(pa.int64())})

    sizes: dict[str, int] = {}
    for row in pool.map_batches(count, batch_format="pyarrow").take_all():
        sizes[row["group"]] = sizes.get(row["group"], 0) + row["count"]
    return sizes


_STAGES: dict[tuple, object] = {}


def _cached(cls, sizes_ref, **options):
    """One `cls` per worker process and configuration: its group sizes are fetched once, not per batch."""
    key = (
        cls.__name__,
        sizes_ref[0].hex() if hasattr(sizes_ref[0], "hex") else id(sizes_ref[0]),
        tuple(sorted(options.items())),
    )
    stage = _STAGES.get(key)
    if stage is None:
        stage = _STAGES[key] = cls(sizes_ref, **options)
    return stage


def assign_buckets(batch: pa.Table, sizes_ref, bucket_size: int) -> pa.Table:
    return _cached(AssignBuckets, sizes_ref, bucket_size=bucket_size)(batch)


def request_negatives(batch: pa.Table, sizes_ref, **options) -> pa.Table:
    return _cached(RequestNegatives, sizes_ref, **options)(batch)


def pool_and_requests(batch: pa.Table, sizes_ref, bucket_size: int, asks: str, **options) -> pa.Table:
    """A batch of pool answers as bucketed `pool` rows, and the `request` rows of those whose boolean column
    `asks` is set (positives that are pool answers too)."""
    asking = batch.drop_columns(["answer", asks]).filter(batch[asks])  # a request reads no answer text
    pool = assign_buckets(pool_rows(batch.drop_columns([asks]), options["mode"]), sizes_ref, bucket_size)
    return pa.concat_tables([pool, request_negatives(asking, sizes_ref, bucket_size=bucket_size, **options)])


def _sample_and_count(block: pa.Table, seed: int) -> tuple[pa.Table, dict]:
    """`sample_buckets`' rows, and the negatives drawn and those they fell short of (a side result). A row that
    only carries a shortfall is no negative: the build's progress line counted them among its negatives."""
    import pyarrow.compute as pc

    drawn = sample_buckets(block, seed)
    negatives = int(pc.sum(pc.equal(drawn["short"], 0)).as_py() or 0)
    return drawn, {"rows": negatives, "short": int(pc.sum(drawn["short"]).as_py() or 0)}


def negative_blocks(
    pool: tuple[list, list[int]],
    positives,
    k: float,
    seed: int,
    pool_sizes: dict[str, int],
    mode: str = "site",
    bucket_size: int = 4096,
    partitions: int = 8,
    question_text: bool = True,
    select: Callable[[pa.Table], pa.Table] | None = None,
    task_bytes: int = 32 << 20,
) -> list[tuple]:
    """`sample_negatives` over block references (with their bytes, as `pipelines.shuffle.hash_shuffle` takes
    them): for each partition, references to its negatives block, to {"rows", "short"} (its rows and the
    negatives it fell short of) and to the block's bytes, not waited for. `positives` is (block references,
    bytes) too, or the name of `pool`'s boolean column that marks them; `select` turns each pool block into pool
    rows first (inside the shuffle's map tasks, so the selection is never stored); `pool_sizes` are the answers
    per pool group of the selected rows."""
    import ray

    from pipelines.shuffle import composed, hash_shuffle

    if mode not in POOL_MODES:
        raise ValueError(f"pool mode must be one of {POOL_MODES}, got {mode!r}")
    sizes_ref = [ray.put(pool_sizes)]
    options: dict[str, Any] = {
        "sizes_ref": sizes_ref,
        "k": k,
        "seed": seed,
        "mode": mode,
        "bucket_size": bucket_size,
        "question_text": question_text,
    }
    first = [select] if select else []
    if isinstance(positives, str):
        sources = [(*pool, composed(*first, partial(pool_and_requests, asks=positives, **options)))]
    else:
        bucketed = composed(
            *first, partial(pool_rows, mode=mode), partial(assign_buckets, sizes_ref=sizes_ref, bucket_size=bucket_size)
        )
        sources = [(*pool, bucketed), (*positives, partial(request_negatives, **options))]
    return hash_shuffle(
        sources, ["group", "bucket"], partitions, _sample_and_count, {"seed": seed}, returns=2, task_bytes=task_bytes
    )


def sample_negatives(
    pool,
    positives,
    k: float,
    seed: int,
    mode: str = "site",
    bucket_size: int = 4096,
    partitions: int = 8,
    question_text: bool = True,
    pool_sizes: dict[str, int] | None = None,
):
    """Negative pairs for `positives` drawn from `pool` (both datasets of thread rows); rows with `short` > 0
    and an empty `aid` only carry shortfall counts. One shuffle: pool and requests meet by (group, bucket).

    `positives` may instead name a boolean column of `pool` that marks the positives among its answers (as in
    StackExchangeQA, where every positive is a candidate negative for other questions): the pool is then read
    once for both, where two datasets cost two passes over their source.

    `question_text=False` leaves `question` empty: the asking question's text would cross the shuffle once per
    request and the caller's next shuffle once per negative (15.7 times a positive at the paper's rate), where a
    caller that brings each question's pairs together anyway can take it from the question's positives.
    `pool_sizes` (answers per pool group, as `count_pool_groups` gives them) spares a pass over `pool` where the
    caller has counted them already."""
    import ray

    from pipelines.blocks import materialised_blocks, materialize

    if mode not in POOL_MODES:
        raise ValueError(f"pool mode must be one of {POOL_MODES}, got {mode!r}")
    pool = materialize(pool)
    sizes = count_pool_groups(pool, mode) if pool_sizes is None else pool_sizes
    marked = isinstance(positives, str)

    def blocks_and_bytes(ds) -> tuple[list, list[int]]:
        refs, _, block_bytes = materialised_blocks(ds)
        return refs, block_bytes

    results = negative_blocks(
        blocks_and_bytes(pool),
        positives if marked else blocks_and_bytes(materialize(positives)),
        k,
        seed,
        sizes,
        mode=mode,
        bucket_size=bucket_size,
        partitions=partitions,
        question_text=question_text,
    )
    return ray.data.from_arrow_refs([block for block, _, _ in results])

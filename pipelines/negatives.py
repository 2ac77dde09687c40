"""Negative answers sampled at cluster scale, without gathering the answer pool anywhere.

For each positive pair the paper adds real answers to *other* questions as negatives (15.7 per positive in
its corpus). Here every candidate answer belongs to a pool group (same site and split by default; any site;
or same site, tag and split) and, inside the group, to one of B buckets by a hash of its id, B chosen so a
bucket holds about `bucket_size` answers. Each positive asks for its negatives bucket by bucket (buckets drawn
uniformly by a generator seeded with (seed, answer id)); the requests and the pool meet in one shuffle keyed
by (group, bucket), and each bucket draws, without replacement, from its answers that do not belong to the
asking question. So:

- no node ever holds more than a bucket of answers, whatever the corpus size;
- a question never gets its own answers, nor the same negative twice (buckets split a group, and a question
  draws from one group);
- the result depends on (seed, question id, answer ids) only, not on partitioning or worker count;
- k may be fractional (the paper's 15.71): each positive asks for floor(k) or floor(k)+1 negatives, seeded;
- only one shuffle: requests are made row by row, and group sizes are counted per batch.

A bucket too small for what is asked gives all it has; the shortfall is reported.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pyarrow as pa

POOL_MODES = ("site", "any", "tag")

REQUESTS = pa.schema([
    ("kind", pa.string()), ("group", pa.string()), ("bucket", pa.int64()), ("qid", pa.string()),
    ("aid", pa.string()), ("question", pa.string()), ("answer", pa.string()), ("score", pa.int32()),
    ("wanted", pa.int64()), ("site", pa.string()), ("split", pa.string()),
])
NEGATIVES = pa.schema([
    ("qid", pa.string()), ("question", pa.string()), ("aid", pa.string()), ("answer", pa.string()),
    ("score", pa.int32()), ("site", pa.string()), ("split", pa.string()), ("short", pa.int64()),
])


def _hash64(*parts) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "big")


def pool_groups(site: str, split: str, tags: list[str] | None, mode: str) -> list[str]:
    """The pool groups an answer (of a question with `tags`) belongs to."""
    if mode == "site":
        return [f"{split}|{site}"]
    if mode == "any":
        return [split]
    if mode == "tag":
        return [f"{split}|{site}|{tag}" for tag in (tags or [])]
    raise ValueError(f"pool mode must be one of {POOL_MODES}, got {mode!r}")


def bucket_of(aid: str, buckets: int) -> int:
    return _hash64("bucket", aid) % buckets


def buckets_for(count: int, bucket_size: int) -> int:
    return max(1, math.ceil(count / bucket_size))


def pool_rows(batch: pa.Table, mode: str) -> pa.Table:
    """Candidate answers as `pool` rows keyed by group (one row per group; several in tag mode)."""
    rows = []
    for r in batch.to_pylist():
        for group in pool_groups(r["site"], r["split"], r["tags"], mode):
            rows.append({"kind": "pool", "group": group, "bucket": -1, "qid": r["qid"], "aid": r["aid"],
                         "question": "", "answer": r["answer"], "score": r["score"], "wanted": 0,
                         "site": r["site"], "split": r["split"]})
    return pa.Table.from_pylist(rows, schema=REQUESTS)


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


class RequestNegatives:
    """Positive pairs to `request` rows: how many negatives each wants from which (group, bucket).

    Works row by row (no shuffle): a positive's count, floor(k) or floor(k)+1, is seeded by its answer id;
    its buckets by (seed, answer id); the pool group, which must be the same for all positives of a question
    (tag mode), by (seed, question id). Requests of one question that land in the same bucket are merged
    there and drawn together, without replacement.
    """

    def __init__(self, sizes_ref, k: float, seed: int, mode: str, bucket_size: int):
        import ray

        sizes = sizes_ref[0]
        self.sizes = ray.get(sizes) if isinstance(sizes, ray.ObjectRef) else sizes
        self.k, self.seed, self.mode, self.bucket_size = k, seed, mode, bucket_size

    def wanted(self, aid: str) -> int:
        whole, frac = int(self.k), self.k - int(self.k)
        return whole + (1 if frac and (_hash64("k", self.seed, aid) / 2**64) < frac else 0)

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = []
        for row in batch.select(["qid", "aid", "question", "site", "split", "tags"]).to_pylist():
            qid, site, split = row["qid"], row["site"], row["split"]
            wanted = self.wanted(row["aid"])
            choices = [g for g in sorted(set(pool_groups(site, split, row["tags"], self.mode))) if self.sizes.get(g)]
            if not choices or not wanted:
                if wanted:
                    out.append({"kind": "short", "group": "", "bucket": -1, "qid": qid, "aid": "", "question": "",
                                "answer": "", "score": 0, "wanted": wanted, "site": site, "split": split})
                continue
            group_rng = np.random.default_rng([self.seed, _hash64("group", qid) >> 1])
            pool_group = choices[int(group_rng.integers(len(choices)))]  # one group per question
            buckets = buckets_for(self.sizes[pool_group], self.bucket_size)
            rng = np.random.default_rng([self.seed, _hash64("buckets", row["aid"]) >> 1])
            counts = np.bincount(rng.integers(0, buckets, size=wanted), minlength=buckets)
            out.extend({"kind": "request", "group": pool_group, "bucket": int(b), "qid": qid, "aid": "",
                        "question": row["question"], "answer": "", "score": 0, "wanted": int(n), "site": site,
                        "split": split} for b, n in enumerate(counts) if n)
        return pa.Table.from_pylist(out, schema=REQUESTS)


def sample_buckets(block: pa.Table, seed: int) -> pa.Table:
    """`sample_bucket` over every (group, bucket) of a block that holds whole buckets (after a shuffle by
    them)."""
    from pipelines.blocks import map_groups_in_block

    return map_groups_in_block(block, ["group", "bucket"], lambda rows: _bucket_negatives(rows, seed), NEGATIVES)


def sample_bucket(group: pa.Table, seed: int) -> pa.Table:
    """The pool rows and request rows of one (group, bucket) to negative pairs."""
    return pa.Table.from_pylist(_bucket_negatives(group.to_pylist(), seed), schema=NEGATIVES)


def _bucket_negatives(rows: list[dict], seed: int) -> list[dict]:
    kinds = [r["kind"] for r in rows]
    pool = sorted((r for r, k in zip(rows, kinds) if k == "pool"), key=lambda r: r["aid"])
    merged: dict[tuple[str, str], dict] = {}
    for r, k in zip(rows, kinds):
        if k != "pool":
            key = (r["kind"], r["qid"])
            if key in merged:
                merged[key]["wanted"] += r["wanted"]
            else:
                merged[key] = dict(r)
    requests = [merged[key] for key in sorted(merged, key=lambda kq: (kq[1], kq[0]))]
    pool_qids = [r["qid"] for r in pool]
    own_answers: dict[str, int] = {}
    for qid in pool_qids:
        own_answers[qid] = own_answers.get(qid, 0) + 1
    out = []
    for request in requests:
        if request["kind"] == "short":
            out.append({"qid": request["qid"], "question": "", "aid": "", "answer": "", "score": 0,
                        "site": request["site"], "split": request["split"], "short": request["wanted"]})
            continue
        qid, wanted = request["qid"], request["wanted"]
        own = own_answers.get(qid, 0)
        take = min(wanted, len(pool) - own)
        rng = np.random.default_rng([seed, _hash64("draw", qid, request["group"], request["bucket"]) >> 1])
        if take <= 0:
            chosen = []
        elif own == 0:
            chosen = rng.choice(len(pool), size=take, replace=False)
        else:
            # Draw a few more than needed and drop the question's own answers: O(wanted), not O(pool).
            drawn = rng.choice(len(pool), size=min(len(pool), take + own), replace=False)
            chosen = [i for i in drawn if pool_qids[i] != qid][:take]
        for index in sorted(chosen, key=lambda i: pool[i]["aid"]):
            answer = pool[index]
            out.append({"qid": request["qid"], "question": request["question"], "aid": answer["aid"],
                        "answer": answer["answer"], "score": answer["score"], "site": request["site"],
                        "split": request["split"], "short": 0})
        if take < request["wanted"]:
            out.append({"qid": request["qid"], "question": "", "aid": "", "answer": "", "score": 0,
                        "site": request["site"], "split": request["split"], "short": request["wanted"] - take})
    return out


def count_pool_groups(pool, mode: str) -> dict[str, int]:
    """Answers per pool group, counted per batch and summed on the driver (no shuffle)."""
    def count(batch: pa.Table) -> pa.Table:
        counts: dict[str, int] = {}
        for site, split, tags in zip(*(batch.column(c).to_pylist() for c in ("site", "split", "tags"))):
            for group in pool_groups(site, split, tags, mode):
                counts[group] = counts.get(group, 0) + 1
        return pa.table({"group": list(counts), "count": list(counts.values())})

    sizes: dict[str, int] = {}
    for row in pool.map_batches(count, batch_format="pyarrow").take_all():
        sizes[row["group"]] = sizes.get(row["group"], 0) + row["count"]
    return sizes


_STAGES: dict[tuple, object] = {}


def _cached(cls, sizes_ref, **options):
    """One `cls` per worker process and configuration: its group sizes are fetched once, not per batch."""
    key = (cls.__name__, sizes_ref[0].hex() if hasattr(sizes_ref[0], "hex") else id(sizes_ref[0]),
           tuple(sorted(options.items())))
    stage = _STAGES.get(key)
    if stage is None:
        stage = _STAGES[key] = cls(sizes_ref, **options)
    return stage


def assign_buckets(batch: pa.Table, sizes_ref, bucket_size: int) -> pa.Table:
    return _cached(AssignBuckets, sizes_ref, bucket_size=bucket_size)(batch)


def request_negatives(batch: pa.Table, sizes_ref, **options) -> pa.Table:
    return _cached(RequestNegatives, sizes_ref, **options)(batch)


def sample_negatives(pool, positives, k: float, seed: int, mode: str = "site", bucket_size: int = 4096,
                     partitions: int = 8):
    """Negative pairs for `positives` drawn from `pool` (both datasets of thread rows); rows with `short` > 0
    and an empty `aid` only carry shortfall counts. One shuffle: pool and requests meet by (group, bucket)."""
    import ray

    if mode not in POOL_MODES:
        raise ValueError(f"pool mode must be one of {POOL_MODES}, got {mode!r}")
    sizes_ref = [ray.put(count_pool_groups(pool, mode))]
    # Task functions, not actor pools: actors would hold their CPUs through the shuffle that follows.
    bucketed = pool.map_batches(pool_rows, batch_format="pyarrow", fn_kwargs={"mode": mode}).map_batches(
        assign_buckets, batch_format="pyarrow", fn_kwargs={"sizes_ref": sizes_ref, "bucket_size": bucket_size})
    requests = positives.map_batches(
        request_negatives, batch_format="pyarrow",
        fn_kwargs={"sizes_ref": sizes_ref, "k": k, "seed": seed, "mode": mode, "bucket_size": bucket_size})
    # groupby().map_groups(), with the buckets of a partition sampled in one call.
    return bucketed.union(requests).repartition(partitions, keys=["group", "bucket"]).map_batches(
        sample_buckets, batch_size=None, batch_format="pyarrow", fn_kwargs={"seed": seed})

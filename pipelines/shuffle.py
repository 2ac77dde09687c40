"""A hash shuffle of Arrow blocks in Ray tasks, whose reducers may return more than their block.

What `ds.repartition(n, keys=[...]).map_batches(fn, batch_size=None)` does (Ray Data's SHUFFLE_V2: map tasks
cut their blocks into one shard per partition, a reduce task per partition takes its shards and runs `fn` over
them), written as plain Ray tasks because the StackExchangeQA build needs what a Ray Data operator cannot give:

- **Side results.** A reducer may return several objects (`returns`): the thread assembler returns its block and
  the block's funnel counts and attribution rows, the negative sampler its block and its shortfall, the pairs'
  ordering its block and its first question and counts. Each of these was a pass of its own over the
  materialised output (a Ray Data map has one output), 5-7 s at 1M posts on 2 cores.
- **Work on the way in.** Each source's blocks go through a `prepare` function inside the map task before they
  are cut (selecting rows, reshaping them), so what a shuffle reads is never stored a second time.
- **Less overhead.** Shards stay Arrow tables in the object store (Ray Data encodes each as a compressed Arrow
  IPC stream and decodes it again) and run in the build's warm workers (Ray Data starts its shuffle's map tasks
  in a worker pool of their own). On the 1M-post bench dump, the thread shuffle took 8.6-8.9 s against
  10.2-12.1 s (three runs each, 2 CPUs).

It keeps Ray Data's shape and limits: a partition is one block, and the shards in flight number map tasks x
partitions. Map tasks take consecutive blocks, as many as keep that product under `MAX_SHARDS` (each shard is a
reference the driver tracks), which at Stack Overflow's size (100 GB of XML: 6,400 blocks of 16 MB, 4,000
partitions) gathers 26 blocks into a map task. Rows reach their partition by a hash of their keys that every
process computes alike (pandas' SipHash with its fixed key, as Ray Data's), and a partition holds its rows in
the order of the sources, their blocks and rows: the same input gives the same blocks on every run. Tasks are
retried and their outputs rebuilt from lineage when a worker dies, as any Ray task's.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

MAX_SHARDS = 1_000_000

Prepare = Callable[[pa.Table], pa.Table] | None


def _in_turn(functions: tuple, table: pa.Table) -> pa.Table:
    for function in functions:
        table = function(table)
    return table


def composed(*functions: Callable[[pa.Table], pa.Table]) -> Callable[[pa.Table], pa.Table]:
    """`functions` applied in turn, as one picklable function (a `prepare` of several steps)."""
    return partial(_in_turn, functions)


def partition_of(table: pa.Table, keys: Sequence[str], partitions: int) -> np.ndarray:
    """Each row's partition, from a hash of its `keys` that is the same in every process and on every run."""
    import pandas as pd

    if partitions == 1 or table.num_rows == 0:
        return np.zeros(table.num_rows, dtype=np.int64)
    hashes = pd.util.hash_pandas_object(table.select(list(keys)).to_pandas(), index=False).to_numpy()
    return (hashes % np.uint64(partitions)).astype(np.int64)


def cut_into_partitions(tables: Sequence[pa.Table], keys: Sequence[str], partitions: int) -> list[pa.Table]:
    """The rows of `tables` (one schema) as `partitions` tables, each holding its rows in their order."""
    pieces: list[list[pa.Table]] = [[] for _ in range(partitions)]
    for table in tables:
        if table.num_rows == 0:
            continue
        where = partition_of(table, keys, partitions)
        counts = np.bincount(where, minlength=partitions)
        ordered = table.take(pa.array(np.argsort(where, kind="stable"), pa.int64()))
        for partition, (start, count) in enumerate(zip(np.cumsum(counts) - counts, counts)):
            if count:
                pieces[partition].append(ordered.slice(int(start), int(count)))
    schema = tables[0].schema
    return [pa.concat_tables(p) if len(p) > 1 else p[0] if p else schema.empty_table() for p in pieces]


def _map(prepare: Prepare, keys: Sequence[str], partitions: int, *blocks: pa.Table):
    from pipelines.blocks import trim_when_idle

    trim_when_idle(now=True)
    prepared = [prepare(block) if prepare else block for block in blocks]
    cut = cut_into_partitions(prepared, keys, partitions)
    return cut[0] if partitions == 1 else tuple(cut)


def _reduce(reduce: Callable, kwargs: dict, *shards: pa.Table):
    # "default" promotion: a source's block may type an all-null column as null where another's has its type.
    block = pa.concat_tables(shards, promote_options="default") if len(shards) > 1 else shards[0]
    return reduce(block, **kwargs)


def blocks_per_map_task(blocks: int, partitions: int, max_shards: int = MAX_SHARDS) -> int:
    """Consecutive blocks a map task takes so that map tasks x partitions stays under `max_shards`."""
    return max(1, math.ceil(blocks * partitions / max_shards))


def hash_shuffle(sources: Sequence[tuple[Sequence, Prepare]], keys: Sequence[str], partitions: int,
                 reduce: Callable[..., pa.Table | tuple], reduce_kwargs: dict | None = None, returns: int = 1,
                 max_shards: int = MAX_SHARDS) -> list:
    """Rows of every source (block refs and the function that prepares each block, or None) brought together by
    `keys` into `partitions` blocks, each passed whole to `reduce(block, **reduce_kwargs)` in a task of its own.

    Returns, for each partition in order, the reference to `reduce`'s result, or a tuple of `returns` references
    where it returns as many objects. Nothing is waited for: tasks run as their inputs come. A source's blocks
    may be released by the caller once this returns: the map tasks hold them until they have read them. Prepared
    blocks must share one schema."""
    import ray

    if partitions < 1:
        raise ValueError(f"a shuffle needs at least one partition, got {partitions}")
    by = ",".join(keys)  # names the tasks (and their workers' process titles) as Ray Data names its shuffle's
    cut = ray.remote(num_cpus=1, num_returns=partitions)(_map).options(name=f"ShuffleMap({by})")
    total = sum(len(blocks) for blocks, _ in sources)
    per_task = blocks_per_map_task(total, partitions, max_shards)
    shards = []  # a list per map task of its `partitions` shards
    for blocks, prepare in sources:
        for start in range(0, len(blocks), per_task):
            out = cut.remote(prepare, list(keys), partitions, *blocks[start:start + per_task])
            shards.append([out] if partitions == 1 else out)
    if not shards:
        raise ValueError("a shuffle needs at least one block to read")
    gather = ray.remote(num_cpus=1, num_returns=returns)(_reduce).options(
        name=f"ShuffleReduce({by})->{getattr(reduce, '__name__', 'reduce')}")
    return [gather.remote(reduce, reduce_kwargs or {}, *(task[p] for task in shards)) for p in range(partitions)]

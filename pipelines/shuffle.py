"""A hash shuffle of Arrow blocks in Ray tasks, whose reducers may return more than their block.

What `ds.repartition(n, keys=[...]).map_batches(fn, batch_size=None)` does (Ray Data's SHUFFLE_V2: map tasks
cut their blocks into one shard per partition, a reduce task per partition takes its shards and runs `fn` over
them), written as plain Ray tasks because the StackExchangeQA build needs what a Ray Data operator cannot give:

- **Side results.** A reducer may return several objects (`returns`): the thread assembler returns its block and
  the block's funnel counts and attribution rows, the negative sampler its block and its shortfall, the pairs'
  ordering its block and its first question and counts. Each of these was a pass of its own over the
  materialised output (a Ray Data map has one output).
- **Work on the way in.** Each source's blocks go through a `prepare` function inside the map task before they
  are cut (selecting rows, reshaping them), so what a shuffle reads is never stored a second time.
- **Less overhead.** Shards stay Arrow tables in the object store (Ray Data encodes each as a compressed Arrow
  IPC stream and decodes it again) and run in the build's warm workers (Ray Data starts its shuffle's map tasks
  in a worker pool of their own). `bench/stackexchangeqa.py` times the build's stages against Ray Data's shuffle
  (docs/bench/stackexchangeqa*.json).

It keeps Ray Data's shape and limits: a partition is one block, and the shards in flight number map tasks x
partitions. A map task reads consecutive blocks of one source until they hold `task_bytes` (the build passes
`--partition-mb`, as it sets Ray Data's `shuffle_input_batch_bytes`), and never so few that map tasks x partitions
passes `MAX_SHARDS` (each shard is a reference the driver tracks): at Stack Overflow's size (100 GB of XML, 6,400
blocks of 16 MB, 4,000 partitions) that is 26 blocks a map task. As in Ray Data, a shard under Ray's inline
limit (100 KB) is held in the driver's memory rather than the object store; at 1M posts a shard is about 1 MB.
Rows reach their partition by a hash of their keys that every process computes alike (pandas' SipHash with its
fixed key, as Ray Data's), and a partition holds its rows in the order of the sources, their blocks and rows:
the same input gives the same blocks on every run. Tasks are retried and their outputs rebuilt from lineage
when a worker dies, as any Ray task's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import pyarrow as pa

MAX_SHARDS = 1_000_000  # shard references in flight in one shuffle (the driver tracks each)

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
    # Arrow-backed columns: the same hashes as NumPy-backed ones, without making a Python string per row (2.5-3x
    # faster), and an integer column with nulls stays integer (NumPy-backed, it would turn float).
    columns = table.select(list(keys)).to_pandas(types_mapper=pd.ArrowDtype)
    hashes = pd.util.hash_pandas_object(columns, index=False).to_numpy()
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
    return [
        pa.concat_tables(p, promote_options="default") if len(p) > 1 else p[0] if p else schema.empty_table()
        for p in pieces
    ]


def _map(prepare: Prepare, keys: Sequence[str], partitions: int, *blocks: pa.Table):
    from pipelines.blocks import trim_when_idle

    trim_when_idle(now=True)
    prepared = [prepare(block) if prepare else block for block in blocks]
    cut = cut_into_partitions(prepared, keys, partitions)
    return cut[0] if partitions == 1 else tuple(cut)


def _reduce(reduce: Callable, kwargs: dict, returns: int, *shards: pa.Table):
    # "default" promotion: a source's block may type an all-null column as null where another's has its type.
    block = pa.concat_tables(shards, promote_options="default") if len(shards) > 1 else shards[0]
    results = reduce(block, **kwargs)
    results = (results,) if returns == 1 else tuple(results)
    return (*results, results[0].nbytes)  # the block's bytes: how the next shuffle gathers blocks into map tasks


def map_tasks(sizes: Sequence[int], partitions: int, task_bytes: int, max_shards: int = MAX_SHARDS) -> list[range]:
    """The blocks (positions in `sizes`, their bytes) each map task takes: consecutive blocks until they hold
    `task_bytes` (as Ray Data gathers a shuffle's input to `shuffle_input_batch_bytes`: fewer, larger shards), and
    never fewer blocks than keep map tasks x partitions under `max_shards`."""
    at_least = max(1, math.ceil(len(sizes) * partitions / max_shards))
    tasks, start, held = [], 0, 0
    for position, size in enumerate(sizes):
        held += size
        if (position + 1 - start >= at_least and held >= task_bytes) or position == len(sizes) - 1:
            tasks.append(range(start, position + 1))
            start, held = position + 1, 0
    return tasks


def hash_shuffle(
    sources: Sequence[tuple[Sequence, Sequence[int], Prepare]],
    keys: Sequence[str],
    partitions: int,
    reduce: Callable[..., pa.Table | tuple],
    reduce_kwargs: dict | None = None,
    returns: int = 1,
    task_bytes: int = 32 << 20,
    max_shards: int = MAX_SHARDS,
    map_resources: dict | None = None,
    reduce_resources: dict | None = None,
    map_done: list | None = None,
) -> list[tuple]:
    """Rows of every source (block references, their bytes, and the function that prepares each block, or None)
    brought together by `keys` into `partitions` blocks, each passed whole to `reduce(block, **reduce_kwargs)` in a
    task of its own; a map task reads about `task_bytes` of a source's blocks (`map_tasks`).

    Returns, for each partition in order, a tuple of references: the `returns` objects `reduce` returns (its
    block first), then the block's bytes. Nothing is waited for: tasks run as their inputs come. A source's blocks
    may be released by the caller once this returns: the map tasks hold them until they have read them. Prepared
    blocks must share one schema. `map_resources` and `reduce_resources`: Ray resources each map or reduce task
    asks for besides its CPU (`{"num_gpus": 1}` where `prepare` or `reduce` runs a model). `map_done`, where given,
    gets a reference per map task that is ready once the task has ended (its first shard): what a caller whose
    `prepare` is the long part (a model embedding every text) counts progress by, reduce tasks ending only after
    every map task."""
    import ray

    if partitions < 1:
        raise ValueError(f"a shuffle needs at least one partition, got {partitions}")
    by = ",".join(keys)  # names the tasks (and their workers' process titles) as Ray Data names its shuffle's
    cut = ray.remote(num_cpus=1, num_returns=partitions)(_map).options(
        name=f"ShuffleMap({by})", **(map_resources or {})
    )
    total = sum(len(blocks) for blocks, _, _ in sources)
    shards = []  # a list per map task of its `partitions` shards
    for blocks, sizes, prepare in sources:
        if len(sizes) != len(blocks):
            raise ValueError(f"{len(blocks)} blocks but {len(sizes)} sizes")
        for task in map_tasks(sizes, partitions, task_bytes, max(1, max_shards * len(blocks) // max(1, total))):
            out = cut.remote(prepare, list(keys), partitions, *(blocks[i] for i in task))
            shards.append([out] if partitions == 1 else out)
            if map_done is not None:
                map_done.append(shards[-1][0])
    if not shards:
        raise ValueError("a shuffle needs at least one block to read")
    gather = ray.remote(num_cpus=1, num_returns=returns + 1)(_reduce).options(
        name=f"ShuffleReduce({by})->{getattr(reduce, '__name__', 'reduce')}", **(reduce_resources or {})
    )
    return [
        gather.remote(reduce, reduce_kwargs or {}, returns, *(task[p] for task in shards)) for p in range(partitions)
    ]

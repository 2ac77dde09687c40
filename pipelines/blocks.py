"""Group-wise work on blocks that hold whole groups, in bounded memory.

After `ds.repartition(n, keys=[...])` (Ray's hash shuffle, which keeps each partition one block) every group
lies whole inside one block. `map_groups_in_block` then does what `groupby().map_groups()` does, but with one
call per chunk of groups instead of one per group (threads average three posts: per-group calls cost more
than the work), and converts to Python objects a chunk at a time, so a worker's peak does not grow with its
partition.

Python and Arrow keep freed memory for reuse, and a Ray worker lives on after its task: without
`release_unused_memory` each worker that once held a big partition keeps its high-water mark for the rest of
the job (measured here: 465 MB held after freeing a 64 MB dump piece's work, 212 MB after the release).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.allocator import release_free_heap


def release_unused_memory() -> None:
    """Hand freed heap back to the operating system: Arrow's pool, then glibc's (where there is one)."""
    pa.default_memory_pool().release_unused()
    release_free_heap()


_IDLE_TRIMMER: threading.Thread | None = None


def trim_when_idle(interval: float = 0.5, now: bool = False) -> None:
    """Once per process, a daemon thread that calls `release_unused_memory` each time the process goes idle.

    A Ray worker's task can only release what it freed before returning: its output block is handed to Ray after
    that, and a worker then idles, between stages or while other workers run, holding the heap that block and
    the task's last allocations left free (idle workers held 110-280 MB each above their imports at the peak of a
    1M-post build, 1.2 GB in all). Called by the stages that run in workers; the thread wakes every `interval`
    seconds and trims once after the process used under 5% of a CPU for an interval, so it stays out of the way
    of the work. `now`: also release at once, for a task that follows another in the same worker (a shuffle's
    reducer), which never idles between them and would otherwise keep the first one's freed heap."""
    global _IDLE_TRIMMER
    if now:
        release_unused_memory()
    if _IDLE_TRIMMER is None:
        _IDLE_TRIMMER = threading.Thread(
            target=_trim_on_idle, args=(interval, release_unused_memory), name="trim-when-idle", daemon=True
        )
        _IDLE_TRIMMER.start()


def _trim_on_idle(interval: float, trim: Callable[[], None], stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()  # a worker's trimmer runs for the life of its process
    last, trimmed = time.process_time(), True
    while not stop.wait(interval):
        now = time.process_time()
        busy, last = now - last > 0.05 * interval, now
        if busy:
            trimmed = False
        elif not trimmed:
            trim()
            trimmed, last = True, time.process_time()


def differs_from_previous(table: pa.Table, keys: list[str]) -> np.ndarray:
    """True for each row whose `keys` differ from the row before (and for the first row); nulls equal nulls."""
    n = table.num_rows
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
    for key in keys:
        column = table.column(key)
        if n > 1:
            differs = pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, n - 1)), True)
            nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
            change[1:] |= differs.to_numpy(zero_copy_only=False) & ~(nulls[1:] & nulls[:-1])
    return change


def map_groups_in_block(
    block: pa.Table, keys: list[str], fn: Callable[[list[dict]], list[dict]], schema: pa.Schema, chunk_rows: int = 8192
) -> pa.Table:
    """`fn(rows of one group) -> output rows`, over every group of `block` (grouped by `keys`), in key order.

    Rows are sorted by the keys (stable, so the order within a group is the block's), cut into chunks of
    about `chunk_rows` at group boundaries, and only one chunk is Python objects at a time.
    """
    if block.num_rows == 0:
        return schema.empty_table()
    order = pc.sort_indices(block, [(k, "ascending") for k in keys])
    block = block.take(order)
    starts = np.flatnonzero(differs_from_previous(block, keys))  # group starts
    outputs: list[pa.Table] = []
    chunk_start = 0
    while chunk_start < len(starts):
        first = starts[chunk_start]
        chunk_end = int(np.searchsorted(starts, first + chunk_rows, side="left"))
        chunk_end = max(chunk_end, chunk_start + 1)
        last = starts[chunk_end] if chunk_end < len(starts) else block.num_rows
        rows = block.slice(first, last - first).to_pylist()
        bounds = list(starts[chunk_start:chunk_end] - first) + [last - first]
        out: list[dict] = []
        for a, b in itertools.pairwise(bounds):
            out.extend(fn(rows[a:b]))
        outputs.append(pa.Table.from_pylist(out, schema=schema))
        chunk_start = chunk_end
    del block
    result = pa.concat_tables(outputs)
    release_unused_memory()
    return result


def wait_for_free_cpu(wait_s: float = 2.0, poll_s: float = 0.01) -> bool:
    """Whether Ray counts a CPU free, waiting up to `wait_s` for one: an actor pool's CPUs come back some tens of
    milliseconds after its stage has ended (22 ms measured after tokenising WikiQA's train split)."""
    import ray

    deadline = time.monotonic() + wait_s
    while not ray.available_resources().get("CPU"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def materialize(ds, wait_s: float = 2.0):
    """`ds.materialize()`, started once the stage before it has given back its CPUs, or with one line saying why
    it may wait: no CPU of the cluster free for `wait_s` (a training job holding them all).

    Ray Data's own check of this ("The Ray cluster currently does not have any available CPUs. The Dataset job
    will hang ...") also runs as each materialisation ends, on the finished blocks, while the stage's own actor
    pool still holds its CPUs: it came now and then after a tokenisation's or a build's stage that did not hang.
    The jobs (without --verbose) keep that line off the console (`runtime.ray_env.NoFreeCpuFilter`) and say this
    one instead."""
    _wait_for_free_cpu_or_say(wait_s)
    return ds.materialize()


def _wait_for_free_cpu_or_say(wait_s: float) -> None:
    if not wait_for_free_cpu(wait_s):
        print(
            f"[ray] no CPU of the Ray cluster has been free for {wait_s:g} s: the next stage starts once one is "
            "(`ray status` shows what holds them)",
            file=sys.stderr,
            flush=True,
        )


def materialize_saying_progress(ds, say: Callable[[str], None], what: str, total: int | None = None, every_s=30.0):
    """`materialize(ds)`, saying every `every_s` how many rows it has made (of `total`, with a rate and an ETA), and
    at the end how many in how long; work done in less than `every_s` says nothing. The rows are counted from the
    finished blocks' metadata as Ray Data hands them over, in order (a block at a time: a read Parquet file is
    one), and the result holds the same blocks, so it is the dataset `materialize` gives."""
    import ray

    _wait_for_free_cpu_or_say(2.0)
    refs, rows, started = [], 0, time.monotonic()
    said_at = started
    for bundle in ds.iter_internal_ref_bundles():
        for entry in bundle.blocks:
            refs.append(entry.ref)
            rows += entry.metadata.num_rows or 0
        now = time.monotonic()
        if now - said_at >= every_s and not (total and rows >= total):  # the last line says the whole
            took = now - started
            of = f" of {total:,}" if total else ""
            eta = f", ETA {took / rows * (total - rows):,.0f} s" if total and rows and total > rows else ""
            say(f"{what}: {rows:,}{of} rows in {took:,.0f} s ({rows / took:,.0f} rows/s){eta}")
            said_at = now
    took = time.monotonic() - started
    if took >= every_s:
        say(f"{what}: {rows:,} rows in {took:,.0f} s ({rows / took:,.0f} rows/s)")
    if not refs:
        return ds.materialize()  # no block: Ray Data's own empty dataset, with its schema
    return ray.data.from_arrow_refs(refs)


def wait_saying_progress(refs: list, say: Callable[[str], None], what: str, every_s: float = 30.0) -> None:
    """Until every one of `refs` (Ray object references, not fetched) is ready, say every `every_s` how many are,
    in how long, and when the rest should be: "12 of 24 WHAT in 120 s, ETA 120 s". Work done before `every_s`
    has passed says nothing."""
    import ray

    pending, total = list(refs), len(refs)
    started = time.monotonic()
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=every_s, fetch_local=False)
        if pending:
            done, took = total - len(pending), time.monotonic() - started
            eta = f", ETA {took / done * len(pending):,.0f} s" if done else ""
            say(f"{done:,} of {total:,} {what} in {took:,.0f} s{eta}")


def materialised_blocks(ds) -> tuple[list, list[int], list[int]]:
    """A materialised Ray Data dataset's block references, with each block's rows and bytes from its metadata (no
    task reads the blocks to count them)."""
    refs, rows, sizes = [], [], []
    for bundle in ds.iter_internal_ref_bundles():
        for entry in bundle.blocks:
            refs.append(entry.ref)
            rows.append(entry.metadata.num_rows or 0)
            sizes.append(entry.metadata.size_bytes or 0)
    return refs, rows, sizes

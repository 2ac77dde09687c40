"""Group-wise work inside shuffled blocks, against a plain Python grouping."""

import random

import pyarrow as pa

from pipelines.blocks import map_groups_in_block, release_unused_memory

OUT = pa.schema([("site", pa.string()), ("thread", pa.int64()), ("n", pa.int64()), ("ids", pa.list_(pa.int64()))])


def _summary(rows):
    return [{"site": rows[0]["site"], "thread": rows[0]["thread"], "n": len(rows), "ids": [r["id"] for r in rows]}]


def test_every_group_whole_and_once_whatever_the_chunk_size():
    rng = random.Random(3)
    rows = [
        {"site": rng.choice(["a", "b", None]), "thread": rng.choice([1, 2, 3, 10, None]), "id": i} for i in range(500)
    ]
    block = pa.Table.from_pylist(rows)
    expected = {}
    for r in rows:  # the block's order within a group is kept
        expected.setdefault((r["site"], r["thread"]), []).append(r["id"])
    for chunk_rows in (1, 7, 64, 10_000):
        out = map_groups_in_block(block, ["site", "thread"], _summary, OUT, chunk_rows=chunk_rows).to_pylist()
        got = {(r["site"], r["thread"]): r["ids"] for r in out}
        assert len(out) == len(expected) and got == expected, chunk_rows
        assert sum(r["n"] for r in out) == 500


def test_empty_block_and_memory_release():
    assert (
        map_groups_in_block(
            pa.table(
                {"site": pa.array([], pa.string()), "thread": pa.array([], pa.int64()), "id": pa.array([], pa.int64())}
            ),
            ["site", "thread"],
            _summary,
            OUT,
        ).num_rows
        == 0
    )
    release_unused_memory()  # safe to call anywhere, any number of times


def test_workers_use_the_allocators_that_return_memory(ray_local, monkeypatch):
    from runtime.ray_env import WORKER_ENV, worker_env

    @ray_local.remote
    def backend():
        import os

        import pyarrow as pa

        return pa.default_memory_pool().backend_name, os.environ.get("MALLOC_ARENA_MAX")

    assert ray_local.get(backend.remote()) == ("system", WORKER_ENV["MALLOC_ARENA_MAX"])
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")  # a job's own setting wins
    assert worker_env() == {"ARROW_DEFAULT_MEMORY_POOL": "system"}


def test_idle_trimmer_trims_once_each_time_the_process_goes_idle():
    """The worker-side trimmer: nothing while the process works, one trim when it falls idle, none while it stays
    idle, and one again after the next spell of work."""
    import threading
    import time

    from pipelines.blocks import _trim_on_idle

    def work(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    trims, stop = [], threading.Event()
    thread = threading.Thread(target=_trim_on_idle, args=(0.1, lambda: trims.append(1), stop), daemon=True)
    thread.start()
    try:
        time.sleep(0.35)
        assert trims == []  # idle from the start: nothing was freed by work yet
        work(0.5)
        assert trims == []
        time.sleep(0.5)
        assert trims == [1]
        work(0.3)
        time.sleep(0.5)
        assert trims == [1, 1]
    finally:
        stop.set()
        thread.join()

"""Group-wise work inside shuffled blocks, against a plain Python grouping."""

import logging
import random
import re
import threading
import time

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


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _cpus_held_until(seconds: float | None):
    """An actor holding every CPU of the local Ray, let go after `seconds` (as an actor pool's are some
    milliseconds after its stage ends), or never."""
    import ray

    @ray.remote
    class Holder:
        def ready(self):
            return True

    holder = Holder.options(num_cpus=ray.cluster_resources()["CPU"]).remote()
    ray.get(holder.ready.remote())
    if seconds is not None:
        threading.Timer(seconds, ray.kill, args=(holder,)).start()
    return holder


def test_materialize_waits_for_the_stage_before_to_give_back_its_cpus(ray_local):
    import ray
    from ray.util import debug

    from pipelines.blocks import materialize

    debug._logged.discard("cpu_warning")  # Ray Data warns once a process
    seen = _Warnings()
    logging.getLogger("ray.data.dataset").addHandler(seen)
    try:
        _cpus_held_until(0.3)
        out = materialize(ray.data.range(8))
    finally:
        logging.getLogger("ray.data.dataset").removeHandler(seen)
    assert out.count() == 8
    assert not [m for m in seen.messages if "available CPUs" in m], seen.messages


def test_materialize_says_so_when_no_cpu_comes_free(ray_local, capsys):
    import ray

    from pipelines.blocks import materialize

    _cpus_held_until(1.0)
    out = materialize(ray.data.range(8), wait_s=0.2)
    assert out.count() == 8
    assert "[ray] no CPU of the Ray cluster has been free for 0.2 s" in capsys.readouterr().err


def test_wait_for_free_cpu_gives_up_when_the_cpus_stay_taken(ray_local):
    import ray

    from pipelines.blocks import wait_for_free_cpu

    holder = _cpus_held_until(None)
    try:
        started = time.monotonic()
        assert not wait_for_free_cpu(wait_s=0.2)
        assert time.monotonic() - started >= 0.2
    finally:
        ray.kill(holder)
    assert wait_for_free_cpu(wait_s=5)


def test_waiting_on_tasks_says_how_many_are_done_and_when_the_rest_should_be(ray_local):
    import ray

    from pipelines.blocks import wait_saying_progress

    @ray.remote(num_cpus=0)
    def sleep(seconds):
        time.sleep(seconds)
        return seconds

    said: list[str] = []
    refs = [sleep.remote(s) for s in (0.0, 0.0, 2.0)]
    wait_saying_progress(refs, said.append, "blocks embedded", every_s=0.5)
    assert ray.get(refs, timeout=0) == [0.0, 0.0, 2.0]  # returned once every one was ready
    lines = [re.fullmatch(r"(\d) of 3 blocks embedded in \d+ s(, ETA \d+ s)?", line) for line in said]
    assert said and all(lines), said
    done = [int(m.group(1)) for m in lines]
    assert done == sorted(done) and max(done) < 3, said
    assert all((m.group(2) is not None) == (n > 0) for m, n in zip(lines, done)), said  # an ETA once one is done
    said.clear()
    wait_saying_progress([sleep.remote(0.0)], said.append, "blocks embedded", every_s=5)
    assert said == []  # done before a line was due: nothing said


def _slowly(batch):
    time.sleep(0.4)
    return batch


def test_materializing_says_rows_made_of_all_and_then_how_long_it_took(ray_local):
    """A tokenisation's spaCy stage said nothing until the split was done (100 s for the eleven-site build's
    117k pairs on 2 CPUs; hours for the paper's 10.5M on a few cores)."""
    import ray

    from pipelines.blocks import materialize_saying_progress

    said: list[str] = []
    ds = ray.data.range(40, override_num_blocks=8).map_batches(_slowly, batch_format="pyarrow", batch_size=None)
    out = materialize_saying_progress(ds, said.append, "train", total=40, every_s=0.3)
    assert sorted(r["id"] for r in out.take_all()) == list(range(40))
    assert out.num_blocks() == 8
    *going, last = said
    assert re.fullmatch(r"train: 40 rows in \d+ s \([\d,]+ rows/s\)", last), said
    for line in going:
        assert re.fullmatch(r"train: \d+ of 40 rows in \d+ s \([\d,]+ rows/s\)(, ETA \d+ s)?", line), said
    said.clear()
    quick = materialize_saying_progress(ray.data.range(5), said.append, "dev", total=5, every_s=60)
    assert quick.count() == 5 and said == []  # done within every_s: nothing said

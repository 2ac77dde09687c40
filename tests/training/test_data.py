"""What the loop reads a batch through: the prefetch thread (order, errors, an early stop) and the collective
backend a run's workers use."""

import threading
import time

import pytest

from training.config import TrainConfig
from training.data import prefetched


def test_prefetched_keeps_order_and_prepares_ahead_in_another_thread():
    seen = []

    def prepare(item):
        seen.append(threading.current_thread().name)
        return item * 10

    assert list(prefetched(range(7), prepare, depth=2)) == [0, 10, 20, 30, 40, 50, 60]
    assert set(seen) == {"prefetch-batches"}


def test_an_error_in_the_thread_reaches_the_consumer_after_the_items_before_it():
    def prepare(item):
        if item == 3:
            raise ValueError("row 3 is damaged")
        return item

    got = []
    with pytest.raises(ValueError, match="row 3 is damaged"):
        for value in prefetched(range(6), prepare):
            got.append(value)
    assert got == [0, 1, 2]


def test_closing_the_consumer_stops_the_thread_without_reading_on():
    read = []

    def items():
        for i in range(1000):
            read.append(i)
            yield i

    stream = prefetched(items(), lambda item: item, depth=2)
    assert next(stream) == 0
    stream.close()
    deadline = time.time() + 5
    while any(t.name == "prefetch-batches" for t in threading.enumerate()) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "prefetch-batches" for t in threading.enumerate())
    assert len(read) <= 5  # the one consumed, `depth` queued, one waiting to be put


def test_the_backend_is_nccl_only_for_workers_with_whole_gpus():
    def backend(**options):
        return TrainConfig(model="gsamn", data="x", **options).collective_backend()

    assert backend() == "gloo"
    assert backend(use_gpu=True) == "nccl"
    assert backend(use_gpu=True, gpus_per_worker=0.5, num_workers=2) == "gloo"  # NCCL refuses two ranks per GPU
    assert backend(use_gpu=True, backend="gloo") == "gloo"
    from runtime.checks import UsageError

    with pytest.raises(UsageError, match="--backend nccl needs --use-gpu"):
        TrainConfig(model="gsamn", data="x", backend="nccl")
    with pytest.raises(UsageError, match="--backend"):
        TrainConfig(model="gsamn", data="x", backend="mpi")


def test_a_relative_encoder_folder_is_made_absolute_for_the_workers(tmp_path, monkeypatch):
    (tmp_path / "encoder").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(model="bert", data="x", encoder_path="encoder")
    assert cfg.encoder_path == str(tmp_path / "encoder")  # Ray's workers run in another folder

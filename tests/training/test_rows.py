"""Each training worker's rows streamed through Ray Data from an exact position (training/rows.py): every row of
a worker's share once per epoch, the same batches on every run, and a resume that reads on from its pool."""

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.config import TrainConfig
from training.data import Batcher
from training.rows import (
    ROWS_PER_READ_TASK,
    cut_pool,
    drop_rows,
    epoch_batches,
    epoch_pieces,
    row_groups,
    row_pieces,
    worker_rows,
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three Parquet files of 40-row groups (1,000 rows), rows numbered in order in `row`."""
    folder = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    paths, start = [], 0
    for number, rows in enumerate([360, 400, 240]):
        ids = np.arange(start, start + rows)
        table = pa.table(
            {
                "row": ids,
                "qid": [f"q{i // 4}" for i in ids],
                "question_ids": [list(range(int(n))) for n in rng.integers(2, 30, rows)],
                "answer_ids": [list(range(int(n))) for n in rng.integers(2, 90, rows)],
                "label": rng.integers(0, 2, rows),
            }
        )
        path = str(folder / f"part-{number}.parquet")
        pq.write_table(table, path, row_group_size=40)
        paths.append(path)
        start += rows
    return row_groups(paths)


def _run(groups, cfg, epoch, rank, world, skip=0, key=None):
    start, stop = worker_rows(sum(r for *_, r in groups), world, rank)
    return [
        (index, batch["row"].tolist())
        for index, batch in epoch_batches(groups, start, stop, cfg, epoch, rank, key, skip)
    ]


@pytest.mark.parametrize("buckets", [0, 12])
def test_workers_read_their_share_once_and_a_resume_reads_on_from_its_pool(ray_local, shards, buckets):
    cfg = TrainConfig(model="gsamn", data="d", batch_size=16, length_buckets=buckets, seed=3)
    key = Batcher(cfg, "joint").length_key
    assert len(shards) == 25 and ROWS_PER_READ_TASK > 1000  # one read task: the pieces decide what is read
    seen = []
    for rank in range(3):
        batches = _run(shards, cfg, 1, rank, 3, key=key)
        rows = [r for _, b in batches for r in b]
        assert sorted(rows) == list(range(rank * 333, (rank + 1) * 333))  # the equal share, each row once
        assert [i for i, _ in batches] == list(range(21)) and [len(b) for _, b in batches][-1] == 333 % 16
        assert rows != sorted(rows)  # shuffled
        seen += rows
        per_pool = max(8, buckets)
        for skip in (5, per_pool, per_pool + 3):
            assert _run(shards, cfg, 1, rank, 3, skip=skip, key=key) == batches[skip:]
    assert len(set(seen)) == 999
    # another epoch, another order; the same epoch again, the same batches
    assert _run(shards, cfg, 2, 0, 3, key=key) != _run(shards, cfg, 1, 0, 3, key=key)
    assert _run(shards, cfg, 1, 0, 3, key=key) == _run(shards, cfg, 1, 0, 3, key=key)


def test_a_resume_reads_from_the_row_group_holding_its_pool(shards):
    start, stop = worker_rows(1000, 2, 1)  # rows 500..999, 13 row groups (the first and last cut)
    pieces = epoch_pieces(shards, start, stop, seed=3, epoch=1, rank=1)
    assert sorted(pieces) == sorted(row_pieces(shards, start, stop)) and pieces != row_pieces(shards, start, stop)
    assert epoch_pieces(shards, start, stop, 3, 2, 1) != pieces  # each epoch its own order of row groups
    consumed = 8 * 3 * 16  # three pools of 8 batches of 16 rows
    rest = drop_rows(pieces, consumed)
    assert sum(high - low for *_, low, high in rest) == 500 - consumed
    whole = [p for p in pieces if p not in rest]  # the row groups the resume never reads
    cut = [p for p in rest if p not in pieces]  # at most one: the row group holding row `consumed`
    assert len(cut) <= 1 and sum(high - low for *_, low, high in whole) >= consumed - 40


def test_grouped_pools_keep_a_questions_rows_together_in_a_shuffled_order():
    qids = np.array([f"q{i // 5}" for i in range(100)], dtype=object)
    columns = {"qid": qids, "row": np.arange(100)}
    batches = list(cut_pool(columns, 16, np.random.default_rng(0), group="qid"))
    stream = [q for b in batches for q in b["qid"]]
    assert sum(a != b for a, b in itertools.pairwise(stream)) == 19 and stream != list(qids)
    rows = [r for b in batches for r in b["row"]]
    assert sorted(rows) == list(range(100))
    assert all(rows[i] < rows[i + 1] for i in range(99) if stream[i] == stream[i + 1])  # in their order

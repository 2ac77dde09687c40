"""The build's hash shuffle (pipelines.shuffle): every row once, a key's rows in one partition, in source order,
side results, and the same partitions in every process."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.shuffle import composed, cut_into_partitions, hash_shuffle, map_tasks, partition_of


def _block(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "site": pa.array([f"s{i % 3}" for i in ids], pa.string()),
            "thread": pa.array(ids % 17, pa.int64()),
            "row": pa.array(ids, pa.int64()),
        }
    )


def _expected_partitions(tables: list[pa.Table], partitions: int) -> list[pa.Table]:
    """The reference: for each partition, the rows that hash there, taken source by source, block by block."""
    return [
        pa.concat_tables([t.filter(pa.array(partition_of(t, ["site", "thread"], partitions) == p)) for t in tables])
        for p in range(partitions)
    ]


def test_cut_keeps_every_row_once_and_in_order():
    tables = [_block(0, 50), _block(50, 0), _block(50, 31)]
    cut = cut_into_partitions(tables, ["site", "thread"], 4)
    assert [c.equals(e) for c, e in zip(cut, _expected_partitions(tables, 4))] == [True] * 4
    assert sum(c.num_rows for c in cut) == 81
    for part in cut:  # a key lies in one partition only
        keys = set(zip(part["site"].to_pylist(), part["thread"].to_pylist()))
        others = {
            k for other in cut if other is not part for k in zip(other["site"].to_pylist(), other["thread"].to_pylist())
        }
        assert not keys & others
    assert cut_into_partitions([_block(0, 0)], ["site"], 3)[2].num_rows == 0


def test_map_tasks_gather_blocks_to_a_size_and_bound_the_shards():
    mb = 1 << 20
    assert map_tasks([16 * mb] * 5, 33, 32 * mb) == [range(2), range(2, 4), range(4, 5)]
    assert map_tasks([40 * mb, 1, 1, 32 * mb, 2 * mb], 33, 32 * mb) == [range(1), range(1, 4), range(4, 5)]
    # Stack Overflow's dump: 6,400 blocks of 16 MB, 4,000 partitions; a million shards at most: 26 blocks a task
    tasks = map_tasks([16 * mb] * 6400, 4000, 32 * mb)
    assert {len(t) for t in tasks[:-1]} == {26} and len(tasks) * 4000 <= 1_000_000
    assert map_tasks([], 4, 32 * mb) == []


def _count_and_tag(block: pa.Table, tag: str) -> tuple[pa.Table, dict]:
    return block, {"rows": block.num_rows, "tag": tag}


def _double_row(table: pa.Table) -> pa.Table:
    return table.set_column(2, "row", pc.multiply(table["row"], 2))


def _not_last(table: pa.Table) -> pa.Table:
    return table.slice(0, max(0, table.num_rows - 1))


def test_hash_shuffle_brings_keys_together_with_side_results(ray_local):
    import ray

    first, second = [_block(0, 40), _block(40, 25)], [_block(100, 30)]
    prepare = composed(_not_last, _double_row)
    for max_shards, tasks in ((1_000_000, 3), (6, 2)):  # one block per map task, and blocks gathered
        map_done: list = []
        results = hash_shuffle(
            [
                ([ray.put(b) for b in first], [b.nbytes for b in first], None),
                ([ray.put(b) for b in second], [1], prepare),
            ],
            ["site", "thread"],
            3,
            _count_and_tag,
            {"tag": "x"},
            returns=2,
            task_bytes=1,
            max_shards=max_shards,
            map_done=map_done,
        )
        assert len(map_done) == tasks and ray.get(map_done)  # a reference per map task, ready once it ended
        blocks = ray.get([block for block, _, _ in results])
        sides = ray.get([side for _, side, _ in results])
        assert ray.get([size for _, _, size in results]) == [b.nbytes for b in blocks]
        expected = _expected_partitions(first + [prepare(b) for b in second], 3)
        assert [b.equals(e) for b, e in zip(blocks, expected)] == [True] * 3, max_shards
        assert sides == [{"rows": b.num_rows, "tag": "x"} for b in blocks]
        assert sum(s["rows"] for s in sides) == 40 + 25 + 29


def _first_rows(block: pa.Table) -> pa.Table:
    return block.slice(0, 3)


def _partitions_of_seven(table: pa.Table) -> np.ndarray:
    return partition_of(table, ["site", "thread"], 7)


def test_one_partition_and_partitions_computed_alike_in_workers(ray_local):
    import ray

    table = _block(0, 200)
    ((only, size),) = hash_shuffle([([ray.put(table)], [table.nbytes], None)], ["site", "thread"], 1, _first_rows)
    assert ray.get(only).equals(table.slice(0, 3)) and ray.get(size) == table.slice(0, 3).nbytes
    in_worker = ray.get(ray.remote(_partitions_of_seven).remote(table))
    assert np.array_equal(in_worker, partition_of(table, ["site", "thread"], 7))

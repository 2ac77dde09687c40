"""The score job's writer: ordered scored rows cut into one part file per input file (fast, no Ray)."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inference.scoring import _Parts, part_name, same_schema_runs


def _inputs(folder, sizes: list[int]) -> list[str]:
    paths, start = [], 0
    for i, n in enumerate(sizes):
        path = str(folder / f"{i}.parquet")
        columns = {"question": pa.array([f"q{start + j}" for j in range(n)], pa.string()), "answer": ["a"] * n}
        pq.write_table(pa.table(columns).cast(pa.schema({"question": pa.string(), "answer": pa.string()})), path)
        paths.append(path)
        start += n
    return paths


def test_rows_that_straddle_files_go_to_each_files_part_whole_and_in_order(tmp_path):
    paths = _inputs(tmp_path, [3, 0, 5, 2])
    staging = tmp_path / "staging"
    staging.mkdir()
    said: list[str] = []
    parts = _Parts(str(staging), paths, [4, 5, 6, 7], [3, 0, 5, 2], said.append, 0.0)
    everything = pa.concat_tables(pq.read_table(p) for p in paths)
    scored = everything.append_column("score", pa.array([float(i) for i in range(10)], pa.float32()))
    for start, size in ((0, 4), (4, 1), (5, 5)):  # batches that cross file boundaries
        parts.write(scored.slice(start, size))
    parts.finish()
    assert sorted(os.listdir(staging)) == [part_name(n) for n in (4, 5, 6, 7)]
    got = [pq.read_table(staging / part_name(n)) for n in (4, 5, 6, 7)]
    assert [t.num_rows for t in got] == [3, 0, 5, 2]
    assert got[1].schema.names == ["question", "answer", "score"]
    assert pa.concat_tables(got).to_pylist() == scored.to_pylist() and parts.rows == 10
    assert len(said) == 4


def test_a_run_that_delivers_too_few_or_too_many_rows_is_an_error_not_a_short_file(tmp_path):
    paths = _inputs(tmp_path, [2, 2])
    staging = tmp_path / "staging"
    staging.mkdir()
    table = pa.concat_tables(pq.read_table(p) for p in paths).append_column("score", pa.array([0.0] * 4, pa.float32()))
    parts = _Parts(str(staging), paths, [0, 1], [2, 2], lambda line: None, 0.0)
    parts.write(table.slice(0, 3))
    with pytest.raises(RuntimeError, match="1 of its 2 rows were not scored"):
        parts.finish()
    assert os.listdir(staging) == [part_name(0)]  # the whole first file only: no temporary left
    parts = _Parts(str(staging), paths, [0, 1], [2, 2], lambda line: None, 0.0)
    with pytest.raises(RuntimeError, match="1 scored rows more than the input files hold"):
        parts.write(pa.concat_tables([table, table.slice(0, 1)]))


def test_files_are_scored_in_runs_of_one_schema(tmp_path):
    paths = _inputs(tmp_path, [1, 1])
    other = str(tmp_path / "other.parquet")
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"], "extra": [1]}), other)
    files = [paths[0], paths[1], other, paths[0]]
    assert same_schema_runs(files, [0, 1, 2, 3]) == [[0, 1], [2], [3]]
    assert same_schema_runs(files, [1, 3]) == [[1, 3]]

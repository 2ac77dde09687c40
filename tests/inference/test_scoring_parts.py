"""The score job's writer: ordered scored rows cut into one part file per input file (fast, no Ray)."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inference.scoring import _Parts, input_files, output_names, same_schema_runs
from tests.conftest import make_build


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
    names = ["dev/a.parquet", "dev/b.parquet", "test/c.parquet", "d.parquet"]
    parts = _Parts(str(staging), paths, names, [3, 0, 5, 2], said.append, 0.0)
    everything = pa.concat_tables(pq.read_table(p) for p in paths)
    scored = everything.append_column("score", pa.array([float(i) for i in range(10)], pa.float32()))
    for start, size in ((0, 4), (4, 1), (5, 5)):  # batches that cross file boundaries
        parts.write(scored.slice(start, size))
    parts.finish()
    written = sorted(os.path.relpath(os.path.join(r, f), staging) for r, _, fs in os.walk(staging) for f in fs)
    assert written == sorted(names)  # each file whole at its name, subfolders made, no temporary left
    got = [pq.read_table(staging / name) for name in names]
    assert [t.num_rows for t in got] == [3, 0, 5, 2]
    assert got[1].schema.names == ["question", "answer", "score"]
    assert pa.concat_tables(got).to_pylist() == scored.to_pylist() and parts.rows == 10
    assert len(said) == 4


def test_a_slow_rate_is_said_with_a_decimal_not_as_zero(tmp_path):
    import time

    paths = _inputs(tmp_path, [3])
    staging = tmp_path / "staging"
    staging.mkdir()
    said: list[str] = []
    parts = _Parts(str(staging), paths, ["0.parquet"], [3], said.append, time.time() - 7.5)  # 3 rows in 7.5 s
    parts.write(pq.read_table(paths[0]).append_column("score", pa.array([0.0] * 3, pa.float32())))
    parts.finish()
    assert said[0].endswith("(3 rows scored, 0.4 rows/s)"), said


def test_a_run_that_delivers_too_few_or_too_many_rows_is_an_error_not_a_short_file(tmp_path):
    paths = _inputs(tmp_path, [2, 2])
    staging = tmp_path / "staging"
    staging.mkdir()
    table = pa.concat_tables(pq.read_table(p) for p in paths).append_column("score", pa.array([0.0] * 4, pa.float32()))
    parts = _Parts(str(staging), paths, ["0.parquet", "1.parquet"], [2, 2], lambda line: None, 0.0)
    parts.write(table.slice(0, 3))
    with pytest.raises(RuntimeError, match="1 of its 2 rows were not scored"):
        parts.finish()
    assert os.listdir(staging) == ["0.parquet"]  # the whole first file only: no temporary left
    parts = _Parts(str(staging), paths, ["0.parquet", "1.parquet"], [2, 2], lambda line: None, 0.0)
    with pytest.raises(RuntimeError, match="1 scored rows more than the input files hold"):
        parts.write(pa.concat_tables([table, table.slice(0, 1)]))


def test_files_are_scored_in_runs_of_one_schema(tmp_path):
    paths = _inputs(tmp_path, [1, 1])
    other = str(tmp_path / "other.parquet")
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"], "extra": [1]}), other)
    files = [paths[0], paths[1], other, paths[0]]
    assert same_schema_runs(files, [0, 1, 2, 3]) == [[0, 1], [2], [3]]
    assert same_schema_runs(files, [1, 3]) == [[1, 3]]


def test_a_builds_folder_gives_its_split_shards_scored_into_folders_of_the_same_names(tmp_path):
    """A StackExchangeQA build's output holds its attribution rows (authors, links) beside the splits: scoring the
    folder as it is was refused for their lack of a question column; its splits are what a user means."""
    from pipelines.atomic import write_marker

    build = tmp_path / "build"
    make_build(build)
    (build / "attribution").mkdir()
    pq.write_table(pa.table({"id": ["beer:1"], "author": ["someone"]}), build / "attribution" / "part-00000.parquet")
    write_marker(str(build), "build_stackexchangeqa")
    files = input_files(str(build))
    assert [os.path.relpath(f, build) for f in files] == [f"{s}/part-00000.parquet" for s in ("dev", "test", "train")]
    assert output_names(str(build), files) == [f"{s}/part-00000.parquet" for s in ("dev", "test", "train")]
    # any other folder: every Parquet file under it, at its path there; a single file keeps its name
    os.remove(build / ".qa-output.json")
    assert len(input_files(str(build))) == 4
    single = str(build / "test" / "part-00000.parquet")
    assert output_names(single, input_files(single)) == ["part-00000.parquet"]

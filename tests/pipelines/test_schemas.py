"""Arrow schemas of the shards (pipelines/schemas.py)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.schemas import QA_PAIRS, SchemaMismatch, check_parquet_files, conform


def test_conform_and_file_check(tmp_path):
    good = pa.table(
        {
            "qid": ["a"],
            "question": ["q"],
            "aid": ["b"],
            "answer": ["x"],
            "label": [1],
            "score": [3],
            "accepted": [True],
            "site": ["s"],
        }
    )
    table = conform(good, QA_PAIRS, "test")
    assert table.schema.equals(QA_PAIRS)
    with pytest.raises(SchemaMismatch, match="test: schema mismatch: missing \\['site'\\]"):
        conform(good.drop_columns(["site"]), QA_PAIRS, "test")
    with pytest.raises(SchemaMismatch, match="cannot be stored as int8"):
        conform(good.set_column(4, "label", pa.array([300])), QA_PAIRS, "test")
    path = tmp_path / "bad.parquet"
    pq.write_table(good.set_column(0, "qid", pa.array([1])), path)
    with pytest.raises(SchemaMismatch, match=r"bad\.parquet: schema mismatch: column 'qid' is int64"):
        check_parquet_files([str(path)], QA_PAIRS)

"""infra/offline_gpu/carry.py: a tokenised corpus packed and unpacked reads as the same rows through the project's
own shard reader (manifest checks included), and weights come back to the byte."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.shards import shard_paths
from tests.conftest import REPO, make_tokenised

spec = importlib.util.spec_from_file_location("carry", os.path.join(REPO, "infra", "offline_gpu", "carry.py"))
assert spec and spec.loader
carry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry)


def test_a_packed_corpus_unpacks_to_the_same_rows_and_row_groups_and_passes_the_shard_checks(tmp_path):
    source = make_tokenised(tmp_path / "source", questions=8, candidates=5)
    packed = str(tmp_path / "corpus.xz")
    carry.pack_corpus(source, packed)
    with lzma.open(packed, "rt", encoding="utf-8") as f:  # plain JSON: unpacking it never runs code from it
        assert set(json.load(f)["files"]) == set(carry.parquet_files(source))
    target = str(tmp_path / "target")
    carry.unpack_corpus(packed, target)
    assert carry.parquet_files(target) == carry.parquet_files(source)
    for rel in carry.parquet_files(source):
        before, after = pq.ParquetFile(os.path.join(source, rel)), pq.ParquetFile(os.path.join(target, rel))
        assert after.read().equals(before.read())
        assert [after.metadata.row_group(i).num_rows for i in range(after.metadata.num_row_groups)] == [
            before.metadata.row_group(i).num_rows for i in range(before.metadata.num_row_groups)
        ]
    with open(os.path.join(source, "vocab.json"), "rb") as a, open(os.path.join(target, "vocab.json"), "rb") as b:
        assert a.read() == b.read()
    for split in ("train", "dev", "test"):
        shard_paths(target, split, verify="sha256")  # bytes and sha256 as the refreshed manifest says
    with open(os.path.join(source, "manifest.json")) as a, open(os.path.join(target, "manifest.json")) as b:
        kept, refreshed = json.load(a), json.load(b)
    for split in kept["splits"].values():
        for entry in split["files"]:
            entry.pop("bytes"), entry.pop("sha256")
    for split in refreshed["splits"].values():
        for entry in split["files"]:
            entry.pop("bytes"), entry.pop("sha256")
    assert refreshed == kept


def test_an_upload_unpacks_every_corpus_and_build_stats_it_carries(tmp_path):
    upload, data = tmp_path / "upload", tmp_path / "data"
    upload.mkdir()
    for key in ("seqa1", "wikiqa"):
        carry.pack_corpus(make_tokenised(tmp_path / key, questions=4), str(upload / f"{key}.corpus.xz"))
    (upload / "seqa1-build.stats.json").write_text('{"splits": {"train": {"rows": 20}}}')
    (upload / "minilm.xz.part1").write_bytes(b"not a corpus")
    assert carry.unpack_all(str(upload), str(data)) == ["seqa1", "wikiqa"]
    assert sorted(os.listdir(data)) == ["seqa1", "seqa1-build", "wikiqa"]
    assert json.loads((data / "seqa1-build" / "stats.json").read_text())["splits"]["train"]["rows"] == 20
    for key in ("seqa1", "wikiqa"):
        assert carry.parquet_files(str(data / key)) == carry.parquet_files(str(tmp_path / key))
        shard_paths(str(data / key), "train", verify="sha256")


def test_a_changed_row_is_refused(tmp_path, monkeypatch):
    source = make_tokenised(tmp_path / "source")
    packed = str(tmp_path / "corpus.xz")
    carry.pack_corpus(source, packed)
    real_hash = carry.table_hash
    monkeypatch.setattr(carry, "table_hash", lambda table: real_hash(table.slice(1)))  # as if a row were lost
    with pytest.raises(SystemExit, match="differ from the packed shard"):
        carry.unpack_corpus(packed, str(tmp_path / "target"))


def test_weights_come_back_to_the_byte_and_a_wrong_checksum_is_refused(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 60]}}).encode()
    body = np.random.default_rng(0).standard_normal(15).astype(np.float32).tobytes()
    source = tmp_path / "model.safetensors"
    source.write_bytes(len(header).to_bytes(8, "little") + header + body)
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    carry.pack_weights(str(source), str(tmp_path / "w.xz"))
    data = (tmp_path / "w.xz").read_bytes()
    (tmp_path / "a").write_bytes(data[:100])
    (tmp_path / "b").write_bytes(data[100:])
    carry.unpack_weights(str(tmp_path / "out" / "model.safetensors"), sha, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == source.read_bytes()
    with pytest.raises(SystemExit, match="sha256"):
        carry.unpack_weights(str(tmp_path / "x"), "0" * 64, [str(tmp_path / "a"), str(tmp_path / "b")])

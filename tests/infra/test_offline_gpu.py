"""infra/offline_gpu/carry.py: a tokenised corpus packed and unpacked reads as the same rows through the project's
own shard reader (manifest checks included), weights come back to the byte, and uploads of any number carry
everything once within their limit."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.shards import (
    CARRIED_FROM,
    manifest_as_built,
    manifest_path_free_sha256,
    path_free_sha256,
    sha256_file,
    shard_paths,
)
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


def test_a_carried_copy_names_the_manifest_it_was_built_under_while_its_manifest_is_the_unpacked_one(tmp_path):
    """Unpacking writes other bytes for the same rows (here other writer options; on a GPU machine another pyarrow
    too), so the copy's manifest has another sha256: `carried_from.json` names the built one, which records of runs
    on the copy keep as the data's identity, and stops naming it once the manifest is written again."""
    source = make_tokenised(tmp_path / "source", questions=8, candidates=5)
    packed, target = str(tmp_path / "corpus.xz"), str(tmp_path / "target")
    carry.pack_corpus(source, packed)
    carry.unpack_corpus(packed, target)
    built, copy = os.path.join(source, "manifest.json"), os.path.join(target, "manifest.json")
    assert sha256_file(built) != sha256_file(copy)
    with open(os.path.join(target, CARRIED_FROM)) as f:
        note = json.load(f)
    assert note["built_sha256"] == sha256_file(built) and note["unpacked_sha256"] == sha256_file(copy)
    assert manifest_as_built(copy)[0] == sha256_file(built)
    assert manifest_as_built(built)[0] is None  # built here: its own sha256 is its identity
    # without the folders it names, the copy is known as its build: its own content names other shard bytes
    with open(built) as f:
        assert note["built_path_free_sha256"] == path_free_sha256(json.load(f)) == manifest_path_free_sha256(built)
    with open(copy) as f:
        assert path_free_sha256(json.load(f)) != manifest_path_free_sha256(copy) == manifest_path_free_sha256(built)
    carry.unpack_corpus(packed, target)  # unpacked again: the same note
    assert manifest_as_built(copy)[0] == sha256_file(built)
    with open(copy, "a") as f:  # the manifest written again since (a data step run on the copy, say)
        f.write("\n")
    assert manifest_as_built(copy)[0] is None
    with open(copy) as f:  # no longer the copy: known by its own content
        assert manifest_path_free_sha256(copy) == path_free_sha256(json.load(f))


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


def test_uploads_hold_everything_once_within_the_limit_and_the_blobs_join_back(tmp_path, monkeypatch):
    """distribute: the fixed files in the first and last uploads, each corpus whole with its build's stats, each
    blob cut into parts filling the room left, middle uploads made as needed, none over the limit; stashing every
    upload in order and joining gives each blob back to the byte, and a missing or changed part is refused."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)

    def made(name: str, size: int) -> str:
        (tmp_path / "stage").mkdir(exist_ok=True)
        path = tmp_path / "stage" / name
        path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        return str(path)

    first = [made("ray.tar.xz", 1300), made("minilm.sha256", 64)]
    last = [made("git.tar.xz", 200)]
    corpora = []
    for key, questions in (("seqa11", 12), ("seqa", 4)):
        corpora.append(str(tmp_path / "stage" / f"{key}.corpus.xz"))
        carry.pack_corpus(make_tokenised(tmp_path / key, questions=questions), corpora[-1])
    stats = tmp_path / "stage" / "seqa11-build.stats.json"
    stats.write_text('{"splits": {"train": {"rows": 20}}}')
    blob_paths = [made("minilm.xz", 7000), made("mpnet-wheels.tar", 11000)]
    blobs = {os.path.basename(p): Path(p).read_bytes() for p in blob_paths}
    order = carry.distribute(limit=6100, tree=100, first=first, last=last, corpora=corpora, blobs=blob_paths)
    assert order[0] == ".carry1" and order[-1] == ".carry2" and len(order) > 3
    assert order[1:-1] == [f".carry-mid{i}" for i in range(1, len(order) - 1)]
    held = {name: sorted(os.listdir(name)) for name in order}
    assert all(sum(os.path.getsize(os.path.join(n, f)) for f in files) <= 6000 for n, files in held.items())
    assert {"ray.tar.xz", "minilm.sha256", "blobs.json"} <= set(held[".carry1"]) and "git.tar.xz" in held[".carry2"]
    everything = [f for files in held.values() for f in files]
    assert everything.count("seqa11.corpus.xz") == everything.count("seqa.corpus.xz") == 1
    assert [n for n, files in held.items() if "seqa11.corpus.xz" in files] == [
        n for n, files in held.items() if "seqa11-build.stats.json" in files
    ]  # a corpus travels with its build's stats
    assert not os.listdir(tmp_path / "stage")  # moved, not copied
    carried, data = tmp_path / "carried", tmp_path / "data"
    assert sorted(key for name in order for key in carry.stash(name, str(carried), str(data))) == ["seqa", "seqa11"]
    assert json.loads((data / "seqa11-build" / "stats.json").read_text())["splits"]["train"]["rows"] == 20
    shard_paths(str(data / "seqa11"), "train", verify="sha256")
    assert (carried / "minilm.sha256").exists() and not (carried / "ray.tar.xz").exists()
    for name, content in blobs.items():
        carry.join(str(carried), name, str(tmp_path / f"joined-{name}"))
        assert (tmp_path / f"joined-{name}").read_bytes() == content
    (carried / "mpnet-wheels.tar.part01").write_bytes(b"changed")
    with pytest.raises(SystemExit, match="sha256"):
        carry.join(str(carried), "mpnet-wheels.tar", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    (carried / "mpnet-wheels.tar.part01").unlink()
    with pytest.raises(SystemExit, match=r"mpnet-wheels\.tar\.part01 not stashed"):
        carry.join(str(carried), "mpnet-wheels.tar", str(tmp_path / "x"))
    with pytest.raises(SystemExit, match="before any blob"):
        carry.distribute(6100, 100, first=[made("big", 5000)], last=[made("git", 1001)], corpora=[], blobs=[])

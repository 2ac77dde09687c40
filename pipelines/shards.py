"""A tokenised corpus on disk: Parquet shards under `{split}/`, each listed with its rows, bytes and sha256 in
`manifest.json` beside `vocab.json`. Written by `pipelines.tokenize` (pairs) and `pipelines.passages` (passages),
read back, checked against the manifest, by training and evaluation.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import asdict

import pyarrow as pa

from pipelines.atomic import recognised_by
from pipelines.blocks import materialised_blocks, materialize
from pipelines.schemas import ROW_GROUP_ROWS, check_parquet_files
from pipelines.vocabulary import RESERVED, Vocabulary
from runtime.checks import MissingInput

JOB = "tokenize_corpora"  # the job that writes tokenised folders: the name its outputs carry (pipelines.atomic)


def say_progress(line: str) -> None:
    """A tokenisation's progress line on stderr, as the build's `[build] ...` lines."""
    print(f"[tokenise] {line}", file=sys.stderr, flush=True)


# A tokenised folder written before outputs carried a completion marker: its manifest, with splits and vocabulary.
earlier_tokenisation = recognised_by("manifest.json", "splits", "vocab_sha256")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(data: str) -> dict:
    """DATA/manifest.json, refused with one line naming it where it is missing, damaged or not a manifest."""
    path = os.path.join(data, "manifest.json")
    if not os.path.exists(path):
        raise MissingInput(f"{path}: not found; --data must be a folder written by jobs/tokenize_corpora.py")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except ValueError as error:
        raise ValueError(f"{path}: damaged ({error}); tokenise again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits", {}), dict):
        raise ValueError(f"{path}: not a manifest of jobs/tokenize_corpora.py (no splits)")
    return manifest


def check_vocabulary(data: str, manifest: dict) -> None:
    """DATA/vocab.json is there and is the vocabulary the manifest was written with (its sha256): the ids in the
    shards, a checkpoint's vocabulary check, word statistics and word vectors all rest on it."""
    path = os.path.join(data, manifest.get("vocab", "vocab.json"))
    if not os.path.exists(path):
        raise MissingInput(f"{path}: not found; --data must be a whole folder written by jobs/tokenize_corpora.py")
    if manifest.get("vocab_sha256") and sha256_file(path) != manifest["vocab_sha256"]:
        raise ValueError(
            f"{path}: not the vocabulary {data}/manifest.json was written with (its sha256 differs); tokenise again"
        )


# Beside the manifest of a tokenised folder carried to another machine and unpacked there (infra/offline_gpu/carry.py):
# that pyarrow writes other bytes for the same rows, so the unpacked manifest's sha256 is not the built one's.
CARRIED_FROM = "carried_from.json"


def carried_note(manifest: str, sha256: str | None = None) -> dict | None:
    """What `CARRIED_FROM` beside `manifest` says of the build its folder is a carried copy of (every shard's rows
    checked against the built ones' content hash on unpacking): the built manifest's sha256 (`built_sha256`), its
    path-free sha256 (`built_path_free_sha256`, in notes written since it was kept) and the unpacked one's; None
    for a folder built where it is, or where the manifest is no longer the one unpacked (written again since: the
    note is stale). `sha256`: the manifest's own, where the caller has it."""
    note = os.path.join(os.path.dirname(manifest), CARRIED_FROM)
    if not os.path.exists(note):
        return None
    with open(note) as f:
        carried = json.load(f)
    return carried if (sha256 or sha256_file(manifest)) == carried.get("unpacked_sha256") else None


# Where a tokenised folder and what it was built from lie, as its manifest keeps them: `config.input` (the data
# read, an absolute path where it was given as one), `config.output` (the folder itself), `config.vocab` and
# `vocab_from` (a vocabulary taken from another folder; `vocab_sha256` names its content) and `reader.stats` (a
# StackExchangeQA build's statistics). The same rows built from ../shared/data at another absolute path, or into
# another folder, give a manifest of other bytes that differs only there.
MANIFEST_PATHS = (("config", "input"), ("config", "output"), ("config", "vocab"), ("vocab_from",), ("reader", "stats"))


def path_free_sha256(manifest: dict) -> str:
    """The sha256 of a manifest's content without the paths it keeps (`MANIFEST_PATHS`), as canonical JSON (keys
    sorted, no spaces): every shard's sha256, the vocabulary's, the counts and settings, whatever folders the data
    and the output lay in. Records name data by it, so a run re-run on a machine whose ../shared/data lies
    elsewhere is known to read what its record read."""
    content = json.loads(json.dumps(manifest))  # a deep copy: the caller's manifest stays as it was
    for *parents, field in MANIFEST_PATHS:
        holder = content
        for parent in parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        if isinstance(holder, dict):
            holder.pop(field, None)
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def manifest_as_built(manifest: str, sha256: str | None = None) -> tuple[str | None, str | None]:
    """What `manifest` was as built, from one reading of the note beside it (`carried_note`): its sha256 as built
    where its folder is a carried copy, else None; and its path-free sha256 (`path_free_sha256`) as built: its own,
    or for a carried copy (whose shards are other bytes for the same rows) its build's, as the note names it, None
    for a note that predates that field. `sha256`: the manifest's own, where the caller has it."""
    note = carried_note(manifest, sha256)
    if note is not None:
        return note.get("built_sha256"), note.get("built_path_free_sha256")
    with open(manifest) as f:
        return None, path_free_sha256(json.load(f))


def manifest_path_free_sha256(manifest: str, sha256: str | None = None) -> str | None:
    """The path-free sha256 of `manifest` as built (`manifest_as_built`)."""
    return manifest_as_built(manifest, sha256)[1]


def rows_per_shard(ds, cfg) -> int:
    """Rows per Parquet file for a `cfg.shard_mb` target, from the materialised dataset's bytes per row."""
    if cfg.rows_per_shard:
        return cfg.rows_per_shard
    rows = ds.count()
    per_row = max(1, (ds.size_bytes() or 1) // max(1, rows))
    return max(1, (cfg.shard_mb << 20) // per_row)


def write_parquet_atomically(
    path: str, schema: pa.Schema, pieces: Iterable[pa.Table], row_group_rows: int = ROW_GROUP_ROWS
) -> int:
    """`pieces` (Arrow tables, in order) as one Parquet file at `path`, written under a temporary name and renamed
    once whole; row groups of `row_group_rows` rows but the last, whatever the pieces' sizes (a row group is where a
    resumed training worker can start reading). Holds one row group's slices at a time; returns the rows written."""
    import pyarrow.parquet as pq

    rows, temporary, held = 0, path + ".tmp", 0
    group: list[pa.Table] = []

    def flush(writer) -> None:
        nonlocal held, group
        if held:
            writer.write_table(pa.concat_tables(group), row_group_size=held)
        held, group = 0, []

    with pq.ParquetWriter(temporary, schema, compression="zstd") as writer:
        for piece in pieces:
            if not piece.schema.equals(schema):
                piece = piece.select(schema.names).cast(schema)
            rows += piece.num_rows
            while piece.num_rows:
                part = piece.slice(0, row_group_rows - held)
                piece = piece.slice(part.num_rows)
                group.append(part)
                held += part.num_rows
                if held == row_group_rows:
                    flush(writer)
        flush(writer)
    os.replace(temporary, path)
    return rows


def consecutive_groups(sizes: list[int], at_least: int) -> list[list[int]]:
    """The positions of `sizes` (rows per block, in order) gathered into runs of consecutive non-empty blocks that
    hold at least `at_least` rows each, but the last, which takes what remains: the blocks of each shard."""
    groups, group, rows = [], [], 0
    for position, n in enumerate(sizes):
        if n:
            group.append(position)
            rows += n
        if group and (rows >= at_least or position == len(sizes) - 1):
            groups.append(group)
            group, rows = [], 0
    return groups


def _write_shard(path: str, schema: pa.Schema, *blocks: pa.Table) -> int:
    return write_parquet_atomically(path, schema, blocks)


def write_blocks(blocks: list, sizes: list[int], directory: str, schema: pa.Schema, at_least: int) -> list[dict]:
    """Blocks (object references, with their rows in `sizes`) in their order as `directory/part-NNNNN.parquet`,
    each shard gathering consecutive blocks until it holds at least `at_least` rows; the shards' names (relative
    to `directory`'s parent), rows, bytes and sha256. Each shard is written by a task that reads its blocks in
    place in the object store; the rows each wrote are checked against the plan."""
    import ray

    if not sum(sizes):
        return []
    os.makedirs(directory, exist_ok=True)
    write = ray.remote(num_cpus=1)(_write_shard)
    planned = []
    for number, group in enumerate(consecutive_groups(sizes, at_least)):
        name = f"part-{number:05d}.parquet"
        planned.append(
            (
                name,
                sum(sizes[i] for i in group),
                write.remote(os.path.join(directory, name), schema, *(blocks[i] for i in group)),
            )
        )
    files = []
    for name, rows, ref in planned:
        written = ray.get(ref)
        if written != rows:
            raise RuntimeError(f"{directory}/{name}: {written:,} rows written, {rows:,} planned")
        path = os.path.join(directory, name)
        files.append(
            {
                "path": f"{os.path.basename(directory)}/{name}",
                "rows": rows,
                "bytes": os.path.getsize(path),
                "sha256": sha256_file(path),
            }
        )
    return files


def write_shards(ds, staging: str, split: str, cfg, size_from=None) -> list[dict]:
    """`ds`'s rows in its order as Parquet shards `staging/split/part-NNNNN.parquet`, with their rows, bytes and
    sha256. A shard gathers consecutive blocks until it holds at least the rows that `cfg` asks for, which come
    from the bytes per row of `size_from` (a materialised dataset of about the same rows; by default `ds` itself).

    Each shard is written by a task that reads its blocks in place in the object store, in order (`write_blocks`).
    Ray Data's `write_parquet` handed a task's blocks to Arrow's threaded dataset writer, which does not keep their
    order (`preserve_order=False`): two tokenisations of one build differed in CI, and 2 of 12 tokenisations of the
    end-to-end test's build moved a 1,024-row batch within its shard (0 of 36 with this writer)."""
    ds = materialize(ds)
    target = rows_per_shard(size_from or ds, cfg)
    refs, sizes, _ = materialised_blocks(ds)
    if not sum(sizes):
        return []
    return write_blocks(refs, sizes, os.path.join(staging, split), ds.schema().base_schema, target)


def manifest_for(cfg, schema: str, vocab: Vocabulary, found: dict, staging: str) -> dict:
    """The manifest, with the vocabulary's checksum: training refuses a checkpoint of another vocabulary."""
    return {
        "dataset": cfg.dataset,
        "schema": schema,
        "tokenizer": "spacy.blank('en')",
        "lowercase": cfg.lowercase,
        "vocab": "vocab.json",
        "vocab_size": len(vocab),
        "char_vocab_size": len(vocab.chars),
        "vocab_sha256": sha256_file(os.path.join(staging, "vocab.json")),
        "vocab_from": cfg.vocab,
        "reserved": list(RESERVED),
        "config": asdict(cfg),
        "reader": found,
        "splits": {},
    }


class ShardError(ValueError):
    """A tokenised output folder whose shards differ from its manifest."""


def read_shards(data: str, split: str, verify: str = "size"):
    """A split of a tokenise_corpora output as a lazy Ray Dataset that streams (nothing is read until iterated).

    The files are exactly the manifest's: a missing, extra or changed shard is an error naming it. `verify`
    "size" compares rows (Parquet footer) and bytes, "sha256" also the checksum (reads every byte once), "none"
    skips the checks."""
    import ray.data

    paths, schema = shard_paths(data, split, verify)
    return ray.data.read_parquet(paths, schema=schema)


def shard_paths(data: str, split: str, verify: str = "size") -> tuple[list[str], pa.Schema]:
    """The Parquet files of a split and their schema, checked against the manifest as `read_shards` says."""
    import pyarrow.parquet as pq

    from pipelines.schemas import SCHEMAS

    manifest = read_manifest(data)
    if split not in manifest["splits"]:
        raise ShardError(f"{data}/manifest.json has no split {split!r} (has {', '.join(manifest['splits'])})")
    schema = SCHEMAS[manifest["schema"]]
    listed = manifest["splits"][split]["files"]
    paths = [os.path.join(data, entry["path"]) for entry in listed]
    directory = os.path.join(data, split)
    on_disk = (
        {os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".parquet")}
        if os.path.isdir(directory)
        else set()
    )
    if verify != "none":
        extra = sorted(on_disk - set(paths))
        if extra:
            raise ShardError(f"{extra[0]}: a shard the manifest does not list ({len(extra)} such files)")
        for entry, path in zip(listed, paths):
            if not os.path.exists(path):
                raise ShardError(f"{path}: listed in {data}/manifest.json but missing")
            if "bytes" in entry and os.path.getsize(path) != entry["bytes"]:
                raise ShardError(f"{path}: {os.path.getsize(path):,} bytes, the manifest says {entry['bytes']:,}")
            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except (OSError, ValueError) as error:  # a damaged footer
                raise ShardError(f"{path}: not a readable Parquet file ({error})") from None
            if "rows" in entry and rows != entry["rows"]:
                raise ShardError(f"{path}: row count differs from the manifest")
            if verify == "sha256" and sha256_file(path) != entry["sha256"]:
                raise ShardError(f"{path}: sha256 differs from the manifest (changed after it was written)")
    check_parquet_files(paths, schema)
    return paths, schema


def tokenised_files(data: str) -> list[str]:
    """Every file of a tokenised folder that a job reads (manifest, vocabulary, word vectors, the shards the
    manifest lists): what no job's output may replace."""
    files = [os.path.join(data, name) for name in ("manifest.json", "vocab.json", "embeddings.npy")]
    try:
        with open(os.path.join(data, "manifest.json")) as f:
            splits = json.load(f).get("splits", {})
    except (OSError, ValueError, AttributeError):
        return files
    return files + [
        os.path.join(data, entry["path"])
        for split in splits.values()
        for entry in split.get("files", [])
        if isinstance(entry, dict) and "path" in entry
    ]

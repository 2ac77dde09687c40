"""Exact and near-duplicate answers, found at cluster scale with MinHash LSH.

Every non-empty answer gets an exact key (a hash of its lower-cased, whitespace-collapsed text) and a MinHash
signature over its word 5-gram shingles, cut into `bands` bands. Answers that share the exact key or any
band meet in one shuffle group; there, each answer is compared with the answers before it in the keep order
(highest score first, then site and id, so the copy kept is the best-voted one and the choice is
deterministic), and is a duplicate when an earlier one has the same exact key or an estimated Jaccard
similarity (the share of equal MinHash values) of at least `threshold`. The stage returns only the
duplicates: (site, id, thread, duplicate_of, similarity).

With 64 permutations in 16 bands of 4, a pair at Jaccard 0.8 shares a band with probability 0.9998 and a pair
at 0.5 with probability 0.64; the similarity check then removes the false candidates.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pyarrow as pa

DEDUP_MODES = ("near", "exact", "off")
_WORDS = re.compile(r"\w+", re.UNICODE)
_MASK32 = np.uint64(0xFFFFFFFF)

BAND_ROWS = pa.schema(
    [
        ("key", pa.string()),
        ("site", pa.string()),
        ("id", pa.int64()),
        ("thread", pa.int64()),
        ("score", pa.int32()),
        ("signature", pa.binary()),
    ]
)
DUPLICATES = pa.schema(
    [
        ("site", pa.string()),
        ("id", pa.int64()),
        ("thread", pa.int64()),
        ("duplicate_of", pa.string()),
        ("similarity", pa.float32()),
    ]
)


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def _h32(value: str) -> int:
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=4).digest(), "big")


def shingles(text: str, n: int = 5) -> np.ndarray:
    """Hashes (uint64 holding 32 bits) of the distinct word n-grams; texts shorter than n give one shingle."""
    words = _WORDS.findall(text.lower())
    if not words:
        return np.zeros(0, dtype=np.uint64)
    grams = {" ".join(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}
    return np.fromiter((_h32(g) for g in grams), dtype=np.uint64, count=len(grams))


class MinHasher:
    """Signatures by multiply-shift hashing: h_i(x) = ((a_i x + b_i) mod 2^64) >> 32, a_i odd."""

    def __init__(self, num_perm: int = 64, seed: int = 1):
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
        self.num_perm = num_perm

    def signature(self, shingle_hashes: np.ndarray) -> np.ndarray:
        if len(shingle_hashes) == 0:
            return np.full(self.num_perm, 0xFFFFFFFF, dtype=np.uint32)
        with np.errstate(over="ignore"):
            hashed = (shingle_hashes[:, None] * self.a[None, :] + self.b[None, :]) >> np.uint64(32)
        return (hashed & _MASK32).min(axis=0).astype(np.uint32)


def similarity(a: bytes, b: bytes) -> float:
    x, y = np.frombuffer(a, dtype=np.uint32), np.frombuffer(b, dtype=np.uint32)
    return float(np.mean(x == y))


class BandKeys:
    """Answer rows (site, id, thread, score, text) to one row per key: the exact key and, in `near` mode,
    one per band."""

    def __init__(self, mode: str = "near", num_perm: int = 64, bands: int = 16, seed: int = 1):
        if mode not in ("near", "exact"):
            raise ValueError(f"dedup mode must be near or exact here, got {mode!r}")
        if num_perm % bands:
            raise ValueError(f"num_perm ({num_perm}) must be a multiple of bands ({bands})")
        self.mode, self.bands, self.rows = mode, bands, num_perm // bands
        self.hasher = MinHasher(num_perm, seed)

    def __call__(self, batch: pa.Table) -> pa.Table:
        out: dict[str, list] = {name: [] for name in BAND_ROWS.names}

        def add(key, site, post_id, thread, score, signature):
            for name, value in zip(BAND_ROWS.names, (key, site, post_id, thread, score, signature)):
                out[name].append(value)

        for site, post_id, thread, score, text in zip(
            *(batch.column(c).to_pylist() for c in ("site", "id", "thread", "score", "text"))
        ):
            exact = hashlib.blake2b(normalise(text).encode(), digest_size=12).hexdigest()
            if self.mode == "exact":
                add("x" + exact, site, post_id, thread, score, b"")
                continue
            signature = self.hasher.signature(shingles(text))
            raw = signature.tobytes()
            add("x" + exact, site, post_id, thread, score, raw)
            for band in range(self.bands):
                part = signature[band * self.rows : (band + 1) * self.rows].tobytes()
                add(f"b{band}:" + hashlib.blake2b(part, digest_size=10).hexdigest(), site, post_id, thread, score, raw)
        return pa.table(out, schema=BAND_ROWS)


def find_duplicates(group: pa.Table, threshold: float = 0.8, window: int = 64) -> pa.Table:
    """The duplicates within one key group: each answer against up to `window` answers before it."""
    if group.num_rows < 2:
        return DUPLICATES.empty_table()
    return pa.Table.from_pylist(_group_duplicates(group.to_pylist(), threshold, window), schema=DUPLICATES)


def find_duplicates_in_block(block: pa.Table, threshold: float = 0.8, window: int = 64) -> pa.Table:
    """`find_duplicates` for every key of a block holding whole key groups (after a shuffle by key). Most
    keys have one answer, so they are skipped before any row becomes Python."""
    if block.num_rows < 2:
        return DUPLICATES.empty_table()
    import pyarrow.compute as pc

    counts = block.group_by("key").aggregate([("key", "count")])
    shared = counts.filter(pc.greater(counts["key_count"], 1))["key"]
    if len(shared) == 0:
        return DUPLICATES.empty_table()
    from pipelines.blocks import map_groups_in_block

    candidates = block.filter(pc.is_in(block["key"], value_set=shared))
    return map_groups_in_block(candidates, ["key"], lambda rows: _group_duplicates(rows, threshold, window), DUPLICATES)


def _group_duplicates(rows: list[dict], threshold: float, window: int) -> list[dict]:
    if len(rows) < 2:
        return []
    rows = sorted(rows, key=lambda r: (-r["score"], r["site"], r["id"]))
    # the same post read twice (two sources) is one answer here; the thread stage keeps one of its copies
    rows = [r for i, r in enumerate(rows) if i == 0 or (r["site"], r["id"]) != (rows[i - 1]["site"], rows[i - 1]["id"])]
    if len(rows) < 2:
        return []
    exact = rows[0]["key"].startswith("x")
    out = []
    for i in range(1, len(rows)):
        row = rows[i]
        original: dict | None
        if exact:
            original, sim = rows[0], 1.0
        else:
            original, sim = None, 0.0
            for earlier in rows[max(0, i - window) : i]:
                sim = similarity(row["signature"], earlier["signature"])
                if sim >= threshold:
                    original = earlier
                    break
            if original is None:
                continue
        out.append(
            {
                "site": row["site"],
                "id": row["id"],
                "thread": row["thread"],
                "duplicate_of": f"{original['site']}:{original['id']}",
                "similarity": sim,
            }
        )
    return out


def duplicate_answers(
    answers, mode: str = "near", threshold: float = 0.8, num_perm: int = 64, bands: int = 16, partitions: int = 8
):
    """Dataset of DUPLICATES rows (one per duplicate answer, possibly repeated) from a dataset of answers with
    columns site, id, thread, score, text."""
    keys = answers.map_batches(
        band_keys, batch_format="pyarrow", fn_kwargs={"mode": mode, "num_perm": num_perm, "bands": bands}
    )
    return keys.repartition(partitions, keys=["key"]).map_batches(
        find_duplicates_in_block, batch_size=None, batch_format="pyarrow", fn_kwargs={"threshold": threshold}
    )


_BAND_KEYS: dict[tuple, BandKeys] = {}


def band_keys(batch: pa.Table, **options) -> pa.Table:
    """`BandKeys` as a task function (its hash permutations made once per worker process): tasks give their
    CPU back between batches, so the shuffle that follows can always run."""
    key = tuple(sorted(options.items()))
    if key not in _BAND_KEYS:
        _BAND_KEYS[key] = BandKeys(**options)
    return _BAND_KEYS[key](batch)

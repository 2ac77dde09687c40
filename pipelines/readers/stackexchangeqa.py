"""Our own StackExchangeQA build, checked without reading a row."""

from __future__ import annotations

import os


def stackexchangeqa_found(path: str) -> dict:
    """What our own build wrote, checked without reading a row: pairs per split from the Parquet footers
    against `stats.json` (a difference means shards were lost or added after the build), questions from
    `stats.json`, and the pair totals beside the GSAMN paper's (628,706 positive, 9,874,758 negative)."""
    import json

    import pyarrow.parquet as pq

    from pipelines.schemas import parquet_files

    stats_path = os.path.join(path, "stats.json")
    stats = None
    if os.path.isfile(stats_path):
        with open(stats_path) as f:
            stats = json.load(f)
    sizes, differences = {}, []
    for split in ("train", "dev", "test"):
        if not os.path.isdir(os.path.join(path, split)):
            continue
        rows = sum(pq.ParquetFile(file).metadata.num_rows for file in parquet_files(os.path.join(path, split)))
        recorded = (stats or {}).get("splits", {}).get(split, {})
        sizes[split] = {"questions": recorded.get("questions"), "pairs": rows}
        if stats is not None and recorded.get("rows") != rows:
            differences.append(
                f"stackexchangeqa {split}: {rows:,} pairs in the shards, {recorded.get('rows')} in {stats_path}"
            )
    found = {"sizes": sizes, "differences_from_build": differences, "stats": stats_path if stats else None}
    if stats:
        found["pairs"], found["paper"] = stats.get("pairs"), stats.get("paper")
    return found

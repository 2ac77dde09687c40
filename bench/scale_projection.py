"""The whole public Stack Exchange dump on 16, 64 and 256 cores, projected from a measured build.

    python bench/scale_projection.py [--bench bench/stackexchangeqa.json] [--sites sites.csv]
        [--cores 16,64,256] [--json bench/scale_projection.json]

Inputs, all measured unless said:

- `bench/stackexchangeqa.json` (run `bench/stackexchangeqa.py` first): each stage's microseconds of CPU per post
  at the largest size, the XML bytes per post and the peak heaps per CPU;
- the real beer dump: the bytes an analysed post holds in the object store (its text plus the id, score and key
  columns), which is what the thread and negative shuffles move;
- LZMA decoding speed on this machine (Python's `lzma`, the same liblzma-class decoder that 7-Zip's LZMA2 uses),
  measured on the beer dump's XML: a site's `.7z` archive is read by one task, so the largest archive
  (Stack Overflow's `Posts.7z`) is decoded on one core however many the cluster has;
- the posts per site (`--sites`, a CSV of `site,posts`). Without it, the public order of magnitude: Stack
  Overflow about 60 million posts, the other ~360 sites about 20 million together. These two figures are NOT
  measured here (the machine has no internet): replace them with a real listing (the `PostTypeId` 1 and 2 rows
  of each site's Posts.xml, or the counts on stackexchange.com/sites).

Model: every stage runs at the per-core rate measured on 2 cores (an assumption: Ray Data's per-core throughput
was flat from 1 to 2 cores here; many-node runs add network shuffles it does not include); the archive decode
runs on one core first (extract once, then read the plain Posts.xml in parallel byte ranges; the other sites
decode in parallel meanwhile). Nodes are m6i.4xlarge (16 vCPUs, 64 GiB, $0.77/hour on demand, us-west-2) with
Ray's default object store of 30% of memory; the shuffles' input beyond the cluster's object store spills to
local disk. Memory per CPU is the build's measured peak heap per CPU (flat in input size by construction) plus
the object store's share.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import lzma
import math
import os
import sys
import time

if __package__ in (None, ""):
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

from bench.report import check_result_file, write_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DUMP = os.path.join(REPO, "..", "shared", "data", "stackexchange_dump_beer", "Posts.xml.gz")
PUBLIC_ORDER_OF_MAGNITUDE = {"stackoverflow.com": 60_000_000, "the other ~360 sites": 20_000_000}
NODE_CPUS, NODE_GIB, NODE_DOLLARS_PER_HOUR, OBJECT_STORE_SHARE = 16, 64, 0.77, 0.30
# Columns an analysed post carries besides its text (ids, parent, score, site, thread key): a generous constant.
ROW_OVERHEAD_BYTES = 96


def read_sites(path: str | None) -> dict[str, int]:
    if path is None:
        return dict(PUBLIC_ORDER_OF_MAGNITUDE)
    sites = {}
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                sites[row["site"]] = int(row["posts"])
            except (KeyError, TypeError, ValueError) as e:
                raise SystemExit(
                    f"{path}: line {line}: expected columns site,posts with an integer count ({e})"
                ) from None
    if not sites:
        raise SystemExit(f"{path}: no sites")
    return sites


def measure_dump(dump: str) -> dict:
    """Bytes of XML and of analysed post per post, and LZMA decoding MB/s of XML, on the real dump."""
    from lxml import etree

    from pipelines.text import html_to_text

    with gzip.open(dump) as f:
        xml = f.read()
    posts, text_bytes = 0, 0
    for _, row in etree.iterparse(io.BytesIO(xml), tag="row"):
        if row.get("PostTypeId") in ("1", "2"):
            posts += 1
            text_bytes += len(html_to_text(row.get("Body", "")).encode()) + len(row.get("Title", "").encode())
        row.clear()
    packed = lzma.compress(xml, preset=6)
    started = time.perf_counter()
    for _ in range(3):
        lzma.decompress(packed)
    lzma_mb_per_s = 3 * len(xml) / 2**20 / (time.perf_counter() - started)
    return {
        "posts": posts,
        "analysed_bytes_per_post": text_bytes / posts + ROW_OVERHEAD_BYTES,
        "lzma_decode_mb_per_s": lzma_mb_per_s,
        "lzma_ratio": len(xml) / len(packed),
    }


def project(
    bench: dict, measured: dict, sites: dict[str, int], cores: list[int], largest_xml_gb: float | None = None
) -> dict:
    sizes = bench["details"]["sizes"]
    largest = sizes[str(max(int(k) for k in sizes))]
    profile = {k: v["us_per_post"] for k, v in largest["stage_profile"].items() if not k.startswith(" ")}
    cpu_us_per_post = sum(profile.values())
    xml_bytes_per_post = largest["xml_mb"] * 2**20 / largest["posts"]
    cpus_used = bench["details"]["machine"]["num_cpus_used"]
    heap_gb_per_cpu = largest["ours"]["peak_heap_mb"] / 1024 / cpus_used
    total = sum(sites.values())
    biggest_site, biggest = max(sites.items(), key=lambda kv: kv[1])
    largest_xml_mb = largest_xml_gb * 1024 if largest_xml_gb else biggest * xml_bytes_per_post / 2**20
    decode_hours = largest_xml_mb / measured["lzma_decode_mb_per_s"] / 3600
    shuffle_gb = total * measured["analysed_bytes_per_post"] / 2**30
    rows = []
    for n in cores:
        nodes = math.ceil(n / NODE_CPUS)
        build_hours = total * cpu_us_per_post / 1e6 / n / 3600
        store_gb = nodes * NODE_GIB * OBJECT_STORE_SHARE
        hours = decode_hours + build_hours
        rows.append(
            {
                "cores": n,
                "nodes": nodes,
                "hours": hours,
                "decode_hours": decode_hours,
                "build_hours": build_hours,
                "memory_gb_per_cpu": heap_gb_per_cpu + NODE_GIB * OBJECT_STORE_SHARE / NODE_CPUS,
                "object_store_gb": store_gb,
                "spill_gb": max(0.0, shuffle_gb - store_gb),
                "dollars": nodes * hours * NODE_DOLLARS_PER_HOUR,
                "cpu_hours": total * cpu_us_per_post / 1e6 / 3600,
            }
        )
    return {
        "posts": total,
        "sites": sites,
        "largest_site": biggest_site,
        "cpu_us_per_post": cpu_us_per_post,
        "stage_us_per_post": profile,
        "xml_bytes_per_post": xml_bytes_per_post,
        "heap_gb_per_cpu": heap_gb_per_cpu,
        "largest_xml_gb": largest_xml_mb / 1024,
        "shuffle_gb": shuffle_gb,
        "measured": measured,
        "rows": rows,
        "bench_posts": largest["posts"],
        "bench_cpus": cpus_used,
    }


def _clock(hours: float) -> str:
    minutes = round(hours * 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def table(projection: dict) -> str:
    lines = [
        "| cores (m6i.4xlarge nodes) | time | of which decoding the largest .7z on one core | memory per CPU "
        "| spill to disk | cost |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in projection["rows"]:
        lines.append(
            f"| {r['cores']} ({r['nodes']}) | {_clock(r['hours'])} | {_clock(r['decode_hours'])} | "
            f"{r['memory_gb_per_cpu']:.1f} GB | {r['spill_gb']:,.0f} GB | ${r['dollars']:,.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--bench",
        default=os.path.join(REPO, "bench", "stackexchangeqa.json"),
        help="the JSON bench/stackexchangeqa.py wrote",
    )
    p.add_argument(
        "--sites",
        default=None,
        help="CSV with columns site,posts (default: the public order of "
        "magnitude, 60M Stack Overflow + 20M other sites)",
    )
    p.add_argument("--dump", default=DEFAULT_DUMP, help="the real dump that post sizes and LZMA speed come from")
    p.add_argument("--cores", default="16,64,256", help="comma-separated core counts")
    p.add_argument(
        "--largest-xml-gb",
        type=float,
        default=None,
        help="the largest site's Posts.xml in GB, where known (default: its posts x the bench's XML "
        "bytes per post, which are beer-site posts, shorter than Stack Overflow's)",
    )
    p.add_argument("--json", default=os.path.join(REPO, "bench", "scale_projection.json"))
    args = p.parse_args(argv)
    check_result_file(p, args.json, "cpu_us_per_post", inputs=(args.bench, args.sites, args.dump))
    if not os.path.exists(args.bench):
        p.error(f"{args.bench}: not found; run python bench/stackexchangeqa.py first")
    with open(args.bench) as f:
        bench = json.load(f)
    projection = project(
        bench,
        measure_dump(args.dump),
        read_sites(args.sites),
        [int(c) for c in args.cores.split(",")],
        args.largest_xml_gb,
    )
    m = projection["measured"]
    print(
        f"{projection['posts']:,} posts; measured on {projection['bench_cpus']} CPUs at "
        f"{projection['bench_posts']:,} posts: {projection['cpu_us_per_post']:,.0f} us of CPU per post, "
        f"{projection['xml_bytes_per_post']:,.0f} B of XML per post, heaps {projection['heap_gb_per_cpu']:.2f} GB "
        f"per CPU; the largest Posts.xml {projection['largest_xml_gb']:,.0f} GB; "
        f"{m['analysed_bytes_per_post']:,.0f} B per analysed post (shuffles move "
        f"{projection['shuffle_gb']:,.0f} GB); LZMA decoding {m['lzma_decode_mb_per_s']:,.0f} MB/s of XML"
    )
    print(table(projection))
    write_result(projection, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

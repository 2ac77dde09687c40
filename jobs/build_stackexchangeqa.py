"""Build StackExchangeQA from Stack Exchange dump files (GSAMN paper, section 3).

    python jobs/build_stackexchangeqa.py --dump PATH [--dump PATH ...] --output DIR \
        [--min-score 2] [--negatives K] [--seed S]

Writes DIR/{train,dev,test}/*.parquet (the QA_PAIRS schema of pipelines/schemas.py) and DIR/stats.json,
the funnel from posts read to pairs written. Run directly it starts a local Ray; under
`ray job submit -- python jobs/build_stackexchangeqa.py ...` it joins the cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipelines.stackexchangeqa import BuildConfig, DROP_REASONS


def parse_args(argv=None) -> tuple[BuildConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dump", action="append", required=True, metavar="[SITE=]PATH",
                   help="a Posts.xml or Posts.xml.gz; repeat for several sites. The site name comes from the "
                        "folder (beer.stackexchange.com/Posts.xml) unless given as SITE=PATH")
    p.add_argument("--output", required=True, help="output folder; replaced atomically when the build completes")
    p.add_argument("--min-score", type=int, default=2, help="an answer needs at least this score to be a positive "
                                                            "(the paper: two up-votes)")
    p.add_argument("--negatives", type=int, default=16, help="negatives sampled per positive pair (the paper's "
                                                             "ratio is 15.7)")
    p.add_argument("--seed", type=int, default=13, help="seed of the negative sampling")
    p.add_argument("--dev-fraction", type=float, default=0.1, help="share of questions in dev (by question id hash)")
    p.add_argument("--test-fraction", type=float, default=0.1, help="share of questions in test")
    p.add_argument("--drop-code", action="store_true", help="drop <pre> code blocks from the text")
    p.add_argument("--fasttext-threshold", type=float, default=0.5,
                   help="fastText confidence below which langdetect decides the language")
    p.add_argument("--english-threshold", type=float, default=0.5,
                   help="probability of English the deciding model must give")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray started when not on a cluster")
    p.add_argument("--dry-run", action="store_true", help="print the resolved configuration and exit")
    args = p.parse_args(argv)
    sites, paths = [], []
    for spec in args.dump:
        site, sep, path = spec.partition("=")
        sites.append(site if sep else None)
        paths.append(path if sep else spec)
    cfg = BuildConfig(dumps=paths, output=args.output, min_score=args.min_score, negatives=args.negatives,
                      seed=args.seed, dev_fraction=args.dev_fraction, test_fraction=args.test_fraction,
                      keep_code=not args.drop_code, fasttext_threshold=args.fasttext_threshold,
                      english_threshold=args.english_threshold, sites=sites if any(sites) else [])
    return cfg, args


def summary(stats: dict) -> str:
    q, a = stats["questions"], stats["answers"]
    lines = [f"posts read          {stats['posts_in']:>10,}"]
    for section in ("questions", "answers", "other_posts"):
        part = stats[section]
        lines.append(f"{section:<19} {part['in']:>10,}  kept {part['kept']:,}")
        for reason, n in part["dropped"].items():
            lines.append(f"  - {reason:<28} {n:>8,}  ({DROP_REASONS.get(reason, '')})")
    pairs = stats["pairs"]
    lines.append(f"pairs written       {pairs['total']:>10,}  = {pairs['positive']:,} positive + "
                 f"{pairs['negative']:,} negative ({pairs['negatives_per_positive']} per positive; "
                 f"paper {stats['paper']['negatives_per_positive']})")
    for split, s in stats["splits"].items():
        lines.append(f"  {split:<6} {s['questions']:>7,} questions {s['rows']:>9,} rows {s['shards']:>4} shards")
    lines.append(f"kept {q['kept']:,} questions and {a['kept']:,} positive answers in {stats['seconds']} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    if args.dry_run:
        print(json.dumps(asdict(cfg), indent=2))
        return 0
    from crawl.dump import DumpError, check_readable
    from jobs.ray_env import run_on_ray
    from pipelines.stackexchangeqa import write

    try:
        for path in cfg.dumps:  # the common mistakes, reported before Ray starts
            check_readable(path)
    except DumpError as err:
        print(f"build_stackexchangeqa: error: {err}", file=sys.stderr)
        return 1
    stats, rc = run_on_ray("build_stackexchangeqa", lambda: write(cfg), args.num_cpus)
    if rc:
        return rc
    print(summary(stats))
    print(f"wrote {cfg.output}/{{train,dev,test}} and {cfg.output}/stats.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build StackExchangeQA from Stack Exchange dumps, the API, or question pages (GSAMN paper, section 3).

    python jobs/build_stackexchangeqa.py --dump PATH [--dump PATH ...] --output DIR \
        [--min-score 2] [--negatives K] [--seed S] [--hard-negatives minilm|ENCODER|RUN]
    python jobs/build_stackexchangeqa.py --source api --sites beer,coffee --output DIR [--api-key KEY]
    python jobs/build_stackexchangeqa.py --source pages --urls urls.txt --output DIR
    python jobs/build_stackexchangeqa.py --download beer,coffee --output DIR [--mirror URL] [--checksums F]

Crawled responses are cached in --cache (default DIR.cache): re-running after a crash re-parses them and
fetches only what is missing. URLs that failed are listed with their reasons in DIR/failures.jsonl.

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
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipelines.negatives import shortfall_text
from pipelines.stackexchangeqa import DROP_REASONS, BuildConfig
from runtime.checks import MissingInput, UsageError
from runtime.ray_env import add_local_ray_options

if TYPE_CHECKING:
    from inference.miner import ModelMiner


def parse_args(argv=None) -> tuple[BuildConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--source",
        choices=("dump", "api", "pages"),
        default="dump",
        help="where posts come from: dump files (--dump), the Stack Exchange API (--sites), or "
        "question pages (--urls); --dump may be combined with the others",
    )
    p.add_argument(
        "--dump",
        action="append",
        default=[],
        metavar="[SITE=]PATH",
        help="a Posts.xml or Posts.xml.gz; repeat for several sites. The site name comes from the "
        "folder (beer.stackexchange.com/Posts.xml) unless given as SITE=PATH",
    )
    p.add_argument(
        "--output",
        required=True,
        help="output folder: new, empty, or an earlier output of this job, which is replaced atomically "
        "when the new one is complete (a folder that holds an input, or anything else, is refused)",
    )
    p.add_argument(
        "--min-score",
        type=int,
        default=2,
        help="an answer needs at least this score to be a positive (the paper: two up-votes)",
    )
    p.add_argument(
        "--negatives",
        type=float,
        default=15.71,
        help="negatives sampled per positive pair; a "
        "fractional k gives floor(k) or floor(k)+1 per positive, seeded (default: the paper's 15.71)",
    )
    p.add_argument(
        "--rows-per-shard",
        type=int,
        default=100_000,
        help="rows per Parquet shard: at least this many, but for the last shard of a split",
    )
    p.add_argument(
        "--negative-pool",
        choices=("site", "any", "tag"),
        default="site",
        help="negatives are answers to other questions of the same site (default), any site, or the "
        "same site and tag; always from the same split",
    )
    p.add_argument(
        "--hard-negatives",
        default=None,
        metavar="MINER",
        help="mine negatives with a model instead of sampling them at random: 'minilm' (the shipped "
        "MiniLM bi-encoder), 'mpnet-base', a sentence encoder folder, or a run or checkpoint folder of "
        "jobs/train.py (which re-ranks --mine-retriever's shortlist); each question gets the top-ranked "
        "answers of its pool that are not its own and not near-duplicates of its positives, as many as "
        "random sampling would give it (pipelines/hard_negatives.py)",
    )
    p.add_argument(
        "--mine-retriever",
        default="minilm",
        help="with a checkpoint as --hard-negatives: the sentence encoder whose shortlist it re-ranks",
    )
    p.add_argument(
        "--mine-candidates",
        type=int,
        default=64,
        help="with a checkpoint as --hard-negatives: the retriever's candidates per question it re-ranks",
    )
    p.add_argument(
        "--mine-max-similarity",
        type=float,
        default=0.95,
        help="the false-negative guard: a candidate whose cosine with one of the question's positives "
        "reaches this is never its negative",
    )
    p.add_argument("--mine-batch-size", type=int, default=64, help="texts the miner embeds or scores at once")
    p.add_argument("--mine-max-len", type=int, default=256, help="word pieces per text for the miner's encoder")
    p.add_argument("--mine-gpus", type=float, default=0.0, help="GPUs per mining task (0: CPUs)")
    p.add_argument("--seed", type=int, default=13, help="seed of the negative sampling")
    p.add_argument("--dev-fraction", type=float, default=0.1, help="share of questions in dev (by question id hash)")
    p.add_argument("--test-fraction", type=float, default=0.1, help="share of questions in test")
    p.add_argument("--drop-code", action="store_true", help="drop <pre> code blocks from the text")
    p.add_argument(
        "--fasttext-threshold",
        type=float,
        default=0.5,
        help="fastText confidence below which langdetect decides the language",
    )
    p.add_argument(
        "--language-chars",
        type=int,
        default=200,
        help="fastText reads the first N characters of a text (0: all of it); on real Stack Exchange "
        "texts 200 change one English decision in 2,605 against the whole text, 500 none, at 1.5x the "
        "language ID time",
    )
    p.add_argument(
        "--english-threshold", type=float, default=0.5, help="probability of English the deciding model must give"
    )
    p.add_argument(
        "--download",
        default="",
        metavar="SITE,...|all",
        help="download these sites' .7z dumps from --mirror (resuming partial files) and build from "
        "them; 'all' takes every site in --sites-xml",
    )
    p.add_argument(
        "--mirror",
        default="https://archive.org/download/stackexchange",
        help="dump mirror: SITE.7z is fetched from MIRROR/SITE.7z",
    )
    p.add_argument("--checksums", default=None, help="md5sum/sha256sum-format file or URL to verify archives")
    p.add_argument("--sites-xml", default=None, help="a dump's Sites.xml, listing the sites for --download all")
    p.add_argument("--include-meta", action="store_true", help="--download all: include meta sites")
    p.add_argument("--download-dir", default=None, help="where archives go; default OUTPUT.downloads")
    p.add_argument(
        "--dedup",
        choices=("near", "exact", "off"),
        default="near",
        help="remove duplicate answers: near (MinHash LSH, includes exact), exact, or off",
    )
    p.add_argument(
        "--near-duplicate-threshold",
        type=float,
        default=0.8,
        help="estimated Jaccard similarity of word 5-grams above which answers are duplicates",
    )
    p.add_argument(
        "--exclude-overlap",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="drop posts overlapping a test set: wikiqa=DIR|WikiQA-test.tsv, trecqa=TEST.xml|castorini "
        "dir, semeval=XML, insuranceqa=DIR, lines=FILE (one text per line); repeatable",
    )
    p.add_argument("--overlap-ngram", type=int, default=13, help="shared word n-gram length that counts as overlap")
    p.add_argument(
        "--sites", default="", help="API source: comma-separated sites (beer, stackoverflow, pt.stackoverflow or hosts)"
    )
    p.add_argument("--urls", default=None, help="pages source: a file with one question URL per line")
    p.add_argument("--cache", default=None, help="crawl cache (content-addressed responses); default OUTPUT.cache")
    p.add_argument(
        "--api-key",
        default=os.environ.get("STACKEXCHANGE_API_KEY"),
        help="API key (raises the daily quota to 10,000); default $STACKEXCHANGE_API_KEY",
    )
    p.add_argument("--api-base-url", default="https://api.stackexchange.com/2.3", help="API root URL")
    p.add_argument("--api-filter", default="withbody", help="API filter; one that embeds answers saves calls")
    p.add_argument("--api-max-pages", type=int, default=None, help="API: at most this many question pages per site")
    p.add_argument(
        "--requests-per-second",
        type=float,
        default=1.0,
        help="page requests per second per host, across all crawler workers",
    )
    p.add_argument(
        "--api-requests-per-second",
        type=float,
        default=10.0,
        help="API requests per second per method, across all workers (the API allows 30 per IP)",
    )
    p.add_argument("--crawlers", type=int, default=4, help="concurrent crawler actors")
    p.add_argument("--max-retries", type=int, default=4, help="retries of a 429/5xx/reset/timeout per URL")
    p.add_argument(
        "--read-range-mb",
        type=int,
        default=16,
        help="a plain Posts.xml is read by parallel tasks in byte ranges of at most this many MB",
    )
    p.add_argument(
        "--partition-mb",
        type=int,
        default=32,
        help="MB of dump per shuffle partition (threads, duplicate keys, negative buckets): what one "
        "task holds at a time (at least 16 partitions; they set the shards' row order, so a build with "
        "another value writes the same rows in another order)",
    )
    add_local_ray_options(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the inputs and the output folder as a run would, print the resolved "
        "configuration and exit (2 where the run would be refused)",
    )
    args = p.parse_args(argv)
    if args.source == "dump" and not args.dump and not args.download:
        p.error("--dump or --download is required with --source dump")
    if args.download.strip() == "all" and not args.sites_xml:
        p.error("--download all needs --sites-xml (the Sites.xml of a dump) to know the sites")
    if args.download.strip() not in ("", "all"):
        from crawl.sites import check_site_names

        try:
            check_site_names("--download", [name for name in args.download.split(",") if name.strip()])
        except UsageError as error:
            p.error(str(error))
    if args.source == "api" and not args.sites.strip(" ,"):  # `--sites ,` too: it failed after Ray had started
        p.error("--sites is required with --source api")
    if args.source == "pages" and not args.urls:
        p.error("--urls is required with --source pages")
    # another source's options were ignored in silence (`--dump X --sites beer` built X, naming it as before)
    for option, value, source in (
        ("--sites", args.sites.strip(" ,"), "api"),
        ("--api-max-pages", args.api_max_pages, "api"),
        ("--urls", args.urls, "pages"),
    ):
        if value is not None and value != "" and args.source != source:
            hint = (
                "; a dump's site is named as --dump SITE=PATH" if option == "--sites" and args.source == "dump" else ""
            )
            p.error(f"{option} {value}: read only with --source {source} (this build's source is {args.source}){hint}")
    exclude = {}
    for spec in args.exclude_overlap:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            p.error(f"--exclude-overlap {spec!r}: expected NAME=PATH")
        if not os.path.exists(path):
            p.error(f"--exclude-overlap {spec!r}: {path}: no such file or folder")
        exclude[name] = path
    urls = []
    if args.urls:
        from crawl.sources import read_urls

        try:
            urls = read_urls(args.urls)
        except (OSError, ValueError) as err:
            p.error(f"--urls {err}")
        if not urls:  # it passed --dry-run and failed after Ray had started ("nothing to build from")
            p.error(f"--urls {args.urls}: no URL in it (one http(s) URL a line; blank and # lines are skipped)")
    sites, paths = [], []
    for spec in args.dump:
        site, sep, path = spec.partition("=")
        sites.append(site if sep else None)
        paths.append(path if sep else spec)
    try:
        cfg = _config(args, paths, sites, exclude, urls)
    except UsageError as error:
        p.error(str(error))
    return cfg, args


def _config(args, paths: list[str], sites: list, exclude: dict, urls: list[str]) -> BuildConfig:
    return BuildConfig(
        dumps=paths,
        output=args.output,
        min_score=args.min_score,
        negatives=args.negatives,
        negative_pool=args.negative_pool,
        hard_negatives=args.hard_negatives,
        mine_retriever=args.mine_retriever,
        mine_candidates=args.mine_candidates,
        mine_max_similarity=args.mine_max_similarity,
        mine_batch_size=args.mine_batch_size,
        mine_max_len=args.mine_max_len,
        mine_gpus=args.mine_gpus,
        dedup=args.dedup,
        rows_per_shard=args.rows_per_shard,
        read_range_mb=args.read_range_mb,
        partition_mb=args.partition_mb,
        near_duplicate_threshold=args.near_duplicate_threshold,
        exclude_test_sets=exclude,
        overlap_ngram=args.overlap_ngram,
        seed=args.seed,
        dev_fraction=args.dev_fraction,
        test_fraction=args.test_fraction,
        keep_code=not args.drop_code,
        fasttext_threshold=args.fasttext_threshold,
        language_chars=args.language_chars or None,
        english_threshold=args.english_threshold,
        sites=sites if any(sites) else [],
        api_sites=[x.strip() for x in args.sites.split(",") if x.strip()],
        urls=urls,
        cache_dir=args.cache,
        api_key=args.api_key,
        api_base_url=args.api_base_url,
        api_filter=args.api_filter,
        api_max_pages=args.api_max_pages,
        requests_per_second=args.requests_per_second,
        api_requests_per_second=args.api_requests_per_second,
        crawlers=args.crawlers,
        max_retries=args.max_retries,
    )


def summary(stats: dict) -> str:
    q, a = stats["questions"], stats["answers"]
    lines = [f"posts read          {stats['posts_in']:>10,}"]
    if stats.get("fetch_failures"):
        lines.append(f"fetch failures      {stats['fetch_failures']:>10,}  (URLs and reasons in failures.jsonl)")
        for reason, n in list(stats.get("fetch_failure_reasons", {}).items())[:5]:
            lines.append(f"  - {reason:<60} {n:>6,}")
    for section in ("questions", "answers", "other_posts"):
        part = stats[section]
        lines.append(f"{section:<19} {part['in']:>10,}  kept {part['kept']:,}")
        for reason, n in part["dropped"].items():
            lines.append(f"  - {reason:<28} {n:>8,}  ({DROP_REASONS.get(reason, '')})")
    pairs = stats["pairs"]
    lines.append(
        f"pairs written       {pairs['total']:>10,}  = {pairs['positive']:,} positive + "
        f"{pairs['negative']:,} negative ({pairs['negatives_per_positive']} per positive; "
        f"paper {stats['paper']['negatives_per_positive']})"
    )
    if pairs.get("negatives_short"):
        config = stats["config"]
        mined = stats.get("negatives", {}).get("drawn") == "mined"
        short = shortfall_text(pairs["negatives_short"], config["negatives"], config["negative_pool"], mined)
        lines.append(f"  {short}")
    for split, s in stats["splits"].items():
        lines.append(f"  {split:<6} {s['questions']:>7,} questions {s['rows']:>9,} rows {s['shards']:>4} shards")
    lines.append(f"kept {q['kept']:,} questions and {a['kept']:,} positive answers in {stats['seconds']} s")
    return "\n".join(lines)


def check_inputs(cfg: BuildConfig, args: argparse.Namespace) -> ModelMiner | None:
    """What the build would refuse first, before any download or Ray (and all that --dry-run checks): dumps that
    are missing, an output folder that would destroy something (it holds a dump, the crawl cache, a test set to
    exclude, the URL list, the downloads or the miner, or it is not an earlier build), dumps that cannot be read,
    and a --hard-negatives miner that cannot be loaded. Returns that miner (None: random negatives)."""
    from crawl.dump import DumpError, check_readable
    from pipelines.atomic import check_folder_can_be_made, check_output
    from pipelines.overlap import check_test_sets
    from pipelines.stackexchangeqa import JOB, earlier_build

    for path in cfg.dumps:
        if not os.path.exists(path):
            raise MissingInput(f"--dump {path}: no such file or folder")
    others = [
        args.urls,
        args.sites_xml,
        args.download_dir,
        args.checksums if "://" not in (args.checksums or "") else None,
    ]
    check_output(cfg.output, JOB, cfg.input_paths() + [p for p in others if p], earlier_build)
    for option, folder in (("--cache", args.cache), ("--download-dir", args.download_dir)):
        if folder:  # an existing file there failed after Ray had started ([Errno 17] File exists)
            check_folder_can_be_made(folder, f"{option} {folder}")
    try:  # each test set read up to its first text: another file given as WikiQA failed in the build
        check_test_sets(cfg.exclude_test_sets)
    except (OSError, ValueError) as error:
        raise UsageError(f"--exclude-overlap {error}") from None
    for path in cfg.dumps:  # a folder without a dump, an empty file, not gzip, another file of the dump: refused
        try:
            check_readable(path)
        except DumpError as error:
            raise MissingInput(f"--dump {error}") from None
    if args.download:  # the local files a download reads, read here: --dry-run passed a malformed Sites.xml
        check_download_lists(args)
    from inference.miner import check_miner, miner_of

    miner = miner_of(cfg)
    if miner is not None:
        from runtime.ray_env import check_fits_local_ray

        check_fits_local_ray("--mine-gpus", unit="mining task", gpus=cfg.mine_gpus)
        check_miner(miner.spec)
    return miner


def requested_sites(args: argparse.Namespace) -> list[str]:
    """The sites --download names: its comma-separated list, or for `all` every site --sites-xml lists
    (DownloadError for a malformed one)."""
    from crawl.download import parse_sites_xml

    wanted = args.download.strip()
    if wanted == "all":
        return parse_sites_xml(args.sites_xml, args.include_meta)
    return [s.strip() for s in wanted.split(",") if s.strip()]


def check_download_lists(args: argparse.Namespace) -> None:
    """--sites-xml (for --download all) must list sites, and a local --checksums file must hold a checksum for
    every archive to download: an archive without one is taken unchecked (a README given there verified nothing)."""
    from crawl.download import DownloadError, archive_name, load_checksums

    try:
        sites = requested_sites(args)
    except DownloadError as error:  # only --sites-xml is read
        raise UsageError(f"--sites-xml {error}") from None
    if not sites and args.download.strip() == "all":
        raise UsageError(f"--sites-xml {args.sites_xml}: lists no site (rows with a Url)")
    if args.checksums and "://" not in args.checksums:
        try:
            sums = load_checksums(args.checksums)
        except (OSError, ValueError) as error:  # UnicodeDecodeError too
            raise UsageError(f"--checksums {args.checksums}: cannot read it ({error})") from None
        unchecked = [archive_name(site) for site in sites if archive_name(site) not in sums]
        if unchecked:
            shown = ", ".join(unchecked[:3]) + (f" and {len(unchecked) - 3} more" if len(unchecked) > 3 else "")
            raise UsageError(
                f"--checksums {args.checksums}: no checksum for {shown} (md5sum or sha256sum lines, 'HEX  NAME'); "
                "an archive without one would be taken unchecked"
            )


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    from crawl.dump import DumpError, check_readable
    from runtime.errors import fail

    try:
        miner = check_inputs(cfg, args)
    except (UsageError, DumpError) as err:
        return fail("build_stackexchangeqa", err)
    if args.dry_run:
        shown = asdict(cfg)
        shown["api_key"] = "***" if cfg.api_key else None
        shown["urls"] = f"{len(cfg.urls)} URLs" if cfg.urls else []
        print(json.dumps(shown, indent=2))
        return 0
    if args.download:
        from crawl.download import DownloadConfig, DownloadError, download_sites, load_checksums

        try:
            sites = requested_sites(args)
            dl_cfg = DownloadConfig(
                dest=args.download_dir or os.path.abspath(cfg.output) + ".downloads",
                mirror=args.mirror,
                checksums=load_checksums(args.checksums),
                require_checksum=bool(args.checksums),  # a URL's list is read only here: a site it lacks is refused
            )
            downloaded = download_sites(sites, dl_cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
            for path in downloaded:
                check_readable(path)
            cfg.dumps += downloaded
            cfg.sites = cfg.sites + [None] * (len(cfg.dumps) - len(cfg.sites)) if cfg.sites else []
        except (DownloadError, DumpError, OSError) as err:
            return fail("build_stackexchangeqa", err)
    from pipelines.stackexchangeqa import write
    from runtime.ray_env import run_on_ray

    stats, rc = run_on_ray("build_stackexchangeqa", lambda: write(cfg, miner), args.num_cpus, verbose=args.verbose)
    if rc:
        return rc
    print(f"{summary(stats)}; wrote {cfg.output}/{{train,dev,test}} and stats.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stages 1-2, per post: the sources read as POSTS rows (dumps, the API, pages), then HTML to text, language ID
and test-set overlap in the same tasks, and each post's thread key."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc

from crawl.dump import ANSWER, QUESTION, posts_dataset
from pipelines.blocks import release_unused_memory, trim_when_idle
from pipelines.langid import LanguageIdentifier
from pipelines.stackexchangeqa.config import BuildConfig
from pipelines.text import html_to_text

DUPLICATE_MARK = -2  # post_type of the rows that carry "this answer duplicates that one" into its thread


def clean_text(batch: pa.Table, keep_code: bool = True) -> pa.Table:
    """Add `text`: title and body as text for questions, body as text for answers; drop the HTML."""
    titles = batch.column("title").to_pylist()
    bodies = batch.column("body").to_pylist()
    texts = []
    for title, body in zip(titles, bodies):
        body_text = html_to_text(body, keep_code=keep_code)
        texts.append(f"{title}\n{body_text}".strip() if title else body_text)
    batch = batch.drop_columns(["body"])
    return batch.append_column("text", pa.array(texts, pa.string()))


ANALYSED_DROPS = ("title", "creation_date", "line")


class PostAnalysis:
    """Per-post stages together: HTML to text, language ID, test-set overlap (when configured) and the
    thread key. A class because it loads fastText (and the test-set index)."""

    def __init__(
        self,
        keep_code: bool = True,
        unsure_below: float = 0.5,
        index_ref=None,
        overlap_ngram: int = 13,
        language_chars: int | None = 200,
    ):
        from pipelines.overlap import OverlapFilter

        self.keep_code = keep_code
        self.language = LanguageIdentifier(unsure_below=unsure_below, max_chars=language_chars)
        self.overlap = OverlapFilter(index_ref, overlap_ngram) if index_ref else None

    def __call__(self, batch: pa.Table) -> pa.Table:
        batch = self.language(clean_text(batch, keep_code=self.keep_code))
        if self.overlap is not None:
            batch = self.overlap(batch)
        # The title is inside `text` now, and nothing after this stage reads the date (the licence is derived)
        # or the dump line: fewer bytes through the object store and the shuffles.
        return thread_key(batch.drop_columns([c for c in ANALYSED_DROPS if c in batch.column_names]))


_ANALYSERS: dict[tuple, PostAnalysis] = {}


def analyse_posts(batch: pa.Table, **options) -> pa.Table:
    """`PostAnalysis` as a task function, its models loaded once per worker process and then reused.

    Tasks rather than an actor pool: fused with the dump reader, each task reads and analyses one byte range
    and then gives its CPU back, so the shuffle after it can always be scheduled (an actor pool holds its CPUs
    for the whole stream; on 2 CPUs that deadlocked), and one big Posts.xml is analysed on every core.
    """
    trim_when_idle()
    index_ref = options.get("index_ref")
    key = tuple(sorted((k, v) for k, v in options.items() if k != "index_ref")) + (
        tuple(r.hex() for r in index_ref) if index_ref else (),
    )
    analyser = _ANALYSERS.get(key)
    if analyser is None:
        analyser = _ANALYSERS[key] = PostAnalysis(**options)
    result = analyser(batch)
    release_unused_memory()
    return result


def thread_key(batch: pa.Table) -> pa.Table:
    post_type = batch.column("post_type")
    thread = pc.if_else(
        pc.equal(post_type, QUESTION),
        batch.column("id"),
        pc.if_else(pc.equal(post_type, ANSWER), batch.column("parent_id"), pa.scalar(-1, pa.int64())),
    )
    return batch.append_column("thread", thread)


def mark_rows(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    """Duplicate marks shaped as post rows (post_type DUPLICATE_MARK, `failure` = the kept answer's id)."""
    n = batch.num_rows
    columns = {
        "site": batch["site"],
        "id": batch["id"],
        "thread": batch["thread"],
        "post_type": pa.array([DUPLICATE_MARK] * n, pa.int8()),
        "failure": batch["duplicate_of"],
    }
    return pa.table(
        {f.name: columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema},
        schema=schema,
    )


def crawl_config(cfg: BuildConfig):
    from crawl.api import ApiConfig
    from crawl.sources import CrawlConfig

    return CrawlConfig(
        cache_dir=cfg.cache_dir or os.path.abspath(cfg.output) + ".cache",
        api_sites=cfg.api_sites,
        urls=cfg.urls,
        api=ApiConfig(base_url=cfg.api_base_url, key=cfg.api_key, filter=cfg.api_filter, max_pages=cfg.api_max_pages),
        requests_per_second=cfg.requests_per_second,
        api_requests_per_second=cfg.api_requests_per_second,
        respect_robots=cfg.respect_robots,
        crawlers=cfg.crawlers,
        max_retries=cfg.max_retries,
    )


def source_posts(cfg: BuildConfig):
    """POSTS rows from every source the config names: dump files, API sites, page URLs."""
    from crawl.sources import crawled_posts

    if not (cfg.dumps or cfg.api_sites or cfg.urls):
        raise ValueError("nothing to build from: give dumps, API sites or page URLs")
    parts = []
    if cfg.dumps:
        parts.append(
            posts_dataset(
                cfg.dumps,
                cfg.sites or None,
                max_range_bytes=cfg.read_range_mb << 20,
                min_range_bytes=min(8, cfg.read_range_mb) << 20,
            )
        )
    if cfg.api_sites or cfg.urls:
        parts.append(crawled_posts(crawl_config(cfg)))
    return parts[0] if len(parts) == 1 else parts[0].union(*parts[1:])

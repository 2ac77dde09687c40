"""All three acquisition routes as Ray Data datasets of the same POSTS rows.

- dumps: `crawl.dump.posts_dataset` (byte ranges of a plain Posts.xml read in parallel, gzip/7z one task each);
- API: one task per site pages through `/questions` (`ApiCrawlStage`);
- pages: URL batches spread over crawler actors (`PageCrawlStage`).

Every crawler shares one rate limiter actor per cluster, so per-host and per-method budgets hold across all
workers and nodes; every response goes through the content-addressed cache in `cache_dir`, so a killed
crawl re-run re-parses what it has and fetches only what it lacks. A URL that yields no posts becomes one
FETCH_FAILED row with its reason: failures travel with the data into the funnel instead of vanishing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from crawl.api import ApiClient, ApiConfig
from crawl.dump import ANSWER, FETCH_FAILED, POSTS, QUESTION, licence_for
from crawl.http import FetchConfig, Fetcher, host_of
from crawl.pages import crawl_question
from crawl.sites import api_site, site_host
from runtime.errors import scrub


def record_to_posts(record: dict, origin: str) -> list[dict]:
    """A crawl record (question with answers) as POSTS rows: the question, then its answers."""
    site, qid = record["site"], record["question_id"]
    question = {
        "site": site,
        "id": qid,
        "post_type": QUESTION,
        "parent_id": -1,
        "accepted_answer_id": record.get("accepted_answer_id", -1),
        "score": record.get("score", 0),
        "title": record.get("title", ""),
        "body": record.get("body", ""),
        "tags": record.get("tags", []),
        "creation_date": record.get("creation_date", ""),
        "line": -1,
        "origin": origin,
        "licence": licence_for(record.get("creation_date", ""), record.get("licence")),
        "failure": "",
        "author_id": record.get("author_id"),
        "author": record.get("author", ""),
    }
    rows = [question]
    for answer in record.get("answers", []):
        rows.append(
            {
                "site": site,
                "id": answer["id"],
                "post_type": ANSWER,
                "parent_id": qid,
                "accepted_answer_id": -1,
                "score": answer.get("score", 0),
                "title": "",
                "body": answer.get("body", ""),
                "tags": [],
                "creation_date": answer.get("creation_date", ""),
                "line": -1,
                "origin": origin,
                "licence": licence_for(answer.get("creation_date", ""), answer.get("licence")),
                "failure": "",
                "author_id": answer.get("author_id"),
                "author": answer.get("author", ""),
            }
        )
    return rows


def failure_row(url: str, reason: str, site: str = "") -> dict:
    """A URL that failed, as a POSTS row; secrets in the URL or the reason are scrubbed (the row reaches
    failures.jsonl and the data card)."""
    return {
        "site": site,
        "id": -1,
        "post_type": FETCH_FAILED,
        "parent_id": -1,
        "accepted_answer_id": -1,
        "score": 0,
        "title": "",
        "body": "",
        "tags": [],
        "creation_date": "",
        "line": -1,
        "origin": scrub(url),
        "licence": "",
        "failure": scrub(reason) or "failed",
        "author_id": None,
        "author": "",
    }


@dataclass
class CrawlConfig:
    cache_dir: str
    api_sites: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    api: ApiConfig = field(default_factory=ApiConfig)
    allowed_hosts: list[str] = field(default_factory=list)  # pages: default the hosts of `urls`
    requests_per_second: float = 1.0  # per host (pages) or per API method, across the cluster
    api_requests_per_second: float = 10.0
    max_retries: int = 4
    backoff_base: float = 1.0
    timeout: float = 30.0
    respect_robots: bool = True
    user_agent: str | None = None
    crawlers: int = 4  # concurrent crawler actors (I/O bound: they take a quarter CPU each)
    limiter_name: str = "stackexchange-crawl"

    def fetch_config(self, hosts) -> FetchConfig:
        extra: dict[str, Any] = {"user_agent": self.user_agent} if self.user_agent else {}
        api_host = host_of(self.api.base_url)
        return FetchConfig(
            allowed_hosts=tuple(hosts),
            cache_dir=self.cache_dir,
            requests_per_second=self.requests_per_second,
            max_retries=self.max_retries,
            backoff_base=self.backoff_base,
            timeout=self.timeout,
            respect_robots=self.respect_robots,
            rates={
                f"{api_host}/questions": self.api_requests_per_second,
                f"{api_host}/questions/answers": self.api_requests_per_second,
            },
            **extra,
        )


class PageCrawlStage:
    """Question URLs (column `url`) to POSTS rows; one Fetcher per actor, one limiter for all."""

    def __init__(self, fetch_cfg: FetchConfig, limiter):
        self.fetcher = Fetcher(fetch_cfg, limiter)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = []
        for url in batch.column("url").to_pylist():
            record, failures = crawl_question(self.fetcher, url)
            if record is not None:
                rows.extend(record_to_posts(record, url))
            rows.extend(failure_row(f["url"], f["reason"], host_of(url)) for f in failures)
        return pa.Table.from_pylist(rows, schema=POSTS)


class ApiCrawlStage:
    """Site names (column `site`) to POSTS rows, one table per page of questions."""

    def __init__(self, fetch_cfg: FetchConfig, api_cfg: ApiConfig, limiter):
        self.client = ApiClient(Fetcher(fetch_cfg, limiter), api_cfg)

    def __call__(self, batch: pa.Table):
        for site in batch.column("site").to_pylist():
            for records, failures in self.client.questions(api_site(site)):
                rows = [row for r in records for row in record_to_posts(r, r.get("url") or site)]
                rows += [failure_row(f["url"], f["reason"], site_host(site)) for f in failures]
                if rows:
                    yield pa.Table.from_pylist(rows, schema=POSTS)


def read_urls(path: str) -> list[str]:
    """One URL per line; blank lines and `#` comments skipped; anything not http(s) is an error naming the line,
    and a file that cannot be read as text an error naming the file (OSError or ValueError, the path first)."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: a folder; name the file of URLs")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    urls = []
    with open(path, encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                if not host_of(line):
                    raise ValueError(f"{path}: line {number}: not an http(s) URL: {line[:200]!r}")
                urls.append(line)
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not UTF-8 text; name the file of URLs, one a line") from None
    return urls


def crawled_posts(cfg: CrawlConfig):
    """POSTS rows from the API sites and page URLs of `cfg`, crawled by Ray actors spread over the cluster."""
    import ray.data

    from crawl.ratelimit import shared_limiter

    os.makedirs(cfg.cache_dir, exist_ok=True)
    limiter = shared_limiter(cfg.limiter_name, default_rate=cfg.requests_per_second)
    parts = []
    actor_options: dict[str, Any] = {
        "num_cpus": 0.25,
        "compute": ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, cfg.crawlers)),
        "batch_format": "pyarrow",
    }
    if cfg.api_sites:
        fetch_cfg = cfg.fetch_config([host_of(cfg.api.base_url)])
        sites = ray.data.from_items(
            [{"site": site_host(s)} for s in dict.fromkeys(cfg.api_sites)], override_num_blocks=len(set(cfg.api_sites))
        )
        parts.append(
            sites.map_batches(
                ApiCrawlStage,
                batch_size=1,
                fn_constructor_kwargs={"fetch_cfg": fetch_cfg, "api_cfg": cfg.api, "limiter": limiter},
                **actor_options,
            )
        )
    if cfg.urls:
        hosts = cfg.allowed_hosts or sorted({host_of(u) for u in cfg.urls})
        fetch_cfg = cfg.fetch_config(hosts)
        urls = list(dict.fromkeys(cfg.urls))
        blocks = max(1, min(len(urls), cfg.crawlers * 4))
        table = ray.data.from_items([{"url": u} for u in urls], override_num_blocks=blocks)
        parts.append(
            table.map_batches(
                PageCrawlStage,
                batch_size=8,
                fn_constructor_kwargs={"fetch_cfg": fetch_cfg, "limiter": limiter},
                **actor_options,
            )
        )
    if not parts:
        raise ValueError("nothing to crawl: give API sites or page URLs")
    return parts[0] if len(parts) == 1 else parts[0].union(*parts[1:])

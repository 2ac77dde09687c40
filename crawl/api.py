"""Questions and answers from the Stack Exchange API (v2.3), with the API's rules kept to the letter.

Rules (https://api.stackexchange.com/docs/throttle):
- a response's `backoff` field: no further call to the same method before that many seconds pass;
- `quota_remaining` reaching zero: stop, the daily quota of the key (or the IP without a key) is spent;
- HTTP 429/5xx and `throttle_violation` (error 502): retried with exponential backoff and jitter;
- never more than the configured requests per second (the API refuses more than 30/s per IP).

Questions come from `/questions` sorted by creation date, page by page. With the built-in `withbody`
filter, answers come from `/questions/{ids}/answers` in batches of up to 100 question ids; a custom filter
that embeds `answers` in questions saves those calls and is used as given. Bodies arrive as HTML (`body`)
or, with some filters, as entity-escaped Markdown (`body_markdown`), turned into simple HTML here so later
stages see one format.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from crawl.http import Fetcher, host_of

API_BASE = "https://api.stackexchange.com/2.3"
THROTTLE_ERROR = 502
_SECONDS = re.compile(r"(\d+) seconds")


@dataclass
class ApiConfig:
    base_url: str = API_BASE
    key: str | None = None  # raises the daily quota from 300 to 10,000 requests
    filter: str = "withbody"
    page_size: int = 100
    max_pages: int | None = None  # per site; None: until `has_more` is false
    fromdate: int | None = None  # unix seconds
    todate: int | None = None
    throttle_retries: int = 3

    def __post_init__(self):
        if not 1 <= self.page_size <= 100:
            raise ValueError(f"page_size must be 1..100 (the API's limit), got {self.page_size}")


class QuotaExhausted(RuntimeError):
    pass


def iso_date(epoch) -> str:
    if epoch in (None, ""):
        return ""
    return datetime.fromtimestamp(int(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def markdown_to_html(markdown: str) -> str:
    """Entity-escaped Markdown (the API's `body_markdown`) to simple HTML: code blocks (indented or fenced)
    become `<pre><code>`, other blocks `<p>`, links keep their text. Enough for text extraction."""
    text = html.unescape(markdown or "").replace("\r\n", "\n").replace("\r", "\n")
    blocks: list[str] = []
    paragraph: list[str] = []
    code: list[str] = []
    fenced = False

    def flush_paragraph():
        if paragraph:
            words = _LINK.sub(r"\1", " ".join(line.strip() for line in paragraph))
            blocks.append(f"<p>{html.escape(words, quote=False)}</p>")
            paragraph.clear()

    def flush_code():
        while code and not code[-1].strip():
            code.pop()
        if code:
            blocks.append(f"<pre><code>{html.escape(chr(10).join(code), quote=False)}</code></pre>")
            code.clear()

    for line in text.split("\n"):
        if _FENCE.match(line.strip()):
            if fenced:
                flush_code()
            else:
                flush_paragraph()
            fenced = not fenced
        elif fenced:
            code.append(line)
        elif line.startswith(("    ", "\t")) and (code or not paragraph):
            code.append(line[4:] if line.startswith("    ") else line[1:])
        elif not line.strip():
            if code and not fenced:
                code.append("")
            else:
                flush_paragraph()
        else:
            flush_code()
            paragraph.append(line)
    flush_paragraph()
    flush_code()
    return "\n".join(blocks)


def _body(item: dict) -> str:
    if item.get("body") is not None:
        return item["body"]
    return markdown_to_html(item.get("body_markdown", ""))


def _owner(item: dict) -> dict:
    """The post's author from the API's `owner` (a shallow_user; absent when the filter leaves it out).
    Display names come HTML-escaped; deleted users have a name but no `user_id`."""
    owner = item.get("owner") or {}
    user_id = owner.get("user_id")
    return {
        "author_id": int(user_id) if user_id is not None else None,
        "author": html.unescape(owner.get("display_name", "")),
    }


def answer_record(item: dict) -> dict:
    return {
        "id": int(item["answer_id"]),
        "body": _body(item),
        "score": int(item.get("score", 0)),
        "accepted": bool(item.get("is_accepted", False)),
        "creation_date": iso_date(item.get("creation_date")),
        "licence": item.get("content_license", ""),
        **_owner(item),
    }


def question_record(item: dict, site: str) -> dict:
    """An API question item (with `answers` when the filter embeds them) as a crawl record."""
    link = item.get("link", "")
    return {
        "site": host_of(link) or site,
        "question_id": int(item["question_id"]),
        "title": html.unescape(item.get("title", "")),
        "body": _body(item),
        "tags": list(item.get("tags", [])),
        "creation_date": iso_date(item.get("creation_date")),
        "score": int(item.get("score", 0)),
        "accepted_answer_id": int(item.get("accepted_answer_id", -1)),
        "answers": [answer_record(a) for a in item.get("answers", [])],
        "licence": item.get("content_license", ""),
        **_owner(item),
        "url": link,
    }


def _json_problem(body: bytes) -> str:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return f"invalid JSON ({getattr(err, 'msg', err)} at byte {getattr(err, 'pos', '?')})"
    if not isinstance(data, dict):
        return "JSON is not an object"
    return ""


class ApiClient:
    """Pages through one site's questions; failures come back as {url, reason} instead of raising."""

    def __init__(self, fetcher: Fetcher, cfg: ApiConfig):
        self.fetcher, self.cfg = fetcher, cfg
        self.host = host_of(cfg.base_url)
        self.calls = 0  # responses fetched from the network (not the cache)
        self.last_quota: int | None = None

    def call(self, method: str, path: str, params: dict) -> tuple[dict | None, str]:
        """(response JSON, '') or (None, reason). `method` names the backoff bucket, e.g. 'questions'."""
        params = {k: v for k, v in params.items() if v is not None}
        if self.cfg.key:
            params["key"] = self.cfg.key
        limit_key = f"{self.host}/{method}"
        for _ in range(self.cfg.throttle_retries + 1):
            result = self.fetcher.get(
                self.cfg.base_url + path,
                params,
                limit_key=limit_key,
                check_robots=False,
                cache_errors=False,
                validate=_json_problem,
            )
            try:
                data = result.json() if result.body else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                data = None  # an error page in HTML: the status tells the story
            if not result.from_cache and isinstance(data, dict):
                if data.get("backoff"):
                    self.fetcher.limiter.hold(limit_key, float(data["backoff"]))
                if "quota_remaining" in data:
                    self.last_quota = int(data["quota_remaining"])
            if result.ok and isinstance(data, dict) and "items" in data:
                self.calls += 0 if result.from_cache else 1
                return data, ""
            if isinstance(data, dict) and data.get("error_id") == THROTTLE_ERROR:
                wait = _SECONDS.search(data.get("error_message", ""))
                self.fetcher.limiter.hold(limit_key, float(wait.group(1)) if wait else 30.0)
                continue
            if isinstance(data, dict) and "error_id" in data:
                return None, (
                    f"{result.url}: API error {data['error_id']} {data.get('error_name', '')}: "
                    f"{data.get('error_message', '')}"
                )
            if result.ok:
                return None, f"{result.url}: response has no 'items'"
            return None, f"{result.url}: {result.reason or 'HTTP ' + str(result.status)}"
        return None, f"{self.cfg.base_url + path}: still throttled after {self.cfg.throttle_retries + 1} tries"

    def _attach_answers(self, site: str, records: list[dict]) -> list[dict]:
        failures = []
        by_id = {r["question_id"]: r for r in records}
        ids = ";".join(str(i) for i in sorted(by_id))
        page = 1
        while ids:
            data, reason = self.call(
                "questions/answers",
                f"/questions/{ids}/answers",
                {
                    "site": site,
                    "filter": self.cfg.filter,
                    "pagesize": 100,
                    "page": page,
                    "sort": "creation",
                    "order": "asc",
                },
            )
            if data is None:
                failures.append({"url": f"{self.cfg.base_url}/questions/{ids}/answers", "reason": reason})
                for record in records:  # answers unknown: the questions cannot be judged, so drop them
                    record["answers_failed"] = True
                break
            for item in data["items"]:
                parent = by_id.get(int(item.get("question_id", -1)))
                if parent is not None:
                    parent["answers"].append(answer_record(item))
            if not data.get("has_more") or self._quota_spent():
                break
            page += 1
        return failures

    def _quota_spent(self) -> bool:
        return self.last_quota is not None and self.last_quota <= 0

    def questions(self, site: str) -> Iterator[tuple[list[dict], list[dict]]]:
        """(records, failures) per page of questions, until `has_more` is false, the page limit, or quota 0."""
        page = 1
        while self.cfg.max_pages is None or page <= self.cfg.max_pages:
            data, reason = self.call(
                "questions",
                "/questions",
                {
                    "site": site,
                    "filter": self.cfg.filter,
                    "pagesize": self.cfg.page_size,
                    "page": page,
                    "sort": "creation",
                    "order": "asc",
                    "fromdate": self.cfg.fromdate,
                    "todate": self.cfg.todate,
                },
            )
            if data is None:
                yield [], [{"url": f"{self.cfg.base_url}/questions?site={site}&page={page}", "reason": reason}]
                return
            records = [question_record(item, site) for item in data["items"]]
            failures = []
            embedded = any("answers" in item for item in data["items"])
            wants_answers = [
                r for r, item in zip(records, data["items"]) if not embedded and item.get("answer_count", 1) > 0
            ]
            if wants_answers and not self._quota_spent():
                failures = self._attach_answers(site, wants_answers)
            elif wants_answers:
                failures = [
                    {
                        "url": f"{self.cfg.base_url}/questions/answers?site={site}",
                        "reason": "quota exhausted before answers were fetched",
                    }
                ]
                for record in wants_answers:
                    record["answers_failed"] = True
            yield [r for r in records if not r.get("answers_failed")], failures
            if self._quota_spent():
                yield (
                    [],
                    [
                        {
                            "url": f"{self.cfg.base_url}/questions?site={site}&page={page + 1}",
                            "reason": "quota_remaining reached 0: stopped (resume tomorrow; cached pages are kept)",
                        }
                    ],
                )
                return
            if not data.get("has_more"):
                return
            page += 1

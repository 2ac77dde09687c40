"""Polite, resumable HTTP for the crawlers: allowed hosts only, robots.txt, shared rate limits, retries,
and a content-addressed response cache in the output store.

robots.txt is read as crawlers read it today (RFC 9309, through protego): `*` and `$` in paths, the longest
matching rule wins, and it is checked for every URL fetched, each redirect hop included. Secret query parameters
(`key=`, `access_token=`) never reach a cache key, a failure reason, a log line or a file.

Every response that settles a URL (2xx, or a permanent 4xx) is cached before the caller sees it, so a
crawl killed at any point and run again re-parses from the cache and never fetches a settled URL twice.
Transient failures (429, 5xx, resets, timeouts, truncated bodies) are retried with exponential backoff and
full jitter; a URL that still fails comes back as a `FetchResult` with its reason, for the caller to
record. Cache paths are made from hashes only: nothing a server sends decides where a file is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import requests
from protego import Protego

from crawl.ratelimit import LocalLimiter
from runtime.errors import scrub

USER_AGENT = "stackexchangeqa-crawler/0.1 (research corpus builder; +https://github.com/qa-at-scale)"
SECRET_PARAMS = frozenset({"key", "access_token"})  # never part of a cache key, never written to disk
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524})


class CrawlError(RuntimeError):
    """A crawl cannot go on at all (not one bad URL: those are `FetchResult`s with `ok=False`)."""


def host_of(url: str) -> str:
    """`host[:port]` of an http(s) URL, lower-case."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ""
    return parts.hostname.lower() + (f":{parts.port}" if parts.port else "")


def public_url(url: str) -> str:
    """The URL without secret query parameters: what cache keys, logs and failure records show."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in SECRET_PARAMS]
    return urlunsplit((parts.scheme, parts.netloc.lower(), parts.path or "/", urlencode(sorted(query)), ""))


@dataclass
class FetchResult:
    url: str  # public form (no key)
    ok: bool
    status: int = 0  # HTTP status of the last attempt, 0 when none came back
    body: bytes = b""
    reason: str = ""  # why it failed, for the failure record
    from_cache: bool = False
    attempts: int = 0
    content_type: str = ""

    def __post_init__(self):
        self.url = public_url(self.url) if self.url.startswith(("http://", "https://")) else scrub(self.url)
        self.reason = scrub(self.reason)  # an HTTP library's error text repeats the whole URL

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.body)


class ResponseCache:
    """Responses stored by content hash under `root`: `blobs/ab/<sha256>` and `urls/ab/<sha256 of url>.json`.

    The blob is written before its index entry, each by temp file and rename, so a kill leaves at worst an
    unreferenced blob, never an index entry pointing at half a body.
    """

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def _path(self, kind: str, digest: str, suffix: str = "") -> str:
        return os.path.join(self.root, kind, digest[:2], digest + suffix)

    @staticmethod
    def key(url: str) -> str:
        return hashlib.sha256(public_url(url).encode()).hexdigest()

    def get(self, url: str) -> FetchResult | None:
        index = self._path("urls", self.key(url), ".json")
        try:
            with open(index) as f:
                entry = json.load(f)
            with open(self._path("blobs", entry["sha256"]), "rb") as f:
                body = f.read()
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return None
        if hashlib.sha256(body).hexdigest() != entry["sha256"]:
            return None  # a damaged blob is fetched again rather than trusted
        return FetchResult(
            url=entry["url"],
            ok=entry["ok"],
            status=entry["status"],
            body=body,
            reason=entry.get("reason", ""),
            from_cache=True,
            content_type=entry.get("content_type", ""),
        )

    def put(self, result: FetchResult) -> None:
        digest = hashlib.sha256(result.body).hexdigest()
        blob = self._path("blobs", digest)
        if not os.path.exists(blob):
            _atomic_write(blob, result.body)
        entry = {
            "url": result.url,
            "ok": result.ok,
            "status": result.status,
            "sha256": digest,
            "reason": result.reason,
            "content_type": result.content_type,
            "fetched_at": time.time(),
        }
        _atomic_write(self._path("urls", self.key(result.url), ".json"), json.dumps(entry).encode())

    def __contains__(self, url: str) -> bool:
        return os.path.exists(self._path("urls", self.key(url), ".json"))


def _atomic_write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@dataclass
class FetchConfig:
    allowed_hosts: tuple[str, ...]  # host or host:port; anything else is refused, redirects included
    cache_dir: str
    user_agent: str = USER_AGENT
    requests_per_second: float = 1.0  # per host, across all workers when the limiter is shared
    max_retries: int = 4
    backoff_base: float = 1.0  # seconds; the n-th retry waits uniform(0, min(backoff_max, base * 2**n))
    backoff_max: float = 60.0
    timeout: float = 30.0
    respect_robots: bool = True
    max_bytes: int = 32 << 20
    max_redirects: int = 5
    rates: dict[str, float] = field(default_factory=dict)  # per-host overrides

    def __post_init__(self):
        self.allowed_hosts = tuple(h.lower() for h in self.allowed_hosts)
        if not self.allowed_hosts:
            raise ValueError("allowed_hosts is empty: name the hosts the crawler may contact")


class Fetcher:
    """GET with the crawler's rules. `limiter` is a `LocalLimiter` or a cluster-wide `SharedLimiter`."""

    def __init__(self, cfg: FetchConfig, limiter=None, sleep=time.sleep):
        self.cfg = cfg
        self.cache = ResponseCache(cfg.cache_dir)
        self.limiter = limiter or LocalLimiter(cfg.rates, cfg.requests_per_second)
        self.session = requests.Session()
        self.session.headers["User-Agent"] = cfg.user_agent
        self.robots: dict[str, Protego | str] = {}  # per host: its rules, or why it could not be read
        self.sleep = sleep
        self.fetched = 0  # network requests sent (attempts), for tests and progress

    def allowed(self, url: str) -> bool:
        return host_of(url) in self.cfg.allowed_hosts

    def get(
        self,
        url: str,
        params: dict | None = None,
        limit_key: str | None = None,
        check_robots: bool = True,
        cache_errors: bool = True,
        validate=None,
    ) -> FetchResult:
        """The response for `url` (+ `params`), from the cache when settled before.

        `limit_key` names the budget the request counts against (default: its host); robots.txt is
        checked for pages, not for APIs (`check_robots=False`), which have their own published rules.
        `cache_errors=False` caches only successes (an API's 400 may be a throttle, not a verdict).
        `validate(body)` returns '' for a usable 2xx body, else a reason: the body is retried like a transient
        failure and never cached (a 200 with broken JSON must not be replayed forever).
        """
        if params:
            url = url + ("&" if urlsplit(url).query else "?") + urlencode(params)
        shown = public_url(url)
        if not self.allowed(url):
            return FetchResult(shown, False, reason=f"refused: host {host_of(url) or url!r} is not an allowed host")
        cached = self.cache.get(url)
        if cached is not None:
            return cached
        if check_robots and self.cfg.respect_robots:
            verdict = self._robots_verdict(url)
            if verdict:
                return FetchResult(shown, False, reason=verdict)
        result = self._fetch(url, limit_key or host_of(url), validate, check_robots and self.cfg.respect_robots)
        settled_error = 400 <= result.status < 500 and result.status not in TRANSIENT_STATUS
        if result.ok or (cache_errors and settled_error):
            self.cache.put(result)  # settled: a re-run never asks again
        return result

    def _robots_verdict(self, url: str) -> str:
        """'' when robots.txt lets our User-Agent fetch `url`, else the reason."""
        host = host_of(url)
        rules = self.robots.get(host)
        if rules is None:
            parts = urlsplit(url)
            robots_url = f"{parts.scheme}://{parts.netloc}/robots.txt"
            cached = self.cache.get(robots_url)
            result = cached or self._fetch(robots_url, host, check_robots=False)
            if cached is None and (result.ok or result.status in (401, 403, 404, 410)):
                self.cache.put(result)
            if result.ok:
                rules = Protego.parse(result.text())
                delay = rules.crawl_delay(self.cfg.user_agent)
                if delay:
                    self.limiter.slow_down(host, 1.0 / float(delay))
            elif result.status in (401, 403):
                rules = Protego.parse("User-agent: *\nDisallow: /\n")
            elif result.status in (404, 410):
                rules = Protego.parse("")
            else:  # unreachable robots.txt: assume nothing is allowed until it can be read
                rules = f"robots.txt of {host} unavailable ({result.reason or result.status})"
            self.robots[host] = rules
        if isinstance(rules, str):
            return rules
        if rules.can_fetch(url, self.cfg.user_agent):
            return ""
        return f"disallowed by robots.txt of {host}"

    def _fetch(self, url: str, limit_key: str, validate=None, check_robots: bool = False) -> FetchResult:
        shown = public_url(url)
        reason, status = "", 0
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                self.sleep(random.uniform(0, min(self.cfg.backoff_max, self.cfg.backoff_base * 2 ** (attempt - 1))))
            self.limiter.wait(limit_key)
            self.fetched += 1
            try:
                response, body = self._send(url, check_robots)
            except _Refused as err:
                return FetchResult(shown, False, reason=str(err), attempts=attempt + 1)
            except requests.exceptions.Timeout:
                reason, status = f"timed out after {self.cfg.timeout:g} s", 0
                continue
            except requests.exceptions.ChunkedEncodingError as err:
                reason, status = f"truncated body ({_short(err)})", 0
                continue
            except requests.exceptions.ConnectionError as err:
                reason, status = f"connection failed ({_short(err)})", 0
                continue
            except _TooLarge as err:
                return FetchResult(shown, False, status=200, reason=str(err), attempts=attempt + 1)
            status = response.status_code
            content_type = response.headers.get("Content-Type", "")
            if 200 <= status < 300 and validate is not None and validate(body):
                reason = validate(body)
                continue
            if 200 <= status < 300:
                return FetchResult(shown, True, status, body, attempts=attempt + 1, content_type=content_type)
            if status in TRANSIENT_STATUS:
                retry_after = _retry_after(response.headers.get("Retry-After"))
                if retry_after:
                    self.limiter.hold(limit_key, min(retry_after, self.cfg.backoff_max * 10))
                reason = f"HTTP {status}" + (f" (Retry-After {retry_after:g} s)" if retry_after else "")
                continue
            return FetchResult(
                shown, False, status, body, reason=f"HTTP {status}", attempts=attempt + 1, content_type=content_type
            )
        if 200 <= status < 300:
            status = 0  # the body was never usable: not a success, and not a settled error either
        return FetchResult(
            shown,
            False,
            status,
            reason=f"{reason} after {self.cfg.max_retries + 1} attempts",
            attempts=self.cfg.max_retries + 1,
        )

    def _send(self, url: str, check_robots: bool = False):
        """One GET, following redirects only to allowed hosts and, with `check_robots`, only where robots.txt
        allows the hop; the body read whole or not at all."""
        for _ in range(self.cfg.max_redirects + 1):
            response = self.session.get(url, timeout=self.cfg.timeout, stream=True, allow_redirects=False)
            if response.is_redirect:
                target = urljoin(url, response.headers.get("Location", ""))
                response.close()
                if not self.allowed(target):
                    raise _Refused(
                        f"refused: redirect from {public_url(url)} to {host_of(target) or target!r}, "
                        "not an allowed host"
                    )
                verdict = self._robots_verdict(target) if check_robots else ""
                if verdict:
                    raise _Refused(f"refused: redirect from {public_url(url)} to {public_url(target)}: {verdict}")
                url = target
                continue
            chunks, size = [], 0
            for chunk in response.iter_content(1 << 16):
                size += len(chunk)
                if size > self.cfg.max_bytes:
                    response.close()
                    raise _TooLarge(f"body larger than {self.cfg.max_bytes:,} bytes")
                chunks.append(chunk)
            expected = response.headers.get("Content-Length")
            if expected and not response.headers.get("Content-Encoding") and int(expected) != size:
                raise requests.exceptions.ChunkedEncodingError(f"got {size} of {expected} bytes")
            return response, b"".join(chunks)
        raise _Refused(f"refused: more than {self.cfg.max_redirects} redirects from {public_url(url)}")


class _Refused(Exception):
    pass


class _TooLarge(Exception):
    pass


def _retry_after(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0  # an HTTP date: rare from these servers; exponential backoff covers it


def _short(err: Exception) -> str:
    text = str(err)
    for marker in (
        "Connection reset",
        "Connection refused",
        "Connection aborted",
        "IncompleteRead",
        "Remote end closed",
        "Read timed out",
    ):
        if marker in text:
            return marker
    return text[:120]

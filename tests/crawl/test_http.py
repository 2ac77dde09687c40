"""The crawler's HTTP layer against a real loopback server that injects faults."""

from __future__ import annotations

import os
import time

import pytest

from crawl.http import FetchConfig, Fetcher, FetchResult, public_url
from crawl.ratelimit import LocalLimiter, Schedule
from tests.fakeweb import Reply, assert_paced


def fetcher(web, tmp_path, **kw) -> Fetcher:
    cfg = FetchConfig(
        allowed_hosts=(web.host,),
        cache_dir=str(tmp_path / "cache"),
        requests_per_second=kw.pop("rps", 200.0),
        timeout=kw.pop("timeout", 5.0),
        backoff_base=kw.pop("backoff_base", 0.01),
        **kw,
    )
    return Fetcher(cfg)


def test_schedule_spaces_slots_and_honours_holds():
    s = Schedule(default_rate=2.0)
    assert [s.reserve("h", 100.0) for _ in range(3)] == [100.0, 100.5, 101.0]
    s.hold("h", 105.0)
    assert s.reserve("h", 100.0) == 105.0
    assert s.reserve("other", 100.0) == 100.0  # keys are independent
    s.slow_down("h", 0.1)
    assert s.reserve("h", 100.0) == 105.5 and s.reserve("h", 100.0) == 115.5


def test_settled_responses_are_cached_and_never_fetched_twice(http_server, tmp_path):
    http_server.route("/robots.txt", "", status=404)
    http_server.route("/q/1", "<html>one</html>")
    http_server.route("/gone", "no", status=404)
    f = fetcher(http_server, tmp_path)
    first = f.get(http_server.url("/q/1"))
    assert first.ok and first.text() == "<html>one</html>" and not first.from_cache
    assert f.get(http_server.url("/gone")).status == 404
    again = fetcher(http_server, tmp_path)  # a new process after a kill: same cache
    assert again.get(http_server.url("/q/1")).from_cache
    assert again.get(http_server.url("/gone")).from_cache
    assert http_server.hits("/q/1") == 1 and http_server.hits("/gone") == 1
    assert http_server.hits("/robots.txt") == 1  # robots.txt is cached too


def test_429_with_retry_after_is_obeyed_then_retried(http_server, tmp_path):
    http_server.route("/robots.txt", "", status=404)
    http_server.script("/busy", Reply(429, b"slow down", {"Retry-After": "1"}), Reply(200, b"ok"))
    f = fetcher(http_server, tmp_path)
    result = f.get(http_server.url("/busy"))
    assert result.ok and result.attempts == 2
    times = [t for t, path, _ in http_server.log if path == "/busy"]
    assert times[1] - times[0] >= 0.95


@pytest.mark.parametrize(
    "fault, reason",
    [
        (Reply(500, b"boom"), "HTTP 500 after 3 attempts"),
        (Reply(200, b"x" * 1000, truncate=True), "truncated body"),
        (Reply(200, b"late", delay=1.5), "timed out after 0.5 s"),
        (Reply(reset=True), "connection failed"),
    ],
)
def test_transient_faults_are_retried_and_reported_with_url_and_reason(http_server, tmp_path, fault, reason):
    http_server.route("/robots.txt", "", status=404)
    http_server.script("/bad", fault)
    f = fetcher(http_server, tmp_path, max_retries=2, timeout=0.5)
    result = f.get(http_server.url("/bad"))
    assert not result.ok and reason in result.reason and result.url.endswith("/bad")
    assert http_server.hits("/bad") == 3
    http_server.script("/bad", Reply(200, b"fine now"))  # not cached: a re-run tries again
    assert f.get(http_server.url("/bad")).ok


def test_a_reset_then_success_recovers(http_server, tmp_path):
    http_server.route("/robots.txt", "", status=404)
    http_server.script("/flaky", Reply(reset=True), Reply(503), Reply(200, b"ok"))
    result = fetcher(http_server, tmp_path).get(http_server.url("/flaky"))
    assert result.ok and result.attempts == 3


def test_off_site_urls_and_redirects_are_refused(http_server, tmp_path):
    http_server.route("/robots.txt", "", status=404)
    http_server.route("/away", "", status=301, headers={"Location": "http://example.com/steal"})
    http_server.route("/here", "", status=302, headers={"Location": "/q/9"})
    http_server.route("/q/9", "target")
    f = fetcher(http_server, tmp_path)
    refused = f.get("http://example.com/questions/1")
    assert not refused.ok and "not an allowed host" in refused.reason
    off = f.get(http_server.url("/away"))
    assert not off.ok and "redirect" in off.reason and "example.com" in off.reason
    assert f.get(http_server.url("/here")).text() == "target"


def test_robots_txt_is_respected(http_server, tmp_path):
    http_server.route("/robots.txt", "User-agent: *\nDisallow: /private/\n")
    http_server.route("/private/1", "secret")
    http_server.route("/public/1", "hello")
    f = fetcher(http_server, tmp_path)
    blocked = f.get(http_server.url("/private/1"))
    assert not blocked.ok and "robots.txt" in blocked.reason
    assert f.get(http_server.url("/public/1")).ok
    assert http_server.hits("/private/1") == 0


def test_robots_txt_wildcards_end_anchors_and_the_longest_rule(http_server, tmp_path):
    """RFC 9309 as crawlers read it: `*` matches any run of characters, `$` anchors the end, and the longest
    matching rule wins (urllib.robotparser ignored both and took the first match: /a?sort=... was fetched)."""
    http_server.route(
        "/robots.txt",
        "User-agent: *\nDisallow: /*?sort=\nDisallow: /*.json$\nDisallow: /questions/\nAllow: /questions/1\n",
    )
    for path in ("/a", "/a?sort=votes", "/x.json", "/x.json?v=1", "/questions/1", "/questions/2"):
        http_server.route(path.split("?")[0] + ("?*" if "?" in path else ""), "page")
    f = fetcher(http_server, tmp_path)
    verdicts = {
        path: f.get(http_server.url(path)).ok
        for path in ("/a", "/a?sort=votes", "/x.json", "/x.json?v=1", "/questions/1", "/questions/2")
    }
    assert verdicts == {
        "/a": True,
        "/a?sort=votes": False,
        "/x.json": False,
        "/x.json?v=1": True,
        "/questions/1": True,
        "/questions/2": False,
    }
    assert http_server.hits("/a?sort=votes") == 0 and http_server.hits("/questions/2") == 0


def test_robots_txt_is_checked_on_every_redirect_hop(http_server, tmp_path):
    http_server.route("/robots.txt", "User-agent: *\nDisallow: /private/\n")
    http_server.route("/moved", "", status=302, headers={"Location": "/private/1"})
    http_server.route("/private/1", "secret")
    result = fetcher(http_server, tmp_path).get(http_server.url("/moved"))
    assert not result.ok and "robots.txt" in result.reason and "/private/1" in result.reason
    assert http_server.hits("/private/1") == 0


def test_an_api_key_never_reaches_a_failure_reason(http_server, tmp_path):
    """The HTTP library's error text repeats the whole URL, key included; every reason is scrubbed."""
    http_server.route("/robots.txt", "", status=404)
    http_server.script("/api?*", Reply(reset=True))
    f = fetcher(http_server, tmp_path, max_retries=0)
    result = f.get(http_server.url("/api"), params={"key": "SECRET123", "site": "beer"}, check_robots=False)
    assert not result.ok and "SECRET123" not in result.reason + result.url
    refused = f.get("http://example.com/x?access_token=TOKEN9&key=SECRET123")
    assert "TOKEN9" not in refused.reason + refused.url and "SECRET123" not in refused.reason + refused.url
    library_text = (
        "HTTPSConnectionPool(host='api.stackexchange.com', port=443): Max retries exceeded with url: "
        "/2.3/questions?key=SECRET123&site=beer"
    )
    assert (
        "SECRET123" not in FetchResult("https://api.stackexchange.com/2.3/questions", False, reason=library_text).reason
    )
    from crawl.sources import failure_row
    from runtime.errors import scrub

    row = failure_row("https://api.x/2.3/questions?key=SECRET123&site=beer", "GET https://a/?key=SECRET123 failed")
    assert "SECRET123" not in row["origin"] + row["failure"]
    assert scrub("see https://h/p?page=2&key=abc&access_token=t0k") == "see https://h/p?page=2&key=***&access_token=***"


def test_cache_stays_inside_its_folder_and_never_stores_the_key(http_server, tmp_path):
    http_server.route("/robots.txt", "", status=404)
    http_server.route("/a/../../../etc/passwd?*", "x")
    f = fetcher(http_server, tmp_path)
    f.get(http_server.url("/a/../../../etc/passwd"), params={"key": "SECRET123", "page": 1})
    root = str(tmp_path / "cache")
    for folder, _, files in os.walk(tmp_path):
        for name in files:
            path = os.path.join(folder, name)
            assert path.startswith(root + os.sep)
            with open(path, "rb") as fh:
                assert b"SECRET123" not in fh.read()
    assert "SECRET123" not in public_url("http://h/x?key=SECRET123&page=2")


def test_local_limiter_spaces_threads(http_server, tmp_path):
    import threading

    limiter = LocalLimiter(default_rate=5.0)
    stamps = []

    def hit():
        limiter.wait("host")
        stamps.append(time.time())

    threads = [threading.Thread(target=hit) for _ in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert_paced(stamps, rate=5.0)

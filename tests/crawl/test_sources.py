"""Page parsing on the real saved pages, page and API crawling against a loopback server that serves the
real page and API files with faults injected, and the limiter shared by Ray workers."""

from __future__ import annotations

import copy
import csv
import gzip
import json
import os
import re
import time

import pyarrow as pa
import pytest

from crawl.api import ApiClient, ApiConfig, markdown_to_html
from crawl.dump import ANSWER, FETCH_FAILED, QUESTION
from crawl.http import FetchConfig, Fetcher
from crawl.pages import PageParseError, crawl_question, parse_question_page
from crawl.sites import api_site, site_host
from tests.fakeweb import Reply, assert_paced


@pytest.fixture(scope="module")
def pages(shared_data):
    folder = os.path.join(shared_data, "stackexchange_html")
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} not found")
    with open(os.path.join(folder, "index.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for row in rows:
        with gzip.open(os.path.join(folder, "pages", row["file"])) as page:
            row["html"] = page.read()
    return rows


@pytest.fixture(scope="module")
def api_response(shared_data):
    path = os.path.join(shared_data, "stackexchange_api_json", "valid_questions_api_response_30.json")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_site_names_are_hosts():
    assert site_host("beer") == "beer.stackexchange.com" and site_host("stackoverflow") == "stackoverflow.com"
    assert site_host("pt.stackoverflow") == "pt.stackoverflow.com" == site_host("pt.stackoverflow.com")
    assert api_site("beer.stackexchange.com") == "beer" and api_site("pt.stackoverflow.com") == "pt.stackoverflow"
    assert api_site("stackoverflow.com") == "stackoverflow"
    from crawl.sites import is_site_name

    good = ("beer", "Beer", "pt.stackoverflow", "beer.stackexchange.com", "3dprinting", "meta.beer", "ja.stackoverflow")
    assert all(is_site_name(name) for name in good)
    assert not any(is_site_name(name) for name in ("", "cof fee", "beer/", "-beer", "beer.", "beer..com", "bière"))


@pytest.mark.slow
def test_every_saved_page_parses_as_its_index_says(pages):
    layouts = set()
    for row in pages:
        record = parse_question_page(row["html"], row["canonical_url"])
        layouts.add(record["layout"])
        assert record["question_id"] == int(row["question_id"]) and record["site"] == row["site"], row["file"]
        assert len(record["answers"]) == int(row["n_answers_in_page"]), row["file"]
        assert (record["accepted_answer_id"] != -1) == (row["accepted_answer_marked"] == "yes"), row["file"]
        assert record["title"] and record["body"] and record["creation_date"], row["file"]
        assert all(a["body"] and a["creation_date"] for a in record["answers"]), row["file"]
    assert layouts == {"2020", "2021"}
    assert sum(int(r["n_answers_in_page"]) for r in pages) == 241


def test_scores_come_from_data_value_and_sidebars_are_ignored(pages):
    row = next(r for r in pages if r["question_id"] == "2003505")
    record = parse_question_page(row["html"], row["canonical_url"])
    assert record["answers"][0]["score"] == 22030 and record["answers"][0]["accepted"]
    assert record["declared_answers"] == 39 and len(record["answers"]) == 30
    assert record["next_page"].endswith("?page=2&tab=votes")
    assert "git" in record["tags"] and not record["title"].endswith("]")


def test_authors_come_from_the_owner_signature_not_the_editor(pages):
    # In 2020 pages the question's first signature is its last editor's; the owner's is marked.
    row = next(r for r in pages if r["question_id"] == "201564")
    record = parse_question_page(row["html"], row["canonical_url"])
    assert (record["author_id"], record["author"]) == (74945, "Hugo Azevedo")
    assert [(a["author_id"], a["author"]) for a in record["answers"][:2]] == [
        (70784, "Marcelo Zochio"),
        (2999, "Leonel Sanches da Silva"),
    ]
    named = 0
    for row in pages:
        record = parse_question_page(row["html"], row["canonical_url"])
        posts = [record] + record["answers"]
        assert all(p["author"] for p in posts), row["file"]
        named += sum(p["author_id"] is not None for p in posts)
    assert named == 268  # of 279 posts; the other 11 are community wikis or deleted users (a name, no id)


def test_api_owner_becomes_the_author():
    from crawl.api import question_record

    # The saved API file was fetched with a filter that leaves `owner` out, so this item is built by hand
    # in the API's documented shape (display names come HTML-escaped; deleted users have no user_id).
    item = {
        "question_id": 5,
        "title": "T",
        "body": "<p>b</p>",
        "link": "https://beer.stackexchange.com/q/5",
        "owner": {"user_id": 42, "display_name": "Ana &amp; Bo"},
        "answers": [
            {"answer_id": 6, "body": "<p>a</p>", "score": 3, "owner": {"display_name": "user9"}},
            {"answer_id": 7, "body": "<p>c</p>", "score": 1},
        ],
    }
    record = question_record(item, "beer")
    assert (record["author_id"], record["author"]) == (42, "Ana & Bo")
    assert [(a["author_id"], a["author"]) for a in record["answers"]] == [(None, "user9"), (None, "")]


def test_a_page_that_is_not_a_question_is_a_clear_error():
    with pytest.raises(PageParseError, match="http://x/y: no #question"):
        parse_question_page(b"<html><body>captcha</body></html>", "http://x/y")


def _serve_paginated(http_server, row):
    """Page 1 is the real page; page 2 is built from it with new answer ids and no pager."""
    html = row["html"].decode()
    path = "/questions/2003505/how-do-i-delete-a-git-branch-locally-and-remotely"
    page2 = re.sub(r'(data-answerid="|id="answer-)(\d+)', r"\g<1>9\2", html)
    page2 = page2.replace('class="s-pagination pager-answers"', 'class="s-pagination"')
    http_server.route("/robots.txt", "User-agent: *\nDisallow: /users/\n")
    http_server.route(path, html)
    http_server.route(path + "?page=2&tab=votes", page2)
    return http_server.url(path)


def fetcher_for(http_server, tmp_path, rps=200.0, **kw) -> Fetcher:
    return Fetcher(
        FetchConfig(
            allowed_hosts=(http_server.host,),
            cache_dir=str(tmp_path / "cache"),
            requests_per_second=rps,
            backoff_base=0.01,
            timeout=5.0,
            **kw,
        )
    )


def test_page_crawl_follows_the_answer_pager_and_resumes_from_cache(http_server, pages, tmp_path):
    row = next(r for r in pages if r["question_id"] == "2003505")
    url = _serve_paginated(http_server, row)
    record, failures = crawl_question(fetcher_for(http_server, tmp_path), url)
    assert not failures and record["pages"] == 2 and len(record["answers"]) == 60
    assert len({a["id"] for a in record["answers"]}) == 60
    served = len(http_server.requests)
    assert served == 3  # robots.txt and two pages; no sidebar link followed
    again, _ = crawl_question(fetcher_for(http_server, tmp_path), url)  # a re-run after a kill
    assert again == record and len(http_server.requests) == served


def test_page_crawl_records_a_failed_second_page(http_server, pages, tmp_path):
    row = next(r for r in pages if r["question_id"] == "2003505")
    url = _serve_paginated(http_server, row)
    http_server.script(
        "/questions/2003505/how-do-i-delete-a-git-branch-locally-and-remotely?page=2&tab=votes", Reply(503)
    )
    record, failures = crawl_question(fetcher_for(http_server, tmp_path, max_retries=1), url)
    assert len(record["answers"]) == 30
    assert failures == [{"url": failures[0]["url"], "reason": "HTTP 503 after 2 attempts"}]
    assert "page=2" in failures[0]["url"]


def test_markdown_bodies_become_html_with_code_blocks():
    html = markdown_to_html("Try this:\r\n\r\n    git push origin --delete x\r\n\r\nIt&#39;s [docs](http://d).")
    assert html == ("<p>Try this:</p>\n<pre><code>git push origin --delete x</code></pre>\n<p>It's docs.</p>")


def _api(http_server, pages_by_number):
    """Serve /2.3/questions page n from `pages_by_number[n]` (a dict or a Reply)."""

    def handler(query):
        reply = pages_by_number[int(query.get("page", 1))]
        if isinstance(reply, Reply):
            return reply
        return Reply(200, json.dumps(reply).encode(), {"Content-Type": "application/json"})

    http_server.handle("/2.3/questions", handler)
    return ApiConfig(base_url=http_server.url("/2.3"), key="SEKRIT", page_size=30)


def test_api_pages_obey_backoff_and_keep_every_answer(http_server, api_response, tmp_path):
    first = dict(api_response, backoff=1)
    second = dict(copy.deepcopy(api_response), has_more=False, quota_remaining=9988, page=2)
    for item in second["items"]:
        item["question_id"] += 10**9
    cfg = _api(http_server, {1: first, 2: second})
    client = ApiClient(fetcher_for(http_server, tmp_path), cfg)
    results = list(client.questions("stackoverflow"))
    records = [r for rs, _ in results for r in rs]
    assert not [f for _, fs in results for f in fs]
    assert len(records) == 60 and sum(len(r["answers"]) for r in records) == 84
    assert records[0]["site"] == "stackoverflow.com" and "<pre><code>" in records[0]["body"]
    times = [t for t, path, _ in http_server.log if path.startswith("/2.3/questions")]
    assert len(times) == 2 and times[1] - times[0] >= 0.95  # the backoff of page 1 held page 2
    assert all("key=SEKRIT" in path for _, path, _ in http_server.log)  # sent, but never cached (see http tests)
    again = ApiClient(fetcher_for(http_server, tmp_path), cfg)
    assert [r for rs, _ in again.questions("stackoverflow") for r in rs] == records
    assert len([p for _, p, _ in http_server.log if p.startswith("/2.3/questions")]) == 2  # all from cache


def test_api_stops_when_the_quota_is_spent(http_server, api_response, tmp_path):
    cfg = _api(http_server, {1: dict(api_response, quota_remaining=0), 2: api_response})
    results = list(ApiClient(fetcher_for(http_server, tmp_path), cfg).questions("stackoverflow"))
    assert sum(len(rs) for rs, _ in results) == 30
    assert "quota_remaining reached 0" in results[-1][1][0]["reason"]
    assert http_server.hits("/2.3/questions?*") == 0 and len(http_server.log) == 1


def test_api_throttle_violation_and_invalid_json_are_retried(http_server, api_response, tmp_path):
    throttled = Reply(
        400,
        json.dumps(
            {
                "error_id": 502,
                "error_name": "throttle_violation",
                "error_message": "too many requests, more requests available in 1 seconds",
            }
        ).encode(),
    )
    state = {"calls": 0}
    good = json.dumps(dict(api_response, has_more=False)).encode()

    def handler(query):
        state["calls"] += 1
        return [throttled, Reply(200, b'{"items": [tru'), Reply(200, good)][min(state["calls"] - 1, 2)]

    http_server.handle("/2.3/questions", handler)
    cfg = ApiConfig(base_url=http_server.url("/2.3"))
    results = list(ApiClient(fetcher_for(http_server, tmp_path), cfg).questions("stackoverflow"))
    assert sum(len(rs) for rs, _ in results) == 30 and not results[0][1]
    stamps = [t for t, _, _ in http_server.log]
    assert stamps[1] - stamps[0] >= 0.95  # the throttle's "1 seconds" was honoured


def test_api_invalid_json_every_time_is_a_recorded_failure(http_server, tmp_path):
    cfg = _api(http_server, {1: Reply(200, b"<html>oops</html>")})
    results = list(ApiClient(fetcher_for(http_server, tmp_path, max_retries=1), cfg).questions("beer"))
    (failure,) = results[0][1]
    assert "invalid JSON" in failure["reason"] and "/2.3/questions" in failure["reason"]
    assert "SEKRIT" not in failure["reason"] and "SEKRIT" not in failure["url"]


def test_api_withbody_fetches_answers_by_question_ids(http_server, api_response, tmp_path):
    questions = dict(copy.deepcopy(api_response), has_more=False)
    answers = []
    for item in questions["items"]:
        for answer in item.pop("answers", []):
            answers.append(dict(answer, question_id=item["question_id"]))
    cfg = _api(http_server, {1: questions})
    ids = ";".join(
        str(i["question_id"])
        for i in sorted(questions["items"], key=lambda i: i["question_id"])
        if i.get("answer_count", 1) > 0
    )
    http_server.route(f"/2.3/questions/{ids}/answers?*", json.dumps({"items": answers, "has_more": False}))
    records = [r for rs, _ in ApiClient(fetcher_for(http_server, tmp_path), cfg).questions("stackoverflow") for r in rs]
    assert sum(len(r["answers"]) for r in records) == 42
    assert sum(a["accepted"] for r in records for a in r["answers"]) == 21


def test_shared_limiter_holds_across_ray_workers(ray_local, http_server, tmp_path):
    from crawl.ratelimit import shared_limiter

    for i in range(12):
        http_server.route(f"/p/{i}", f"page {i}")
    http_server.route("/robots.txt", "", status=404)
    limiter = shared_limiter(f"test-{time.time_ns()}", default_rate=5.0)
    cfg = FetchConfig(allowed_hosts=(http_server.host,), cache_dir=str(tmp_path / "cache"), requests_per_second=5.0)

    @ray_local.remote(num_cpus=0.1)
    def crawl(urls):
        fetcher = Fetcher(cfg, limiter)
        return [fetcher.get(url).ok for url in urls]

    batches = [[http_server.url(f"/p/{i}") for i in range(k, 12, 4)] for k in range(4)]
    assert all(ok for oks in ray_local.get([crawl.remote(b) for b in batches]) for ok in oks)
    assert sum(path.startswith("/p/") for path in http_server.requests) == 12
    # Every request counts against the host's budget, robots.txt too: 5/s across four processes, not 5/s each.
    assert_paced([t for t, _, _ in http_server.log], rate=5.0)


def test_crawled_posts_dataset_turns_pages_into_posts_and_failures(ray_local, http_server, pages, tmp_path):
    from crawl.sources import CrawlConfig, crawled_posts

    http_server.route("/robots.txt", "User-agent: *\nDisallow: /private/\n")
    urls = []
    for row in pages[:4]:
        path = f"/questions/{row['question_id']}"
        http_server.route(path, row["html"])
        urls.append(http_server.url(path))
    urls += [http_server.url("/questions/404404"), http_server.url("/private/1"), "http://elsewhere.example/q/1"]
    cfg = CrawlConfig(
        cache_dir=str(tmp_path / "cache"),
        urls=urls,
        allowed_hosts=[http_server.host],
        requests_per_second=100.0,
        max_retries=0,
        limiter_name=f"t-{time.time_ns()}",
    )
    table = pa.concat_tables([ray_local.get(r) for r in crawled_posts(cfg).to_arrow_refs()])
    rows = table.to_pylist()
    questions = [r for r in rows if r["post_type"] == QUESTION]
    answers = [r for r in rows if r["post_type"] == ANSWER]
    failures = {
        r["origin"].rsplit("/", 2)[-2] + "/" + r["origin"].rsplit("/", 1)[-1]: r["failure"]
        for r in rows
        if r["post_type"] == FETCH_FAILED
    }
    assert len(questions) == 4 and len(answers) == sum(int(r["n_answers_in_page"]) for r in pages[:4])
    assert {q["site"] for q in questions} == {r["site"] for r in pages[:4]}
    assert all(r["licence"].startswith("CC BY-SA") for r in questions + answers)
    assert all(r["author"] for r in questions + answers)
    assert failures["questions/404404"] == "HTTP 404"
    assert "robots.txt" in failures["private/1"] and "not an allowed host" in failures["q/1"]

"""The build from crawled sources: the real saved pages and the real API response served on 127.0.0.1 with
faults, through the same pipeline as dumps, then re-run from the cache without fetching anything again."""

from __future__ import annotations

import csv
import gzip
import json
import os
import time
from collections import Counter

import pytest

from crawl.http import ResponseCache
from pipelines.schemas import QA_PAIRS, read_table
from tests.conftest import REPO, kill_session

pytestmark = pytest.mark.slow


@pytest.fixture
def served(http_server, shared_data):
    pages_dir = os.path.join(shared_data, "stackexchange_html")
    api_file = os.path.join(shared_data, "stackexchange_api_json", "valid_questions_api_response_30.json")
    if not (os.path.isdir(pages_dir) and os.path.exists(api_file)):
        pytest.skip("saved pages or API response not found in shared data")
    with open(os.path.join(pages_dir, "index.tsv"), encoding="utf-8") as f:
        index = list(csv.DictReader(f, delimiter="\t"))
    urls = []
    for row in index:
        with gzip.open(os.path.join(pages_dir, "pages", row["file"])) as page:
            path = f"/questions/{row['question_id']}"
            http_server.route(path, page.read())
            urls.append(http_server.url(path))
    http_server.route("/robots.txt", "User-agent: *\nDisallow: /search\n")
    urls += [http_server.url("/questions/1/gone"), http_server.url("/search?q=x")]  # a 404 and a robots refusal
    with open(api_file, encoding="utf-8") as f:
        api = dict(json.load(f), has_more=False)
    http_server.route("/2.3/questions?*", json.dumps(api), headers={"Content-Type": "application/json"})
    return http_server, index, urls, api


def test_build_from_pages_and_api_then_resume_from_cache(served, ray_local, tmp_path):
    from pipelines.stackexchangeqa import BuildConfig, write

    web, index, urls, api = served
    cfg = BuildConfig(
        urls=urls,
        api_sites=["stackoverflow"],
        api_base_url=web.url("/2.3"),
        output=str(tmp_path / "seqa"),
        negatives=2,
        requests_per_second=50.0,
        api_requests_per_second=50.0,
        max_retries=0,
    )
    stats = write(cfg)
    questions = stats["questions"]
    assert questions["in"] == len(index) + len(api["items"])
    pt = sum(1 for r in index if r["site"] == "pt.stackoverflow.com")
    assert questions["dropped"]["question_not_english"] >= pt - 1  # Portuguese pages (one is mostly code)
    assert stats["posts_in"] == questions["in"] + stats["answers"]["in"] + stats["other_posts"]["in"]
    assert stats["answers"]["in"] == 241 + sum(len(i.get("answers", [])) for i in api["items"])
    assert stats["fetch_failures"] == 3
    with open(tmp_path / "seqa" / "failures.jsonl") as f:
        failures = {json.loads(line)["url"].split("/", 3)[-1]: json.loads(line)["reason"] for line in f}
    # the third: page 2 of the paginated thread 2003505, which the server does not have
    assert failures == {
        "questions/1/gone": "HTTP 404",
        "search?q=x": failures["search?q=x"],
        "questions/2003505/how-do-i-delete-a-git-branch-locally-and-remotely?page=2&tab=votes": "HTTP 404",
    }
    assert "robots.txt" in failures["search?q=x"]
    table = read_table(str(tmp_path / "seqa" / "train"), QA_PAIRS)
    assert set(table.column("site").to_pylist()) <= {"stackoverflow.com", "pt.stackoverflow.com"}
    served_before = len(web.log)
    again = write(cfg)  # as after a crash: everything comes from the cache
    assert len(web.log) == served_before
    assert {k: again[k] for k in ("questions", "answers", "pairs", "splits")} == {
        k: stats[k] for k in ("questions", "answers", "pairs", "splits")
    }


@pytest.mark.ray
def test_a_killed_crawl_resumes_fetching_again_only_the_pages_in_flight(served, tmp_path):
    """The build job crawling pages is killed (SIGKILL, its whole session) part-way; the same command run
    again finishes, and over both runs the server saw every page once, but for those in flight at the kill:
    served, their response not yet stored (at most one a crawler), which the second run fetches once more."""
    import subprocess
    import sys

    web, _index, urls, _ = served
    pages = [u for u in urls if "/questions/" in u and "gone" not in u][:24]
    url_file = tmp_path / "urls.txt"
    url_file.write_text("\n".join(pages) + "\n")
    repo = REPO
    command = [
        sys.executable,
        os.path.join(repo, "jobs", "build_stackexchangeqa.py"),
        "--source",
        "pages",
        "--urls",
        str(url_file),
        "--output",
        str(tmp_path / "seqa"),
        "--requests-per-second",
        "2",
        "--crawlers",
        "2",
        "--negatives",
        "1",
        "--num-cpus",
        "2",
    ]
    page_paths = {u.split(web.host, 1)[1] for u in pages}

    def served_pages():
        return [p for _, p, _ in web.log if p in page_paths]

    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 180
    try:
        while time.time() < deadline and proc.poll() is None and len(served_pages()) < 6:
            time.sleep(0.2)
        assert proc.poll() is None, "the crawl ended before it could be killed"
        assert len(served_pages()) >= 6, "the crawl never got going"
    finally:
        kill_session(proc.pid)
        proc.wait()
    first_run = served_pages()
    assert len(first_run) < len(pages)
    stored = ResponseCache(str(tmp_path / "seqa.cache"))  # the build's default cache, OUTPUT.cache
    in_flight = {p for p in first_run if web.url(p) not in stored}
    assert len(in_flight) <= 2, in_flight  # --crawlers 2, one request at a time each
    again = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    served_both_runs = Counter(served_pages())
    counts = {p: served_both_runs[p] for p in page_paths}
    expected = {p: 2 if p in in_flight else 1 for p in page_paths}
    assert counts == expected, {p: (counts[p], expected[p]) for p in page_paths if counts[p] != expected[p]}
    with open(tmp_path / "seqa" / "stats.json") as f:
        stats = json.load(f)
    assert stats["questions"]["in"] == len(pages)

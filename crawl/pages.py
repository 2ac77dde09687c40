"""Stack Exchange question pages parsed with BeautifulSoup, for sites or questions neither dumps nor the API
cover.

Two markup generations are handled (both seen in `../shared/data/stackexchange_html/`): 2020 pages put post
bodies in `div.post-text`, 2021 pages in `div.s-prose.js-post-body`. Both carry the score in the
`data-value` of `.js-vote-count`, answer ids in `data-answerid`, the accepted answer as
`itemprop="acceptedAnswer"`, and dates in `time[itemprop=dateCreated]` or a `.relativetime` title.
Selectors are scoped to `#question` and `#answers`: pages also link to many unrelated questions (sidebars,
"Hot Network Questions") that must never be taken for answers or followed.

Long threads spread answers over pages (`?page=2&tab=votes`); `crawl_question` follows the answer pager on the
same host and merges the pages.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlsplit

from bs4 import BeautifulSoup, Tag

from crawl.http import Fetcher, host_of

_BODY_SELECTORS = ("div.s-prose.js-post-body", "div.post-text")
_TITLE_MARKERS = re.compile(r"\s*\[(closed|duplicate|on hold|migrated|deleted)\]\s*$", re.IGNORECASE)
_QUESTION_PATH = re.compile(r"/questions/(\d+)")


class PageParseError(ValueError):
    """A page is not a question page we can read; the message names the URL."""


def _body(container, url: str, what: str) -> tuple[str, str]:
    for selector in _BODY_SELECTORS:
        node = container.select_one(selector)
        if node is not None:
            return node.decode_contents().strip(), "2021" if "s-prose" in selector else "2020"
    raise PageParseError(f"{url}: {what} has no post body ({' or '.join(_BODY_SELECTORS)})")


def _score(container, url: str, what: str) -> int:
    node = container.select_one(".js-vote-count")
    if node is None:
        raise PageParseError(f"{url}: {what} has no vote count (.js-vote-count)")
    value = node.get("data-value")
    if value is None:
        value = node.get_text(strip=True)
    try:
        return int(str(value).replace(",", ""))
    except ValueError:
        raise PageParseError(f"{url}: {what} vote count {value!r} is not an integer") from None


def _created(container, answers_section=None) -> str:
    for node in container.select("time[itemprop=dateCreated]"):
        if answers_section is None or node not in answers_section.descendants:
            return node.get("datetime", "")
    owner = container.select_one(".post-signature.owner .relativetime") or container.select_one(".relativetime")
    if owner is not None and owner.get("title"):
        return owner["title"].rstrip("Z").strip().replace(" ", "T")
    return ""


_USER_PATH = re.compile(r"/users/(-?\d+)")


def _author(container, question: bool) -> dict:
    """The post's author: the signature marked `itemprop=author` (both layouts), else the owner's signature
    (the question's `.owner`; an answer's last, after any editor's). A deleted user or a community wiki has
    a name and no profile link (id None)."""
    details = container.select_one(".user-details[itemprop=author]")
    if details is None:
        signatures = container.select(
            ".post-signature.owner .user-details" if question else ".post-signature .user-details"
        )
        details = signatures[-1] if signatures else None
    if details is None:
        return {"author_id": None, "author": ""}
    link = details.select_one("a[href*='/users/']")
    name_node = details.select_one("[itemprop=name]") or link
    if name_node is not None:
        name = name_node.get_text(" ", strip=True)
    else:  # a deleted user or a community wiki: the name is the first text of the block
        name = next((s.strip() for s in details.stripped_strings), "")
    match = _USER_PATH.search(link["href"]) if link is not None else None
    return {"author_id": int(match.group(1)) if match else None, "author": name}


def _attr(tag: Tag | None, name: str) -> str:
    """A single-valued attribute's text, "" where the tag or the attribute is absent (bs4 types every attribute as
    possibly multi-valued, as `class` is)."""
    value = tag.get(name) if tag is not None else None
    return value if isinstance(value, str) else " ".join(value) if value else ""


def parse_question_page(html: str | bytes, url: str) -> dict:
    """One question page as a record: the question, the answers on this page, and the next answer page.

    Pages are decoded as UTF-8 explicitly: saved pages carry no `<meta charset>` (it came in the header).
    """
    if isinstance(html, bytes):
        html = html.decode("utf-8", errors="replace")
    soup = BeautifulSoup(html, "lxml")
    question = soup.select_one("#question")
    if question is None:
        raise PageParseError(f"{url}: no #question element (not a question page, or a new layout)")
    answers_section = soup.select_one("#answers")
    canonical = soup.select_one("link[rel=canonical]")
    page_url = _attr(canonical, "href") or url
    qid = _attr(question, "data-questionid") or (_QUESTION_PATH.search(urlsplit(page_url).path) or [None, None])[1]
    if not qid:
        raise PageParseError(f"{url}: no question id (data-questionid or /questions/N in the URL)")
    question_header = soup.select_one("#question-header")
    header = soup.select_one("#question-header h1")
    if header is not None:
        title = header.get_text(" ", strip=True)
    else:
        title = (soup.title.get_text(strip=True) if soup.title else "").rsplit(" - ", 1)[0]
    title = _TITLE_MARKERS.sub("", title)
    body, layout = _body(question, url, "the question")
    tags = [t.get_text(strip=True) for t in question.select(".post-tag")]
    tags = list(dict.fromkeys(tags))
    record = {
        "site": host_of(page_url) or host_of(url),
        "question_id": int(qid),
        "title": title,
        "body": body,
        "tags": tags,
        "creation_date": _created(
            question_header.parent or question if question_header is not None else question, answers_section
        )
        or _created(question),
        "score": _score(question, url, "the question"),
        "accepted_answer_id": -1,
        **_author(question, question=True),
        "answers": [],
        "layout": layout,
        "url": url,
        "declared_answers": None,
        "next_page": None,
    }
    if answers_section is None:
        return record
    counter = answers_section.select_one("[data-answercount]")
    if counter is not None:
        record["declared_answers"] = int(_attr(counter, "data-answercount"))
    for answer in answers_section.select("div.answer"):
        answer_id = _attr(answer, "data-answerid") or _attr(answer, "id").replace("answer-", "")
        if not answer_id.isdigit():
            raise PageParseError(f"{url}: an answer without a numeric id ({_attr(answer, 'id')!r})")
        accepted = answer.get("itemprop") == "acceptedAnswer" or "accepted-answer" in (answer.get("class") or [])
        what = f"answer {answer_id}"
        record["answers"].append(
            {
                "id": int(answer_id),
                "body": _body(answer, url, what)[0],
                "score": _score(answer, url, what),
                "accepted": accepted,
                "creation_date": _created(answer),
                **_author(answer, question=False),
            }
        )
        if accepted:
            record["accepted_answer_id"] = int(answer_id)
    pager = answers_section.select_one(".pager-answers")
    if pager is not None:
        nxt = pager.select_one("a[rel=next]") or next(
            (a for a in pager.select("a[href]") if a.get_text(strip=True).lower() == "next"), None
        )
        if _attr(nxt, "href"):
            record["next_page"] = urljoin(url, _attr(nxt, "href")).split("#", 1)[0]
    return record


def crawl_question(fetcher: Fetcher, url: str, max_pages: int = 50) -> tuple[dict | None, list[dict]]:
    """Fetch a question page and its further answer pages; (record or None, failures as {url, reason})."""
    failures: list[dict] = []
    result = fetcher.get(url)
    if not result.ok:
        return None, [{"url": result.url, "reason": result.reason or f"HTTP {result.status}"}]
    try:
        record = parse_question_page(result.body, result.url)
    except PageParseError as err:
        return None, [{"url": result.url, "reason": str(err)}]
    seen_pages = {result.url}
    seen_answers = {a["id"] for a in record["answers"]}
    next_page = record.pop("next_page")
    while next_page and len(seen_pages) < max_pages:
        if host_of(next_page) != host_of(url) or next_page in seen_pages:
            break  # the pager never leads off the question's own host, nor round in circles
        seen_pages.add(next_page)
        page = fetcher.get(next_page)
        if not page.ok:
            failures.append({"url": page.url, "reason": page.reason or f"HTTP {page.status}"})
            break
        try:
            more = parse_question_page(page.body, page.url)
        except PageParseError as err:
            failures.append({"url": page.url, "reason": str(err)})
            break
        if more["question_id"] != record["question_id"]:
            failures.append({"url": page.url, "reason": f"answer page belongs to question {more['question_id']}"})
            break
        for answer in more["answers"]:
            if answer["id"] not in seen_answers:
                seen_answers.add(answer["id"])
                record["answers"].append(answer)
                if answer["accepted"]:
                    record["accepted_answer_id"] = answer["id"]
        next_page = more["next_page"]
    record["pages"] = len(seen_pages)
    return record, failures

"""The thread rules of the StackExchangeQA build (pipelines/stackexchangeqa/threads.py), against the same rules
written one thread and one post at a time: the reference below, which the vectorised `assemble_threads` must
equal row for row."""

import random

import pyarrow as pa

from crawl.dump import ANSWER, FETCH_FAILED, QUESTION, iter_post_tables
from pipelines.blocks import map_groups_in_block
from pipelines.stackexchangeqa.config import KEPT_QUESTION, POSITIVE
from pipelines.stackexchangeqa.posts import DUPLICATE_MARK, PostAnalysis
from pipelines.stackexchangeqa.threads import THREAD_ROWS, assemble_threads, split_of


def _thread_rows(
    rows: list[dict], min_score: int, english_threshold: float, dev_fraction: float, test_fraction: float
) -> list[dict]:
    """The rules of pipelines/stackexchangeqa/threads.py for one thread's posts, one post at a time."""
    site = rows[0]["site"]

    def is_english(row) -> bool:
        return row["lang"] == "en" and row["lang_score"] >= english_threshold

    def out(row, role, status, qid, question, split, accepted=False):
        answer = row["text"] if role == "answer" else ""
        aid = f"{site}:{row['id']}" if role == "answer" else ""
        return {
            "site": site,
            "qid": qid,
            "aid": aid,
            "role": role,
            "status": status,
            "split": split,
            "question": question,
            "answer": answer,
            "score": row["score"],
            "accepted": accepted,
            "lang_by": row["lang_by"],
            "origin": row["origin"],
            "detail": detail_of(row, status),
            "licence": row["licence"] or "",
            "author_id": row.get("author_id"),
            "author": row.get("author") or "",
            "tags": thread_tags,
        }

    def detail_of(row, status) -> str:
        if status == "fetch_failed":
            return row["failure"] or ""
        if status == "answer_duplicate":
            return duplicate_of.get(row["id"], "")
        if status.endswith("overlaps_test_set"):
            return row.get("overlap") or ""
        return ""

    duplicate_of: dict[int, str] = {}
    thread_tags: list[str] = next((r["tags"] for r in rows if r["post_type"] == QUESTION), None) or []

    if rows[0]["thread"] == -1:
        return [
            out(r, "failure", "fetch_failed", "", "", "")
            if r["post_type"] == FETCH_FAILED
            else out(r, "other", "other_post_type", "", "", "")
            for r in rows
        ]

    # Duplicate-answer marks from the dedup stage travel as rows of this thread; they are not posts.
    duplicate_of.update({r["id"]: r["failure"] for r in rows if r["post_type"] == DUPLICATE_MARK})
    rows = [r for r in rows if r["post_type"] != DUPLICATE_MARK]
    if not rows:
        return []
    # The same post from two sources (two dumps, a dump and the API, ...): keep one copy, chosen by origin so
    # the choice does not depend on arrival order.
    rows.sort(key=lambda r: (r["post_type"], r["id"], r["origin"] or ""))
    unique, duplicates = [], []
    for row in rows:
        same = unique and unique[-1]["post_type"] == row["post_type"] and unique[-1]["id"] == row["id"]
        (duplicates if same else unique).append(row)
    rows = unique
    questions = [r for r in rows if r["post_type"] == QUESTION]
    answers = sorted((r for r in rows if r["post_type"] == ANSWER), key=lambda r: r["id"])
    dropped_copies = [
        out(r, "question" if r["post_type"] == QUESTION else "answer", "duplicate_post", "", "", "") for r in duplicates
    ]
    if not questions:
        return [out(r, "answer", "orphan_answer", "", "", "") for r in answers] + dropped_copies
    question = questions[0]
    qid = f"{site}:{question['id']}"
    split = split_of(site, question["id"], dev_fraction, test_fraction)
    qtext = question["text"]

    if not qtext:
        qstatus = "question_empty"
    elif not is_english(question):
        qstatus = "question_not_english"
    elif question.get("overlap"):
        qstatus = "question_overlaps_test_set"
    elif not answers:
        qstatus = "question_no_answers"
    else:
        qstatus = None
    result = []
    positives = 0
    for answer in answers:
        if qstatus is not None:
            status = "answer_of_dropped_question"
        elif not answer["text"]:
            status = "answer_empty"
        elif not is_english(answer):
            status = "answer_not_english"
        elif answer.get("overlap"):
            status = "answer_overlaps_test_set"
        elif answer["id"] in duplicate_of:
            status = "answer_duplicate"
        elif answer["score"] < min_score:
            status = "answer_below_min_score"
        else:
            status = POSITIVE
            positives += 1
        accepted = answer["id"] == question["accepted_answer_id"]
        result.append(out(answer, "answer", status, qid, "", split, accepted))
    if qstatus is None:
        qstatus = KEPT_QUESTION if positives else "question_no_positive"
    result.insert(0, out(question, "question", qstatus, qid, qtext, split))
    return result + dropped_copies


def assemble_thread(
    group: pa.Table, min_score: int, english_threshold: float, dev_fraction: float, test_fraction: float
) -> pa.Table:
    """Give every post of one thread (a question and its answers) a status and its question's split."""
    return pa.Table.from_pylist(
        _thread_rows(group.to_pylist(), min_score, english_threshold, dev_fraction, test_fraction), schema=THREAD_ROWS
    )


def assemble_threads_row_by_row(block: pa.Table, **options) -> pa.Table:
    """`assemble_thread` over every thread of a block, one thread at a time: the reference `assemble_threads`
    is tested against."""
    return map_groups_in_block(block, ["site", "thread"], lambda rows: _thread_rows(rows, **options), THREAD_ROWS)


def test_split_is_stable_and_roughly_proportional():
    splits = [split_of("beer", i, 0.1, 0.1) for i in range(20000)]
    assert splits == [split_of("beer", i, 0.1, 0.1) for i in range(20000)]
    share = {s: splits.count(s) / len(splits) for s in ("train", "dev", "test")}
    assert abs(share["dev"] - 0.1) < 0.01 and abs(share["test"] - 0.1) < 0.01


def _post(id, post_type, text, score=0, parent=-1, accepted=-1, lang="en"):
    return {
        "site": "s",
        "id": id,
        "post_type": post_type,
        "parent_id": parent,
        "accepted_answer_id": accepted,
        "score": score,
        "title": "",
        "tags": [],
        "creation_date": "",
        "line": id,
        "origin": "t",
        "failure": "",
        "licence": "CC BY-SA 4.0",
        "text": text,
        "lang": lang,
        "lang_score": 0.99,
        "lang_by": "fasttext",
        "thread": 1 if post_type in (1, 2) else -1,
    }


def test_thread_statuses_cover_every_post():
    group = pa.Table.from_pylist(
        [
            _post(1, 1, "question", accepted=3),
            _post(2, 2, "low", score=1, parent=1),
            _post(3, 2, "good", score=5, parent=1),
            _post(4, 2, "boa resposta", score=9, parent=1, lang="pt"),
            _post(5, 2, "", score=9, parent=1),
        ]
    )
    out = assemble_thread(group, min_score=2, english_threshold=0.5, dev_fraction=0.1, test_fraction=0.1)
    status = dict(zip(out.column("aid").to_pylist(), out.column("status").to_pylist()))
    assert status == {
        "": "question",
        "s:2": "answer_below_min_score",
        "s:3": "positive",
        "s:4": "answer_not_english",
        "s:5": "answer_empty",
    }
    assert out.num_rows == group.num_rows
    accepted = dict(zip(out.column("aid").to_pylist(), out.column("accepted").to_pylist()))
    assert accepted["s:3"] is True and accepted["s:2"] is False
    no_positive = assemble_thread(group.slice(0, 2), 2, 0.5, 0.1, 0.1)
    assert no_positive.column("status").to_pylist() == ["question_no_positive", "answer_below_min_score"]


def test_threads_assembled_at_once_are_the_thread_by_thread_reference(beer_dump):
    """`assemble_threads` (vectorised) against `assemble_threads_row_by_row` (the rules one thread at a time):
    the real beer dump's posts, shuffled, plus posts made to take every branch: the same post twice from two
    origins, an orphan answer, a fetch failure, other post types, a duplicate-answer mark, an overlap with a test
    set, an empty question, a question with no answers."""

    analysis = PostAnalysis()
    posts = pa.concat_tables([analysis(t) for t in iter_post_tables(beer_dump)])
    rows = posts.to_pylist()
    first_answer = next(r for r in rows if r["post_type"] == 2)
    question = next(r for r in rows if r["id"] == first_answer["parent_id"])
    extra = [
        dict(question, origin="api"),
        dict(first_answer, origin="page"),
        dict(first_answer, id=10**9, parent_id=10**9 + 1, thread=10**9 + 1),  # orphan
        dict(first_answer, id=-5, post_type=FETCH_FAILED, thread=-1, failure="404 at URL"),
        dict(first_answer, id=10**9 + 7, post_type=5, thread=-1),
        dict(first_answer, post_type=DUPLICATE_MARK, failure="beer.stackexchange.com:1"),
        dict(question, id=10**9 + 2, thread=10**9 + 2, text=""),
        dict(question, id=10**9 + 3, thread=10**9 + 3),
    ]
    shuffled = rows + extra
    random.Random(4).shuffle(shuffled)
    block = pa.Table.from_pylist(shuffled, schema=posts.schema)
    options = {"min_score": 2, "english_threshold": 0.5, "dev_fraction": 0.1, "test_fraction": 0.1}
    expected = assemble_threads_row_by_row(block, **options)
    assert assemble_threads(block, **options).equals(expected)
    statuses = set(expected["status"].to_pylist())
    assert {
        "duplicate_post",
        "orphan_answer",
        "fetch_failed",
        "other_post_type",
        "answer_duplicate",
        "question_empty",
        "question_no_answers",
        "positive",
        "question",
    } <= statuses
    with_overlap = block.append_column(
        "overlap", pa.array(["wikiqa" if i % 50 == 0 else "" for i in range(block.num_rows)])
    )
    assert assemble_threads(with_overlap, **options).equals(assemble_threads_row_by_row(with_overlap, **options))
    assert assemble_threads(block.slice(0, 0), **options).num_rows == 0

"""Stage 4's rules: every post of a thread (a question and its answers, by site and question id) gets a status,
kept or the reason it was dropped, and its question's split, for all the threads of a block at once.

- A post outside any thread is `fetch_failed` (a URL the crawler could not fetch) or `other_post_type`.
- The same post twice (two dumps, a dump and the API): the first copy by origin is kept, the others are
  `duplicate_post`, so the choice does not depend on arrival order.
- An answer whose question is absent is an `orphan_answer`.
- The question is dropped as `question_empty`, `question_not_english`, `question_overlaps_test_set` or
  `question_no_answers`, checked in that order; a text is English when its language is "en" with a probability
  of at least `english_threshold`.
- Each answer of a question not dropped: `answer_empty`, `answer_not_english`, `answer_overlaps_test_set`,
  `answer_duplicate` (a duplicate mark of the dedup stage names it) or `answer_below_min_score` (kept only as
  a negative candidate), in that order; otherwise it is a `positive`. The answers of a dropped question are
  `answer_of_dropped_question`.
- The question is then kept (`question`) when it has a positive, and `question_no_positive` otherwise.
- Every kept or dropped post of a thread with a question carries its question's id and split (`split_of`: a
  hash of site and question id, stable when sites or posts are added).

tests/pipelines/test_stackexchangeqa_threads.py holds the same rules written thread by thread, one post at a time,
which `assemble_threads` is checked against.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from crawl.dump import ANSWER, FETCH_FAILED, QUESTION
from pipelines.blocks import differs_from_previous, trim_when_idle
from pipelines.stackexchangeqa.config import KEPT_QUESTION, POSITIVE
from pipelines.stackexchangeqa.posts import DUPLICATE_MARK


def stable_unit(*parts) -> float:
    """A number in [0, 1) from the parts alone: the same on every machine, run and partitioning."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def split_of(site: str, question_id: int, dev_fraction: float, test_fraction: float) -> str:
    """Split by a hash of (site, question id): stable when more sites or posts are added."""
    u = stable_unit("split", site, question_id)
    return "test" if u < test_fraction else "dev" if u < test_fraction + dev_fraction else "train"


# `question` is the text of question rows and empty on answer rows (a thread's question text once, not once per
# answer: it was a third of the threads' bytes); pairs take it from their question row (`build`).
THREAD_ROWS = pa.schema(
    [
        ("site", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("role", pa.string()),
        ("status", pa.string()),
        ("split", pa.string()),
        ("question", pa.string()),
        ("answer", pa.string()),
        ("score", pa.int32()),
        ("accepted", pa.bool_()),
        ("lang_by", pa.string()),
        ("origin", pa.string()),
        ("detail", pa.string()),  # fetch failure reason, kept duplicate's id, or the overlapped test sets
        ("tags", pa.list_(pa.string())),
        ("licence", pa.string()),
        ("author_id", pa.int64()),
        ("author", pa.string()),
    ]
)


def assemble_threads(
    block: pa.Table, min_score: int, english_threshold: float, dev_fraction: float, test_fraction: float
) -> pa.Table:
    """Every post of a block that holds whole threads (after a shuffle by thread) with its status, role and
    question's split: the module's rules for all threads at once, in Arrow and numpy (a Python dict per post cost
    more than the rest of the stage). The same rows, in the same order, as the tests' thread-by-thread reference."""
    trim_when_idle(now=True)
    if block.num_rows == 0:
        return THREAD_ROWS.empty_table()
    post_type = block["post_type"]
    is_mark = pc.equal(post_type, DUPLICATE_MARK).to_numpy(zero_copy_only=False)
    duplicate_of: dict[tuple[str, int], str] = {}
    if is_mark.any():
        marks = block.filter(pa.array(is_mark))
        duplicate_of = {
            (site, post_id): failure
            for site, post_id, failure in zip(*(marks[c].to_pylist() for c in ("site", "id", "failure")))
        }
        block = block.filter(pa.array(~is_mark))
        if block.num_rows == 0:
            return THREAD_ROWS.empty_table()
    # Sorted without the texts, which are taken once, straight into the output's order (each copy of a block's
    # texts cost as much as the rest of the assembly).
    texts = block["text"]
    block = block.drop_columns(["text"])
    block = block.append_column("_origin", pc.fill_null(block["origin"], ""))
    by_thread = pc.sort_indices(block, [(k, "ascending") for k in ("site", "thread", "post_type", "id", "_origin")])
    block = block.take(by_thread)
    by_thread = by_thread.to_numpy()  # sorted row -> row of the block as it came
    n = block.num_rows
    kind = block["post_type"].to_numpy(zero_copy_only=False).astype(np.int64)
    thread = block["thread"].to_numpy(zero_copy_only=False)
    ids = block["id"].to_numpy(zero_copy_only=False)
    new_thread = differs_from_previous(block, ["site", "thread"])
    segment = np.cumsum(new_thread) - 1
    in_thread = thread != -1
    # The same post twice in a thread (two dumps, a dump and the API): the first by origin is kept.
    copy = np.zeros(n, dtype=bool)
    copy[1:] = ~new_thread[1:] & (kind[1:] == kind[:-1]) & (ids[1:] == ids[:-1])
    copy &= in_thread
    is_question = in_thread & ~copy & (kind == QUESTION)
    is_answer = in_thread & ~copy & (kind == ANSWER)
    question_of = np.full(segment[-1] + 1, -1, dtype=np.int64)
    question_of[segment[is_question]] = np.flatnonzero(is_question)
    question_row = question_of[segment]  # -1 where the thread has no question
    has_question = question_row >= 0
    q = np.where(has_question, question_row, 0)

    empty = pc.equal(texts, "").to_numpy(zero_copy_only=False)[by_thread]
    english = pc.and_(
        pc.fill_null(pc.equal(block["lang"], "en"), False),
        pc.fill_null(pc.greater_equal(block["lang_score"], english_threshold), False),
    )
    english = english.to_numpy(zero_copy_only=False)
    if "overlap" in block.column_names:
        overlap_text = block["overlap"]
        overlaps = pc.fill_null(pc.not_equal(overlap_text, ""), False).to_numpy(zero_copy_only=False)
    else:
        overlap_text, overlaps = None, np.zeros(n, dtype=bool)
    answers_in_thread = np.bincount(segment[is_answer], minlength=len(question_of))[segment]
    site_list = block["site"].to_pylist()
    duplicate = np.zeros(n, dtype=bool)
    if duplicate_of:
        duplicate = np.array([(site, post_id) in duplicate_of for site, post_id in zip(site_list, ids.tolist())])
    score = block["score"].to_numpy(zero_copy_only=False)

    # The question's status where the thread is dropped for its question ("" while it may still be kept).
    question_drop = np.select(
        [empty[q], ~english[q], overlaps[q], answers_in_thread == 0],
        ["question_empty", "question_not_english", "question_overlaps_test_set", "question_no_answers"],
        "",
    )
    answer_status = np.select(
        [~has_question, question_drop != "", empty, ~english, overlaps, duplicate, score < min_score],
        [
            "orphan_answer",
            "answer_of_dropped_question",
            "answer_empty",
            "answer_not_english",
            "answer_overlaps_test_set",
            "answer_duplicate",
            "answer_below_min_score",
        ],
        POSITIVE,
    )
    positives = np.bincount(segment[is_answer & (answer_status == POSITIVE)], minlength=len(question_of))[segment]
    question_status = np.where(
        question_drop != "", question_drop, np.where(positives > 0, KEPT_QUESTION, "question_no_positive")
    )
    failure = kind == FETCH_FAILED
    status = np.select(
        [~in_thread & failure, ~in_thread, copy, is_question, is_answer],
        ["fetch_failed", "other_post_type", "duplicate_post", question_status, answer_status],
        "",
    )
    role = np.select([~in_thread & failure, ~in_thread, kind == QUESTION], ["failure", "other", "question"], "answer")
    in_question = (is_question | is_answer) & has_question  # rows that carry their question's id and split

    sites = block["site"]
    id_text = pc.cast(block["id"], pa.string())
    post_key = pc.binary_join_element_wise(sites, id_text, ":")
    question_index = pa.array(q, pa.int64())
    qid = pc.if_else(pa.array(in_question), pc.take(post_key, question_index), "")
    splits = np.full(len(question_of), "", dtype=object)
    for seg in np.flatnonzero(question_of >= 0).tolist():
        row = int(question_of[seg])
        splits[seg] = split_of(site_list[row], int(ids[row]), dev_fraction, test_fraction)
    split = np.where(in_question, splits[segment], "")
    is_answer_role = pa.array(role == "answer")
    accepted = is_answer & has_question & (ids == block["accepted_answer_id"].to_numpy(zero_copy_only=False)[q])
    detail = pc.if_else(pa.array(status == "fetch_failed"), pc.fill_null(block["failure"], ""), "")
    if overlap_text is not None:
        detail = pc.if_else(
            pa.array(np.char.endswith(status.astype(str), "overlaps_test_set")), pc.fill_null(overlap_text, ""), detail
        )
    if duplicate_of:
        marked = status == "answer_duplicate"
        kept_copy = [duplicate_of.get((site_list[i], int(ids[i])), "") if marked[i] else None for i in range(n)]
        detail = pc.if_else(pa.array(marked), pa.array(kept_copy, pa.string()), detail)
    empty_tags = pa.array([[]] * n, pa.list_(pa.string()))
    thread_tags = pc.take(block["tags"], question_index)
    tags = pc.if_else(
        pa.array(has_question & in_thread & ~pc.is_null(thread_tags).to_numpy(zero_copy_only=False)),
        thread_tags,
        empty_tags,
    )
    result = pa.table(
        {
            "site": sites,
            "qid": qid,
            "aid": pc.if_else(is_answer_role, post_key, ""),
            "role": pa.array(role),
            "status": pa.array(status),
            "split": pa.array(split, pa.string()),
            "score": block["score"],
            "accepted": pa.array(accepted),
            "lang_by": block["lang_by"],
            "origin": block["origin"],
            "detail": detail,
            "tags": tags,
            "licence": pc.fill_null(block["licence"], ""),
            "author_id": block["author_id"],
            "author": pc.fill_null(block["author"], ""),
        }
    )
    # Each thread: its question, its answers by id, then the copies dropped; posts outside threads (fetch
    # failures, other post types) as they came (the reference's order).
    order = np.lexsort((np.where(in_thread, np.arange(n), by_thread), copy, segment))
    result = result.take(pa.array(order, pa.int64()))
    own_text = pc.take(texts, pa.array(by_thread[order]))
    question_text = pc.if_else(pa.array(is_question[order]), own_text, "")
    answer_text = pc.if_else(pa.array((role == "answer")[order]), own_text, "")
    result = result.append_column("question", question_text).append_column("answer", answer_text)
    return result.select(THREAD_ROWS.names).cast(THREAD_ROWS)

"""StackExchangeQA construction as Ray Data stages (GSAMN paper, Lai et al. 2019, section 3).

The recipe: keep English only, make every answer with at least two up-votes a positive pair for its question,
and sample real answers to other questions as negatives (the paper: 628,706 positive and 9,874,758 negative
pairs, about 15.7 negatives per positive).

Stages, Ray Data reads and maps, then Ray tasks over the blocks they made:
  1. posts from dump files (`crawl.dump.posts_dataset`: a plain Posts.xml is cut into byte ranges read in
     parallel; gzip and 7z are streamed by one task each), the API or pages (`crawl.sources.crawled_posts`),
     all in the POSTS shape;
  2. per post, in the same tasks as the read (`analyse_posts`, a cached `PostAnalysis` per worker): HTML to
     text (`clean_text`), language ID (`LanguageIdentifier`), overlap with evaluation test sets
     (`pipelines.overlap`, when configured);
  3. duplicate answers found across the corpus (`pipelines.dedup`, MinHash LSH) and sent to their threads
     as marker rows;
  4. threads assembled by question (a hash shuffle by thread, `pipelines.shuffle`, then `assemble_threads` per
     partition): every post gets a `status`, either kept ("question", "positive") or the reason it was dropped,
     and its question's split; the same task counts the funnel and makes the attribution rows;
  5. negatives sampled for each positive from the answers of other questions in the same pool group (site and
     split by default) at cluster scale (`pipelines.negatives`), seeded so the result does not depend on
     partitioning;
  6. pairs grouped by question (a hash shuffle by question id), questions in an order drawn from the seed,
     so that shards never hold long runs of one label.

`build(cfg)` returns the pairs dataset and the funnel (`build_blocks(cfg)` the object references beneath);
`write(cfg)` writes shards, `stats.json`, `failures.jsonl` and the data card atomically. The funnel counts
every post exactly once, so its parts add up to the posts read.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from crawl.dump import ANSWER, FETCH_FAILED, QUESTION, posts_dataset
from pipelines.blocks import (differs_from_previous, map_groups_in_block, materialised_blocks, release_unused_memory,
                             trim_when_idle)
from pipelines.datacard import LENGTH_BINS, length_histogram, write_card
from pipelines.dedup import DEDUP_MODES, duplicate_answers
from pipelines.atomic import recognised_by, staged_dir
from runtime.checks import UsageError, at_least, integer_at_least, one_of, whole, within
from pipelines.langid import LanguageIdentifier
from pipelines.negatives import POOL_MODES, negative_blocks, pool_groups
from pipelines.schemas import QA_PAIRS, conform
from pipelines.shards import consecutive_groups, write_blocks, write_parquet_atomically
from pipelines.shuffle import composed, hash_shuffle
from pipelines.text import html_to_text

JOB = "build_stackexchangeqa"  # the name its outputs carry (pipelines.atomic)
SPLITS = ("train", "dev", "test")
DUPLICATE_MARK = -2  # post_type of the rows that carry "this answer duplicates that one" into its thread
PAPER = {"positive_pairs": 628_706, "negative_pairs": 9_874_758, "negatives_per_positive": round(9_874_758 / 628_706, 2)}

# Post statuses. Kept posts are "question" and "positive"; every other status is a reason for dropping.
KEPT_QUESTION, POSITIVE = "question", "positive"
DROP_REASONS = {
    "fetch_failed": "a URL the crawler could not fetch or parse (see failures.jsonl)",
    "other_post_type": "not a question or an answer (tag wiki, placeholder)",
    "duplicate_post": "the same post again (from a second dump, the API or a page); the first copy is kept",
    "orphan_answer": "answer whose question is not in the dump",
    "question_empty": "question with no text after HTML removal",
    "question_not_english": "question not identified as English",
    "question_no_answers": "question without answers",
    "question_no_positive": "question without an English answer scored at least min_score",
    "answer_of_dropped_question": "answer to a question dropped as empty or not English",
    "answer_empty": "answer with no text after HTML removal",
    "answer_not_english": "answer not identified as English",
    "answer_below_min_score": "answer scored below min_score (kept only as a negative candidate)",
    "answer_duplicate": "exact or near duplicate of a better-scored answer (MinHash over word 5-grams)",
    "question_overlaps_test_set": "question text overlaps a target test set (WikiQA, TrecQA, ...)",
    "answer_overlaps_test_set": "answer text overlaps a target test set",
}
# Answers that other questions may draw as negatives: real, English, non-empty answers.
NEGATIVE_POOL = ("positive", "answer_below_min_score")
# What negative sampling reads of a thread row, besides the pool's answers and their scores.
NEGATIVE_COLUMNS = ("qid", "aid", "site", "split", "tags")


@dataclass
class BuildConfig:
    dumps: list[str] = field(default_factory=list)
    output: str = "data/stackexchangeqa"
    min_score: int = 2
    negatives: float = PAPER["negatives_per_positive"]  # per positive pair (fractional allowed): the paper's 15.71
    negative_pool: str = "site"  # where negatives come from: "site" (same site), "any" site, same "tag"
    negative_bucket_size: int = 4096  # answers per sampling bucket: what one node holds at a time
    dedup: str = "near"  # duplicate answers: "near" (MinHash LSH, includes exact), "exact", or "off"
    near_duplicate_threshold: float = 0.8  # estimated Jaccard of word 5-gram shingles
    exclude_test_sets: dict[str, str] = field(default_factory=dict)  # {"wikiqa": PATH, ...}: see pipelines/overlap
    overlap_ngram: int = 13
    seed: int = 13
    dev_fraction: float = 0.1
    test_fraction: float = 0.1
    keep_code: bool = True
    fasttext_threshold: float = 0.5  # below this fastText confidence, langdetect decides
    language_chars: int | None = 200  # fastText reads this much of a text (None: all); see pipelines/langid
    english_threshold: float = 0.5  # the deciding model's probability for "en" must reach this
    sites: list[str | None] = field(default_factory=list)  # one per dump; empty: from the path
    rows_per_shard: int = 100_000
    # Work sizes, fixed so that what one task holds does not grow with the input (more input: more tasks).
    read_range_mb: int = 16  # a plain Posts.xml is read in byte ranges of at most this size, in parallel
    partition_mb: int = 32  # each shuffle partition (threads, duplicate keys, negative buckets) ~ this much dump
    # Crawled sources (crawl/): API sites, question page URLs, and how to fetch them.
    api_sites: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    cache_dir: str | None = None  # default: <output>.cache beside the output; kept between runs
    api_key: str | None = None
    api_base_url: str = "https://api.stackexchange.com/2.3"
    api_filter: str = "withbody"
    api_max_pages: int | None = None
    requests_per_second: float = 1.0
    api_requests_per_second: float = 10.0
    respect_robots: bool = True
    crawlers: int = 4
    max_retries: int = 4

    def __post_init__(self):
        """Every option range-checked here, before any work (the job's --dry-run runs the same checks)."""
        whole("--min-score", self.min_score)
        at_least("--negatives", self.negatives, 0)
        one_of("--dedup", self.dedup, DEDUP_MODES)
        one_of("--negative-pool", self.negative_pool, POOL_MODES)
        integer_at_least("negative_bucket_size", self.negative_bucket_size, 1)
        within("--near-duplicate-threshold", self.near_duplicate_threshold, 0, 1)
        integer_at_least("--overlap-ngram", self.overlap_ngram, 1)
        within("--dev-fraction", self.dev_fraction, 0, 1, high_open=True)
        within("--test-fraction", self.test_fraction, 0, 1, high_open=True)
        if self.dev_fraction + self.test_fraction >= 1:
            raise UsageError(f"--dev-fraction {self.dev_fraction} and --test-fraction {self.test_fraction} leave no "
                             "questions to train on (their sum must be below 1)")
        within("--fasttext-threshold", self.fasttext_threshold, 0, 1)
        integer_at_least("--language-chars", self.language_chars, 1, allow_none=True)
        within("--english-threshold", self.english_threshold, 0, 1)
        integer_at_least("--rows-per-shard", self.rows_per_shard, 1)
        integer_at_least("--read-range-mb", self.read_range_mb, 1)
        integer_at_least("--partition-mb", self.partition_mb, 1)
        integer_at_least("--api-max-pages", self.api_max_pages, 1, allow_none=True)
        for option, rate in (("--requests-per-second", self.requests_per_second),
                             ("--api-requests-per-second", self.api_requests_per_second)):
            at_least(option, rate, 0)
            if rate == 0:
                raise UsageError(f"{option} must be above 0 (a crawler that may send nothing never ends)")
        integer_at_least("--crawlers", self.crawlers, 1)
        integer_at_least("--max-retries", self.max_retries, 0)
        if self.sites and len(self.sites) != len(self.dumps):
            raise UsageError(f"{len(self.sites)} site names for {len(self.dumps)} dumps")

    def input_paths(self) -> list[str]:
        """What the build reads and keeps, which its output must never hold: dumps, test sets to exclude, the
        crawl cache."""
        return [*self.dumps, *self.exclude_test_sets.values(), *([self.cache_dir] if self.cache_dir else [])]


# A build written before outputs carried a completion marker: its stats.json, with the funnel's splits and pairs.
earlier_build = recognised_by("stats.json", "splits", "pairs")


def stable_unit(*parts) -> float:
    """A number in [0, 1) from the parts alone: the same on every machine, run and partitioning."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def split_of(site: str, question_id: int, dev_fraction: float, test_fraction: float) -> str:
    """Split by a hash of (site, question id): stable when more sites or posts are added."""
    u = stable_unit("split", site, question_id)
    return "test" if u < test_fraction else "dev" if u < test_fraction + dev_fraction else "train"


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

    def __init__(self, keep_code: bool = True, unsure_below: float = 0.5, index_ref=None, overlap_ngram: int = 13,
                 language_chars: int | None = 200):
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
        return _thread_key(batch.drop_columns([c for c in ANALYSED_DROPS if c in batch.column_names]))


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
        tuple(r.hex() for r in index_ref) if index_ref else (),)
    analyser = _ANALYSERS.get(key)
    if analyser is None:
        analyser = _ANALYSERS[key] = PostAnalysis(**options)
    result = analyser(batch)
    release_unused_memory()
    return result


def _thread_key(batch: pa.Table) -> pa.Table:
    post_type = batch.column("post_type")
    thread = pc.if_else(pc.equal(post_type, QUESTION), batch.column("id"),
                        pc.if_else(pc.equal(post_type, ANSWER), batch.column("parent_id"), pa.scalar(-1, pa.int64())))
    return batch.append_column("thread", thread)


# `question` is the text of question rows and empty on answer rows (a thread's question text once, not once per
# answer: it was a third of the threads' bytes); pairs take it from their question row (`build`).
THREAD_ROWS = pa.schema(
    [
        ("site", pa.string()), ("qid", pa.string()), ("aid", pa.string()), ("role", pa.string()),
        ("status", pa.string()), ("split", pa.string()), ("question", pa.string()), ("answer", pa.string()),
        ("score", pa.int32()), ("accepted", pa.bool_()), ("lang_by", pa.string()), ("origin", pa.string()),
        ("detail", pa.string()),  # fetch failure reason, kept duplicate's id, or the overlapped test sets
        ("tags", pa.list_(pa.string())), ("licence", pa.string()),
        ("author_id", pa.int64()), ("author", pa.string()),
    ]
)


def assemble_thread(group: pa.Table, min_score: int, english_threshold: float, dev_fraction: float,
                    test_fraction: float) -> pa.Table:
    """Give every post of one thread (a question and its answers) a status and its question's split."""
    return pa.Table.from_pylist(_thread_rows(group.to_pylist(), min_score, english_threshold, dev_fraction,
                                             test_fraction), schema=THREAD_ROWS)


def assemble_threads_row_by_row(block: pa.Table, **options) -> pa.Table:
    """`assemble_thread` over every thread of a block, one thread at a time: the reference `assemble_threads`
    is tested against."""
    return map_groups_in_block(block, ["site", "thread"], lambda rows: _thread_rows(rows, **options), THREAD_ROWS)


def assemble_threads(block: pa.Table, min_score: int, english_threshold: float, dev_fraction: float,
                     test_fraction: float) -> pa.Table:
    """Every post of a block that holds whole threads (after a shuffle by thread) with its status, role and
    question's split: `assemble_thread`'s rules for all threads at once, in Arrow and numpy (a Python dict per
    post cost more than the rest of the stage). The same rows, in the same order, as the thread-by-thread
    reference `assemble_threads_row_by_row`."""
    trim_when_idle(now=True)
    if block.num_rows == 0:
        return THREAD_ROWS.empty_table()
    post_type = block["post_type"]
    is_mark = pc.equal(post_type, DUPLICATE_MARK).to_numpy(zero_copy_only=False)
    duplicate_of: dict[tuple[str, int], str] = {}
    if is_mark.any():
        marks = block.filter(pa.array(is_mark))
        duplicate_of = {(site, post_id): failure for site, post_id, failure in
                        zip(*(marks[c].to_pylist() for c in ("site", "id", "failure")))}
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
    english = pc.and_(pc.fill_null(pc.equal(block["lang"], "en"), False),
                      pc.fill_null(pc.greater_equal(block["lang_score"], english_threshold), False))
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
        ["question_empty", "question_not_english", "question_overlaps_test_set", "question_no_answers"], "")
    answer_status = np.select(
        [~has_question, question_drop != "", empty, ~english, overlaps, duplicate, score < min_score],
        ["orphan_answer", "answer_of_dropped_question", "answer_empty", "answer_not_english",
         "answer_overlaps_test_set", "answer_duplicate", "answer_below_min_score"], POSITIVE)
    positives = np.bincount(segment[is_answer & (answer_status == POSITIVE)], minlength=len(question_of))[segment]
    question_status = np.where(question_drop != "", question_drop,
                               np.where(positives > 0, KEPT_QUESTION, "question_no_positive"))
    failure = kind == FETCH_FAILED
    status = np.select(
        [~in_thread & failure, ~in_thread, copy, is_question, is_answer],
        ["fetch_failed", "other_post_type", "duplicate_post", question_status, answer_status], "")
    role = np.select([~in_thread & failure, ~in_thread, kind == QUESTION], ["failure", "other", "question"],
                     "answer")
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
    accepted = is_answer & has_question & (
        ids == block["accepted_answer_id"].to_numpy(zero_copy_only=False)[q])
    detail = pc.if_else(pa.array(status == "fetch_failed"), pc.fill_null(block["failure"], ""), "")
    if overlap_text is not None:
        detail = pc.if_else(pa.array(np.char.endswith(status.astype(str), "overlaps_test_set")),
                            pc.fill_null(overlap_text, ""), detail)
    if duplicate_of:
        marked = status == "answer_duplicate"
        kept_copy = [duplicate_of.get((site_list[i], int(ids[i])), "") if marked[i] else None for i in range(n)]
        detail = pc.if_else(pa.array(marked), pa.array(kept_copy, pa.string()), detail)
    empty_tags = pa.array([[]] * n, pa.list_(pa.string()))
    thread_tags = pc.take(block["tags"], question_index)
    tags = pc.if_else(pa.array(has_question & in_thread & ~pc.is_null(thread_tags).to_numpy(zero_copy_only=False)),
                      thread_tags, empty_tags)
    result = pa.table({
        "site": sites, "qid": qid, "aid": pc.if_else(is_answer_role, post_key, ""), "role": pa.array(role),
        "status": pa.array(status), "split": pa.array(split, pa.string()),
        "score": block["score"], "accepted": pa.array(accepted),
        "lang_by": block["lang_by"], "origin": block["origin"], "detail": detail, "tags": tags,
        "licence": pc.fill_null(block["licence"], ""), "author_id": block["author_id"],
        "author": pc.fill_null(block["author"], ""),
    })
    # Each thread: its question, its answers by id, then the copies dropped; posts outside threads (fetch
    # failures, other post types) as they came (the reference's order).
    order = np.lexsort((np.where(in_thread, np.arange(n), by_thread), copy, segment))
    result = result.take(pa.array(order, pa.int64()))
    own_text = pc.take(texts, pa.array(by_thread[order]))
    question_text = pc.if_else(pa.array(is_question[order]), own_text, "")
    answer_text = pc.if_else(pa.array((role == "answer")[order]), own_text, "")
    result = result.append_column("question", question_text).append_column("answer", answer_text)
    return result.select(THREAD_ROWS.names).cast(THREAD_ROWS)


def _thread_rows(rows: list[dict], min_score: int, english_threshold: float, dev_fraction: float,
                 test_fraction: float) -> list[dict]:
    site = rows[0]["site"]

    def is_english(row) -> bool:
        return row["lang"] == "en" and row["lang_score"] >= english_threshold

    def out(row, role, status, qid, question, split, accepted=False):
        answer = row["text"] if role == "answer" else ""
        aid = f"{site}:{row['id']}" if role == "answer" else ""
        return {"site": site, "qid": qid, "aid": aid, "role": role, "status": status, "split": split,
                "question": question, "answer": answer, "score": row["score"], "accepted": accepted,
                "lang_by": row["lang_by"], "origin": row["origin"], "detail": detail_of(row, status),
                "licence": row["licence"] or "", "author_id": row.get("author_id"),
                "author": row.get("author") or "", "tags": thread_tags}

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
        return [out(r, "failure", "fetch_failed", "", "", "") if r["post_type"] == FETCH_FAILED else
                out(r, "other", "other_post_type", "", "", "") for r in rows]

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
    dropped_copies = [out(r, "question" if r["post_type"] == QUESTION else "answer", "duplicate_post", "", "", "")
                      for r in duplicates]
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




def crawl_config(cfg: BuildConfig):
    from crawl.api import ApiConfig
    from crawl.sources import CrawlConfig

    return CrawlConfig(
        cache_dir=cfg.cache_dir or os.path.abspath(cfg.output) + ".cache", api_sites=cfg.api_sites, urls=cfg.urls,
        api=ApiConfig(base_url=cfg.api_base_url, key=cfg.api_key, filter=cfg.api_filter,
                      max_pages=cfg.api_max_pages),
        requests_per_second=cfg.requests_per_second, api_requests_per_second=cfg.api_requests_per_second,
        respect_robots=cfg.respect_robots, crawlers=cfg.crawlers, max_retries=cfg.max_retries)


def source_posts(cfg: BuildConfig):
    """POSTS rows from every source the config names: dump files, API sites, page URLs."""
    from crawl.sources import crawled_posts

    if not (cfg.dumps or cfg.api_sites or cfg.urls):
        raise ValueError("nothing to build from: give dumps, API sites or page URLs")
    parts = []
    if cfg.dumps:
        parts.append(posts_dataset(cfg.dumps, cfg.sites or None, max_range_bytes=cfg.read_range_mb << 20,
                                   min_range_bytes=min(8, cfg.read_range_mb) << 20))
    if cfg.api_sites or cfg.urls:
        parts.append(crawled_posts(crawl_config(cfg)))
    return parts[0] if len(parts) == 1 else parts[0].union(*parts[1:])


def _threads_and_summary(block: pa.Table, pool_mode: str, **rules) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A partition of posts (whole threads) as thread rows (`assemble_threads`), with their funnel counts and
    attribution rows (`_summarise_threads`), counted while the worker holds the rows: a pass of their own over
    the stored threads cost 5.5 s at 1M posts on 2 cores."""
    threads = assemble_threads(block, **rules)
    return (threads, *_summarise_threads(threads, pool_mode))


def thread_blocks(cfg: BuildConfig, stages: _Stages) -> tuple[tuple[list, list[int]], list, list]:
    """Stages 1-4: every post of every source with its status, role, split and text, as references to the
    thread blocks (with their bytes), their funnel counts and their attribution rows; each stage waited for and
    timed in turn into `stages` (analysed posts, duplicate marks, threads), for the stage profile."""
    import ray
    from ray.data.expressions import col

    posts = source_posts(cfg)
    index_ref = None
    if cfg.exclude_test_sets:
        from pipelines.overlap import reference_index

        index_ref = [ray.put(reference_index(cfg.exclude_test_sets, cfg.overlap_ngram))]
    posts = posts.map_batches(analyse_posts, batch_format="pyarrow",
                              fn_kwargs={"keep_code": cfg.keep_code, "unsure_below": cfg.fasttext_threshold,
                                         "index_ref": index_ref, "overlap_ngram": cfg.overlap_ngram,
                                         "language_chars": cfg.language_chars})
    # Materialised, not streamed into the thread shuffle: streamed, the first stage and the shuffle together
    # took 98 s at 1M posts against 54 + 12 s one after the other (Ray Data's shuffle, one run each).
    posts = posts.materialize()
    count = posts.count()
    stages.done("read, text, language", count, "posts")
    refs, _, sizes = materialised_blocks(posts)
    sources = [(refs, sizes, None)]
    if cfg.dedup != "off":
        answers = posts.filter(expr=(col("post_type") == ANSWER) & (col("text") != ""))
        answers = answers.select_columns(["site", "id", "thread", "score", "text"])
        marks = duplicate_answers(answers, mode=cfg.dedup, threshold=cfg.near_duplicate_threshold,
                                  partitions=_partitions(cfg))
        marks = marks.materialize()
        stages.done("dedup", marks.count(), "duplicates")
        refs, _, sizes = materialised_blocks(marks)
        sources.append((refs, sizes, partial(_mark_rows, schema=posts.schema().base_schema)))
        del marks
    if not sum(len(blocks) for blocks, _, _ in sources):
        raise NoPosts(cfg, [])
    del posts  # from here the shuffle's map tasks hold the blocks, and free each once they have cut it
    # A hash shuffle by thread whose partitions stay whole blocks; the threads of a block are assembled in one
    # call (per-thread calls cost more than the assembly itself).
    results = hash_shuffle(sources, ["site", "thread"], _partitions(cfg), _threads_and_summary, {
        "pool_mode": cfg.negative_pool, "min_score": cfg.min_score, "english_threshold": cfg.english_threshold,
        "dev_fraction": cfg.dev_fraction, "test_fraction": cfg.test_fraction}, returns=3,
        task_bytes=cfg.partition_mb << 20)
    del sources
    threads, counts, attribution, thread_bytes = (list(refs) for refs in zip(*results))
    thread_bytes = ray.get(thread_bytes)
    stages.done("threads", count, "posts")
    return (threads, thread_bytes), counts, attribution


class NoPosts(ValueError):
    """Raised when the sources gave no post at all: names them, and the first fetch failure if any."""

    def __init__(self, cfg: BuildConfig, failures: list[dict]):
        sources = cfg.dumps + cfg.api_sites + cfg.urls[:3]
        hint = f"; {len(failures)} fetch failures, first: {failures[0]['url']}: {failures[0]['reason']}" \
            if failures else ""
        super().__init__(f"no posts found in {', '.join(sources)}{hint}")


def _mark_rows(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    """Duplicate marks shaped as post rows (post_type DUPLICATE_MARK, `failure` = the kept answer's id)."""
    n = batch.num_rows
    columns = {"site": batch["site"], "id": batch["id"], "thread": batch["thread"],
               "post_type": pa.array([DUPLICATE_MARK] * n, pa.int8()), "failure": batch["duplicate_of"]}
    return pa.table({f.name: columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type)
                     for f in schema}, schema=schema)


def _partitions(cfg: BuildConfig) -> int:
    """Shuffle partitions: about `partition_mb` of dump each (so a partition's size does not grow with the
    input), at least one per CPU, at most 4,000 (past that, partitions grow: Stack Overflow's 100 GB of XML
    gives 25 MB each)."""
    size = sum(os.path.getsize(p) for p in cfg.dumps) + 20_000 * (len(cfg.urls) + 1000 * len(cfg.api_sites))
    return max(_cpus(), min(4000, size // (cfg.partition_mb << 20) + 1))


def _cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1))


WORD_COUNT_ROWS = 2048


def word_counts(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """`len(text.split())` for every text (0 for a null): the non-empty pieces of Arrow's `utf8_split_whitespace`,
    which splits at every character of Python's whitespace and at no other (tested over all of Unicode's) but
    gives empty pieces at the ends and within some runs of mixed whitespace. `WORD_COUNT_ROWS` texts at a time, so
    that the pieces never hold more than a slice's words (over a whole block they held every word of it in the
    funnel's heap); a regular expression that counted the words in place took 2.7 times as long."""
    counts = [np.zeros(0, dtype=np.int64)]
    for start in range(0, len(texts), WORD_COUNT_ROWS):
        piece = texts.slice(start, WORD_COUNT_ROWS)
        for chunk in piece.chunks if isinstance(piece, pa.ChunkedArray) else [piece]:
            pieces = pc.utf8_split_whitespace(chunk)
            offsets = pieces.offsets.to_numpy()  # nulls have no pieces
            words = np.concatenate([[0], np.cumsum(pc.binary_length(pieces.values).to_numpy() > 0)])
            counts.append(words[offsets[1:]] - words[offsets[:-1]])
    return np.concatenate(counts)


def _count_threads(batch: pa.Table, pool_mode: str = "site") -> pa.Table:
    """Every count the funnel, the data card and the negative sampler (answers per pool group under `pool_mode`)
    need from one batch of thread rows, as one JSON row: the funnel is then one pass over the data with no
    shuffle (a groupby per figure costs seconds each). Counted with Arrow's group-bys, not row by row."""
    trim_when_idle()
    counts: dict[str, int] = {}

    def add_counts(prefix: str, table: pa.Table, keys: list[str]) -> None:
        if table.num_rows == 0:
            return
        grouped = table.group_by(keys, use_threads=False).aggregate([([], "count_all")])
        for *values, n in zip(*(grouped[k].to_pylist() for k in keys), grouped["count_all"].to_pylist()):
            key = "\x1f".join([prefix, *values])
            counts[key] = counts.get(key, 0) + n

    # Columns are filtered one at a time, never the whole batch: a filtered batch copies every text in it.
    add_counts("status", batch, ["site", "role", "status"])
    lang_by = batch["lang_by"]
    decided = pc.filter(lang_by, pc.not_equal(lang_by, "none"))
    add_counts("lang", pa.table({"by": pc.if_else(pc.equal(decided, ""), "no_text", decided)}), ["by"])
    overlaps = pc.ends_with(batch["status"], "overlaps_test_set")
    details, roles = pc.filter(batch["detail"], overlaps).to_pylist(), pc.filter(batch["role"], overlaps).to_pylist()
    for detail, role in zip(details, roles):
        for name in (detail or "").split(","):
            key = f"overlap\x1f{name}\x1f{role}"
            counts[key] = counts.get(key, 0) + 1
    status = batch["status"]
    kept = pc.is_in(status, pa.array([KEPT_QUESTION, POSITIVE]))
    licence = pc.fill_null(pc.filter(batch["licence"], kept), "")
    add_counts("licence", pa.table({"licence": pc.if_else(pc.equal(licence, ""), "unknown", licence)}), ["licence"])
    kept_question, positive = pc.equal(status, KEPT_QUESTION), pc.equal(status, POSITIVE)
    for role, rows, texts in (("question", kept_question, "question"), ("answer", positive, "answer")):
        bins = np.digitize(word_counts(pc.filter(batch[texts], rows)), LENGTH_BINS[1:])  # index into _LENGTH_LABELS
        add_counts("length", pa.table({"role": pa.array([role] * len(bins), pa.string()),
                                       "bin": pa.array(np.asarray(_LENGTH_LABELS)[bins], pa.string())}),
                   ["role", "bin"])
    add_counts("questions", pa.table({"split": pc.filter(batch["split"], kept_question)}), ["split"])
    attributed = pc.is_in(status, pa.array([KEPT_QUESTION, *NEGATIVE_POOL]))  # the rows of `attribution_rows`
    unnamed = pc.and_(pc.equal(pc.fill_null(batch["author"], ""), ""), pc.is_null(batch["author_id"]))
    add_counts("attribution", pa.table({"author": pc.if_else(pc.filter(unnamed, attributed), "without", "named")}),
               ["author"])
    in_pool = pc.is_in(status, pa.array(list(NEGATIVE_POOL)))
    pool = batch.select(["split", "site", "tags"] if pool_mode == "tag" else ["split", "site"]).filter(in_pool)
    add_counts("pool", pa.table({"group": pool_groups(pool, pool_mode)[0]}), ["group"])
    failed = pc.equal(status, "fetch_failed")
    failures = [{"url": url, "reason": reason} for url, reason in
                zip(pc.filter(batch["origin"], failed).to_pylist(), pc.filter(batch["detail"], failed).to_pylist())]
    return pa.table({"counts": [json.dumps(counts)], "failures": [json.dumps(failures)]})


def _length_label(words: int) -> str:
    for label, (lo, hi) in zip(_LENGTH_LABELS, zip(LENGTH_BINS, list(LENGTH_BINS[1:]) + [float("inf")])):
        if lo <= words < hi:
            return label
    return _LENGTH_LABELS[-1]


def _summarise_threads(block: pa.Table, pool_mode: str) -> tuple[pa.Table, pa.Table]:
    """A block of thread rows' counts (`_count_threads`) and attribution rows, from one read of the block."""
    attribution = attribution_rows(rows_with_status(block, statuses=[KEPT_QUESTION, *NEGATIVE_POOL], columns=[
        "role", "status", "qid", "aid", "site", "author", "author_id", "licence"]))
    return _count_threads(block, pool_mode), attribution


def funnel(counts: list[pa.Table]) -> dict:
    """Posts by role and status (every post once), per site, by language model, test-set overlap, licence,
    length and split, the fetch failures (`failures`: URL and reason), answers per negative-pool group
    (`pool_groups`), and the attribution rows with and without a named author, from `_count_threads`' rows."""
    totals: dict[str, int] = {}
    failures: list[dict] = []
    for row in (row for table in counts for row in table.to_pylist()):
        for key, n in json.loads(row["counts"]).items():
            totals[key] = totals.get(key, 0) + n
        failures += json.loads(row["failures"])
    by_status: dict[tuple[str, str], int] = {}
    per_site: dict[str, dict[str, int]] = {}
    lang, overlap, licences, questions_per_split, pool_groups, attribution = {}, {}, {}, {}, {}, {}
    lengths = {role: dict.fromkeys(_LENGTH_LABELS, 0) for role in ("question", "answer")}
    for key, n in sorted(totals.items()):
        kind, *parts = key.split("\x1f")
        if kind == "status":
            site, role, status = parts
            by_status[(role, status)] = by_status.get((role, status), 0) + n
            if role in ("question", "answer"):
                entry = per_site.setdefault(site, {"questions": 0, "questions_kept": 0, "answers": 0,
                                                   "positives": 0})
                entry[role + "s"] += n
                entry["questions_kept"] += n if (role, status) == ("question", KEPT_QUESTION) else 0
                entry["positives"] += n if (role, status) == ("answer", POSITIVE) else 0
        elif kind == "lang":
            lang[parts[0]] = n
        elif kind == "overlap":
            overlap.setdefault(parts[0], {"question": 0, "answer": 0})[parts[1]] += n
        elif kind == "licence":
            licences[parts[0]] = n
        elif kind == "length":
            lengths[parts[0]][parts[1]] = n
        elif kind == "questions":
            questions_per_split[parts[0]] = n
        elif kind == "pool":
            pool_groups[parts[0]] = n
        elif kind == "attribution":
            attribution[parts[0]] = n

    def section(role: str, kept: str | None) -> dict:
        total = sum(n for (r, _), n in by_status.items() if r == role)
        dropped = {s: n for (r, s), n in sorted(by_status.items()) if r == role and s != kept}
        return {"in": total, "dropped": dropped, "kept": by_status.get((role, kept), 0) if kept else 0}

    return {
        "posts_in": sum(n for (role, _), n in by_status.items() if role != "failure"),
        "fetch_failures": by_status.get(("failure", "fetch_failed"), 0),
        "questions": section("question", KEPT_QUESTION),
        "answers": section("answer", POSITIVE),
        "other_posts": section("other", None),
        "language_decided_by": lang,
        "test_set_overlap": overlap,
        "per_site": per_site,
        "lengths": lengths,
        "licences": licences,
        "questions_per_split": questions_per_split,
        "drop_reasons": DROP_REASONS,
        "failures": failures,
        "pool_groups": pool_groups,
        "attribution": {"posts": sum(attribution.values()), "without_author": attribution.get("without", 0)},
    }


def attribution_rows_of(counts: pa.Table) -> int:
    """The attribution rows of the block whose `_count_threads` row this is."""
    totals = json.loads(counts["counts"][0].as_py())
    return totals.get("attribution\x1fnamed", 0) + totals.get("attribution\x1fwithout", 0)


class _Stages:
    """Times each stage, logs it to stderr with its row rate, and keeps the timings for stats.json."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.last = time.time()

    def done(self, name: str, rows: int | None = None, unit: str = "rows") -> None:
        now = time.time()
        took = now - self.last
        self.seconds[name] = round(took, 2)
        rate = f" ({rows / took:,.0f} {unit}/s)" if rows and took > 0 else ""
        counted = f": {rows:,} {unit}" if rows is not None else ""
        print(f"[build] {name}{counted} in {took:.1f} s{rate}", file=sys.stderr, flush=True)
        self.last = now


# One row per post whose text can reach the shards (kept questions, and answers that are positives or
# negative candidates), with what CC BY-SA attribution needs: the post's link, its author and licence.
ATTRIBUTION = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # "<site>:<post id>", as `qid`/`aid` in the pairs
        pa.field("kind", pa.string(), nullable=False),  # question or answer
        pa.field("url", pa.string(), nullable=False),
        pa.field("author", pa.string(), nullable=False),  # display name; empty where the source gives none
        pa.field("author_id", pa.int64()),  # null: unknown, deleted user or community wiki; -1 "Community"
        pa.field("author_url", pa.string(), nullable=False),  # the profile page; empty without an author_id
        pa.field("licence", pa.string(), nullable=False),
    ]
)


def rows_with_status(batch: pa.Table, statuses: list[str], columns: list[str]) -> pa.Table:
    """`columns` of the thread rows whose status is one of `statuses`. One function rather than Ray Data's
    `select_columns` and `filter`: its optimiser runs a filter before a projection, and a filter copies every
    column it is given (the texts, where only ids were wanted)."""
    trim_when_idle()
    return batch.select(columns).filter(pc.is_in(batch["status"], pa.array(statuses, pa.string())))


def negative_candidates(batch: pa.Table) -> pa.Table:
    """Thread rows as the negative sampler's pool (answers with a status of NEGATIVE_POOL), the positives among
    them marked in `asks`: they ask for negatives and are candidates for other questions' alike."""
    pool = rows_with_status(batch, list(NEGATIVE_POOL), [*NEGATIVE_COLUMNS, "answer", "score", "status"])
    return pool.append_column("asks", pc.equal(pool["status"], POSITIVE)).drop_columns(["status"])


def attribution_rows(batch: pa.Table) -> pa.Table:
    """Thread rows (kept questions and pool answers) as ATTRIBUTION rows, column by column."""
    if batch.num_rows == 0:
        return ATTRIBUTION.empty_table()
    question = pc.equal(batch["role"], "question")
    post = pc.if_else(question, batch["qid"], batch["aid"])
    number = pc.struct_field(pc.extract_regex(post, r":(?P<number>[^:]*)$"), "number")
    url = pc.binary_join_element_wise("https://", batch["site"], "/", pc.if_else(question, "q", "a"), "/", number, "")
    author_id = batch["author_id"]
    profile = pc.binary_join_element_wise("https://", batch["site"], "/users/", pc.cast(author_id, pa.string()), "")
    return pa.table({
        "id": post, "kind": batch["role"], "url": url, "author": pc.fill_null(batch["author"], ""),
        "author_id": author_id, "author_url": pc.fill_null(profile, ""), "licence": pc.fill_null(batch["licence"], ""),
    }).cast(ATTRIBUTION)


def _bound_shuffle_memory(cfg: BuildConfig) -> None:
    """For Ray Data's shuffles (the dedup stage's; the build's own are `pipelines.shuffle`, sized by the same
    `partition_mb`). A shuffle's map side merges its input blocks up to `DataContext.shuffle_input_batch_bytes`
    (1 GiB by default) before partitioning them in one task, so a worker's heap grew with the input until 1 GiB
    (1.2 GB at 1M posts against 0.15 GB at 100k); `partition_mb` of input per map task keeps it the same at any
    size."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.shuffle_input_batch_bytes = cfg.partition_mb << 20
    # LZ4 for the shuffles' shards, not Ray's default zstd: a map task compresses one shard per partition, and at
    # 1M posts (33 partitions) the pairs shuffle's map tasks held 350 MB of heap at the peak with zstd against
    # 200 MB with LZ4 (bench/stackexchangeqa.py, one run each; the build took 141 s and 128 s). Shards live in
    # the object store for seconds: a lighter codec costs little there.
    if "RAY_DATA_SHUFFLE_COMPRESSION" not in os.environ:
        context.shuffle_compression = "lz4"


@dataclass
class Built:
    """What `build` makes, as object references (not waited for, but where said): the pairs' blocks (QA_PAIRS
    columns plus `split`, blocks of whole questions) with a summary of each (`_summarise_pairs_block`), the
    attribution rows' blocks, and the funnel (waited for)."""
    pairs: list
    pair_summaries: list
    attribution: list
    attribution_rows: list[int]
    stats: dict


def build_blocks(cfg: BuildConfig, stages: _Stages | None = None) -> Built:
    """The build as Ray tasks over object references: three hash shuffles (`pipelines.shuffle`), by thread, by
    negative-pool bucket and by question, each reducer returning its block and what the next steps need to know
    of it (funnel counts, shortfall, first question and counts), so no stage reads another's output twice."""
    import ray

    _bound_shuffle_memory(cfg)
    stages = stages or _Stages()
    threads, counts, attribution = thread_blocks(cfg, stages)
    counts = ray.get(counts)
    stats = funnel(counts)
    pool_sizes = stats.pop("pool_groups")
    stages.done("funnel")
    if stats["posts_in"] == 0:
        raise NoPosts(cfg, stats["failures"])
    # The sampler's pool: a thread row carries its question's text, which neither the pool nor the requests read.
    drawn = negative_blocks(threads, "asks", k=cfg.negatives, seed=cfg.seed, pool_sizes=pool_sizes,
                            mode=cfg.negative_pool, bucket_size=cfg.negative_bucket_size,
                            partitions=_partitions(cfg), question_text=False, select=negative_candidates,
                            task_bytes=cfg.partition_mb << 20)
    negatives = [block for block, _, _ in drawn]
    drawn_counts, negative_bytes = ray.get([summary for _, summary, _ in drawn]), ray.get([b for _, _, b in drawn])
    stats["negatives_short"] = sum(c["short"] for c in drawn_counts)
    stages.done("negatives", sum(c["rows"] for c in drawn_counts))
    stats["stage_seconds"] = stages.seconds
    # Positives and kept questions (which carry the question's text into the shuffle) are taken from the
    # threads inside the shuffle's map tasks, and drawn negatives (not their shortfall rows) from the sampler's
    # blocks. Shards in source order would hold every positive, then every negative: a training stream of one
    # label for thousands of steps. A hash shuffle by question brings each question's pairs together, in an
    # order drawn from the seed; the pairs cross it without their question's text, which they take there from
    # their question's row, the only one to carry it.
    kept = partial(rows_with_status, statuses=[POSITIVE, KEPT_QUESTION],
                   columns=["status", "qid", "question", "aid", "answer", "score", "accepted", "site", "split"])
    ordered = hash_shuffle([(*threads, composed(kept, _pairs)), (negatives, negative_bytes, _negative_pairs)],
                           ["qid"], _partitions(cfg), _pairs_in_seeded_order, {"seed": cfg.seed}, returns=2,
                           task_bytes=cfg.partition_mb << 20)
    pairs, summaries, _ = (list(refs) for refs in zip(*ordered))
    return Built(pairs=pairs, pair_summaries=summaries, attribution=attribution,
                 attribution_rows=[attribution_rows_of(c) for c in counts], stats=stats)


def build(cfg: BuildConfig):
    """The pairs dataset (QA_PAIRS columns plus `split`), the post funnel, and the attribution rows (a dataset)."""
    import ray.data

    built = build_blocks(cfg)
    return ray.data.from_arrow_refs(built.pairs), built.stats, ray.data.from_arrow_refs(built.attribution)


_PAIRS_WITH_SPLIT = pa.schema(list(QA_PAIRS) + [pa.field("split", pa.string())])
_LENGTH_LABELS = list(length_histogram([]).keys())


QUESTION_ROW = -1  # the label of the rows that bring each question's text into the pairs shuffle


def questions_in_seeded_order(batch: pa.Table, seed: int) -> pa.Table:
    """A block of whole questions' pairs, split by split (so that a split's rows are one zero-copy slice when the
    shards are written), within a split questions in an order drawn from (seed, qid), each question's positives
    first, then its negatives, each by answer id: the same rows in the same order on every run. Pairs come without
    their question's text and take it from their question's row (label QUESTION_ROW), which is then left out."""
    trim_when_idle(now=True)
    if batch.num_rows == 0:
        return batch
    is_question = pc.equal(batch["label"], QUESTION_ROW)
    question_ids, question_texts = pc.filter(batch["qid"], is_question), pc.filter(batch["question"], is_question)
    rows = np.flatnonzero(~is_question.to_numpy(zero_copy_only=False))
    keys = batch.select(["split", "qid", "label", "aid"]).take(pa.array(rows, pa.int64()))
    questions = pc.unique(keys["qid"])  # a question has many pairs: hash each once
    units = pa.array([stable_unit(seed, qid) for qid in questions.to_pylist()], pa.float64())
    keys = keys.append_column("key", pc.take(units, pc.index_in(keys["qid"], value_set=questions)))
    order = pc.sort_indices(keys, sort_keys=[("split", "ascending"), ("key", "ascending"), ("qid", "ascending"),
                                             ("label", "descending"), ("aid", "ascending")])
    pairs = batch.take(pa.array(rows[order.to_numpy()], pa.int64()))
    source = pc.index_in(pairs["qid"], value_set=question_ids)
    if source.null_count:
        missing = pc.filter(pairs["qid"], pc.is_null(source))[0].as_py()
        raise ValueError(f"pairs of question {missing} arrived without their question's row")
    return pairs.set_column(pairs.schema.get_field_index("question"), "question", pc.take(question_texts, source))


def _pairs_in_seeded_order(block: pa.Table, seed: int) -> tuple[pa.Table, dict]:
    """`questions_in_seeded_order`'s block, and its summary for the shard writer."""
    ordered = questions_in_seeded_order(block, seed)
    return ordered, _summarise_pairs_block(ordered)


def _negative_pairs(batch: pa.Table) -> pa.Table:
    """The sampler's drawn negatives as rows of pairs (its shortfall rows, which have no answer, left out)."""
    return _pairs(batch.filter(pc.not_equal(batch["aid"], "")))


def _pairs(batch: pa.Table) -> pa.Table:
    """Thread rows (positives: label 1; kept questions: QUESTION_ROW, the only rows with the question's text) or
    drawn negatives (no `status`: label 0) as rows of pairs."""
    n = batch.num_rows
    if "status" in batch.column_names:
        label = pc.if_else(pc.equal(batch["status"], KEPT_QUESTION), pa.scalar(QUESTION_ROW, pa.int8()),
                           pa.scalar(1, pa.int8()))
        accepted = batch["accepted"]
    else:
        label, accepted = pa.array(np.zeros(n, np.int8)), pa.array(np.zeros(n, bool))
    return pa.table({"qid": batch["qid"], "question": batch["question"], "aid": batch["aid"],
                     "answer": batch["answer"], "label": label, "score": batch["score"], "accepted": accepted,
                     "site": batch["site"], "split": batch["split"]}).cast(_PAIRS_WITH_SPLIT)


def split_pairs(batch: pa.Table, split: str) -> pa.Table:
    """One split's rows of a block of pairs (QA_PAIRS columns, checked; the split is the folder), as a slice of the
    block: `questions_in_seeded_order` put each split's rows together, so nothing is copied (a filter copied
    every row of the split into the write task's heap: 270 MB a task at 1M posts)."""
    splits = batch["split"]
    start = pc.index(splits, split).as_py()
    if start < 0:
        return QA_PAIRS.empty_table()
    rows = int(pc.sum(pc.equal(splits, split)).as_py())
    piece = batch.slice(start, rows)
    if pc.count_distinct(piece["split"]).as_py() != 1:
        raise ValueError(f"the {split} rows of a block of pairs are not contiguous (sort them by split first)")
    return conform(piece.drop_columns(["split"]), QA_PAIRS, "StackExchangeQA pairs")


def _summarise_pairs_block(block: pa.Table) -> dict:
    """A block's first question id (its place in the shards) and its rows per (split, label)."""
    if block.num_rows == 0:
        return {"first": None, "counts": []}
    counts = block.group_by(["split", "label"], use_threads=False).aggregate([([], "count_all")])
    return {"first": block["qid"][0].as_py(),
            "counts": list(zip(counts["split"].to_pylist(), counts["label"].to_pylist(), counts["count_all"].to_pylist()))}


def _write_pair_shard(path: str, split: str, *blocks: pa.Table) -> int:
    """One shard: `split`'s rows of `blocks` (slices of the object store's blocks, so nothing is copied but a row
    group at a time), to `path` through a temporary name; returns the rows written."""
    trim_when_idle(now=True)  # a worker that ran a reducer just before holds what it freed
    rows = write_parquet_atomically(path, QA_PAIRS, (split_pairs(block, split) for block in blocks))
    release_unused_memory()
    return rows


def write_pair_shards(pairs: list, summaries: list[dict], directory: str, rows_per_shard: int,
                      questions_per_split: dict) -> dict:
    """`directory/{train,dev,test}/part-NNNNN.parquet` from the pairs' blocks (references to blocks of whole
    questions, each split's rows together) and their summaries (`_summarise_pairs_block`), and the rows,
    positives, negatives, questions and shards of each split.

    Blocks are taken in the order of their first question id, so the same build writes the same rows to the same
    shard names; a shard gathers consecutive blocks until it holds at least `rows_per_shard` rows of its split (the
    last of a split may hold fewer). The shards are written by tasks that read the blocks in place in the object
    store and stream them out a row group at a time: Ray Data's writer concatenated each shard's rows in a
    worker's heap (the build's peak at 1M posts)."""
    import ray

    blocks = sorted((s["first"], ref, s["counts"]) for s, ref in zip(summaries, pairs) if s["first"] is not None)
    totals: dict[tuple[str, int], int] = {}
    for _, _, counts in blocks:
        for split, label, n in counts:
            totals[(split, label)] = totals.get((split, label), 0) + n
    write = ray.remote(num_cpus=1)(_write_pair_shard)
    pending, result = [], {}
    for split in SPLITS:
        target = os.path.join(directory, split)
        os.makedirs(target, exist_ok=True)
        here = [sum(n for s, _, n in counts if s == split) for _, _, counts in blocks]
        groups = consecutive_groups(here, rows_per_shard)
        for number, group in enumerate(groups):
            path = os.path.join(target, f"part-{number:05d}.parquet")
            shard = write.remote(path, split, *(blocks[i][1] for i in group))
            pending.append((split, sum(here[i] for i in group), shard))
        positive, negative = totals.get((split, 1), 0), totals.get((split, 0), 0)
        result[split] = {"questions": questions_per_split.get(split, 0), "rows": positive + negative,
                         "positive": positive, "negative": negative, "shards": len(groups)}
    for split, planned, ref in pending:
        written = ray.get(ref)
        if written != planned:
            raise RuntimeError(f"a {split} shard of StackExchangeQA pairs holds {written:,} rows, {planned:,} planned")
    return result


def write(cfg: BuildConfig) -> dict:
    """Build and write `output/{train,dev,test}/*.parquet` and `output/stats.json`, atomically.

    Everything is written to a staging folder that replaces `output` only once complete: a crash leaves the
    previous output (or none) and no half-written shards. The build is deterministic, so a re-run after a
    crash writes the same rows.
    """
    import ray
    import ray.data

    started = time.time()
    with staged_dir(cfg.output, JOB, cfg.input_paths(), earlier_build) as staging:
        built = build_blocks(cfg)
        stats = built.stats
        stages = _Stages()
        summaries = ray.get(built.pair_summaries)
        stages.done("pairs", sum(n for s in summaries for _, _, n in s["counts"]))
        splits = write_pair_shards(built.pairs, summaries, staging, cfg.rows_per_shard,
                                   stats.pop("questions_per_split"))
        write_blocks(built.attribution, built.attribution_rows, os.path.join(staging, "attribution"), ATTRIBUTION,
                     cfg.rows_per_shard)
        stages.done("shards")
        positive = sum(s["positive"] for s in splits.values())
        negative = sum(s["negative"] for s in splits.values())
        stats["pairs"] = {"positive": positive, "negative": negative, "total": positive + negative,
                          "negatives_per_positive": round(negative / positive, 2) if positive else 0.0,
                          "negatives_short": stats.pop("negatives_short")}
        stats["splits"] = splits
        stats["paper"] = PAPER
        stats["config"] = asdict(cfg)
        stats["config"]["api_key"] = "***" if cfg.api_key else None  # never written to disk
        stats["config"]["urls"] = len(cfg.urls)
        stats["seconds"] = round(time.time() - started, 1)
        failures = stats.pop("failures")
        reasons: dict[str, int] = {}
        for failure in failures:
            key = re.sub(r"https?://\S+", "URL", failure["reason"])[:80]
            reasons[key] = reasons.get(key, 0) + 1
        stats["fetch_failure_reasons"] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
        with open(os.path.join(staging, "failures.jsonl"), "w") as f:
            for failure in failures:
                f.write(json.dumps(failure) + "\n")
        write_card(stats, staging)
        stages.done("card")
        stats["stage_seconds"].update(stages.seconds)
        with open(os.path.join(staging, "stats.json"), "w") as f:
            json.dump(stats, f, indent=2, sort_keys=True)
    return stats

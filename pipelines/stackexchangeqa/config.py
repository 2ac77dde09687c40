"""The build's configuration, checked whole before any work, and the names its outputs use: the post
statuses (kept, or the reason for dropping) and the paper's figures."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from crawl.sites import check_site_names
from pipelines.atomic import recognised_by
from pipelines.dedup import DEDUP_MODES
from pipelines.negatives import POOL_MODES
from runtime.checks import UsageError, at_least, integer_at_least, one_of, whole, within

JOB = "build_stackexchangeqa"  # the name its outputs carry (pipelines.atomic)


SPLITS = ("train", "dev", "test")


PAPER = {
    "positive_pairs": 628_706,
    "negative_pairs": 9_874_758,
    "negatives_per_positive": round(9_874_758 / 628_706, 2),
}


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
    # Hard negatives (pipelines/hard_negatives.py): None samples at random; otherwise the miner, "minilm",
    # "mpnet-base", a sentence encoder folder, or a run or checkpoint folder of jobs/train.py (which re-ranks
    # what `mine_retriever` finds).
    hard_negatives: str | None = None
    mine_retriever: str = "minilm"
    mine_candidates: int = 64  # the retriever's shortlist per question that a checkpoint re-ranks
    mine_max_similarity: float = 0.95  # the false-negative guard: cosine with a positive at which a candidate is passed
    mine_batch_size: int = 64
    mine_max_len: int = 256  # word pieces per text for the retriever (sentence-transformers' setting)
    mine_gpus: float = 0.0  # GPUs per mining task
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
            raise UsageError(
                f"--dev-fraction {self.dev_fraction} and --test-fraction {self.test_fraction} leave no "
                "questions to train on (their sum must be below 1)"
            )
        within("--fasttext-threshold", self.fasttext_threshold, 0, 1)
        integer_at_least("--language-chars", self.language_chars, 1, allow_none=True)
        within("--english-threshold", self.english_threshold, 0, 1)
        integer_at_least("--rows-per-shard", self.rows_per_shard, 1)
        integer_at_least("--read-range-mb", self.read_range_mb, 1)
        integer_at_least("--partition-mb", self.partition_mb, 1)
        integer_at_least("--api-max-pages", self.api_max_pages, 1, allow_none=True)
        for option, rate in (
            ("--requests-per-second", self.requests_per_second),
            ("--api-requests-per-second", self.api_requests_per_second),
        ):
            at_least(option, rate, 0)
            if rate == 0:
                raise UsageError(f"{option} must be above 0 (a crawler that may send nothing never ends)")
        integer_at_least("--mine-candidates", self.mine_candidates, 1)
        within("--mine-max-similarity", self.mine_max_similarity, -1, 1)
        integer_at_least("--mine-batch-size", self.mine_batch_size, 1)
        integer_at_least("--mine-max-len", self.mine_max_len, 2)
        at_least("--mine-gpus", self.mine_gpus, 0)
        if self.hard_negatives is not None and not self.hard_negatives.strip():
            raise UsageError("--hard-negatives: empty; name a miner ('minilm', an encoder or checkpoint folder)")
        integer_at_least("--crawlers", self.crawlers, 1)
        integer_at_least("--max-retries", self.max_retries, 0)
        if self.sites and len(self.sites) != len(self.dumps):
            raise UsageError(f"{len(self.sites)} site names for {len(self.dumps)} dumps")
        check_site_names("--sites", self.api_sites)
        check_site_names("--dump SITE=PATH", [site for site in self.sites if site])

    def input_paths(self) -> list[str]:
        """What the build reads and keeps, which its output must never hold: dumps, test sets to exclude, the
        crawl cache, and a miner's folders."""
        mining = (self.hard_negatives, self.mine_retriever) if self.hard_negatives else ()
        miners = [m for m in mining if m and os.path.exists(m)]
        return [
            *self.dumps,
            *self.exclude_test_sets.values(),
            *([self.cache_dir] if self.cache_dir else []),
            *miners,
        ]


# A build written before outputs carried a completion marker: its stats.json, with the funnel's splits and pairs.
earlier_build = recognised_by("stats.json", "splits", "pairs")

"""The build's funnel counts (pipelines/stackexchangeqa/funnel.py) against a row-by-row reference."""

import json
import random

import pyarrow as pa

from crawl.dump import iter_post_tables
from pipelines.datacard import LENGTH_BINS
from pipelines.stackexchangeqa.config import KEPT_QUESTION, NEGATIVE_POOL, POSITIVE
from pipelines.stackexchangeqa.funnel import LENGTH_LABELS, count_threads, word_counts
from pipelines.stackexchangeqa.posts import PostAnalysis
from pipelines.stackexchangeqa.threads import THREAD_ROWS, assemble_threads


def _length_label(words: int) -> str:
    for label, (lo, hi) in zip(LENGTH_LABELS, zip(LENGTH_BINS, list(LENGTH_BINS[1:]) + [float("inf")])):
        if lo <= words < hi:
            return label
    return LENGTH_LABELS[-1]


def _counts_row_by_row(batch: pa.Table, pool_mode: str = "site") -> dict:
    """The funnel's counts as the build first made them, one row at a time: the reference for `count_threads`."""
    counts: dict[str, int] = {}

    def add(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    for r in batch.to_pylist():
        add(f"status\x1f{r['site']}\x1f{r['role']}\x1f{r['status']}")
        if r["lang_by"] != "none":
            add(f"lang\x1f{r['lang_by'] or 'no_text'}")
        if r["status"].endswith("overlaps_test_set"):
            for name in (r["detail"] or "").split(","):
                add(f"overlap\x1f{name}\x1f{r['role']}")
        if r["status"] in (KEPT_QUESTION, POSITIVE):
            add(f"licence\x1f{r['licence'] or 'unknown'}")
            text = r["question"] if r["role"] == "question" else r["answer"]
            add(f"length\x1f{r['role']}\x1f{_length_label(len(text.split()))}")
        if r["status"] == KEPT_QUESTION:
            add(f"questions\x1f{r['split']}")
        if r["status"] == KEPT_QUESTION or r["status"] in NEGATIVE_POOL:  # the posts that get attribution rows
            add(f"attribution\x1f{'without' if not r['author'] and r['author_id'] is None else 'named'}")
        if r["status"] in NEGATIVE_POOL:  # the negative sampler's groups: split and site, split, split/site/tag
            for group in {
                "site": [f"{r['split']}|{r['site']}"],
                "any": [r["split"]],
                "tag": [f"{r['split']}|{r['site']}|{tag}" for tag in r["tags"] or []],
            }[pool_mode]:
                add(f"pool\x1f{group}")
    return counts


def test_funnel_counts_are_the_row_by_row_counts(beer_dump):
    """The vectorised counts of a batch of thread rows, on the real beer dump's threads (and a few rows made to
    take every branch: overlaps, no text, unknown licence, odd whitespace), equal the row-by-row reference."""

    analysis = PostAnalysis()
    posts = pa.concat_tables([analysis(t) for t in iter_post_tables(beer_dump)])
    threads = assemble_threads(posts, min_score=2, english_threshold=0.5, dev_fraction=0.1, test_fraction=0.1)
    extra = [
        dict(
            threads.slice(0, 1).to_pylist()[0],
            status=status,
            role=role,
            detail=detail,
            licence=licence,
            lang_by=lang_by,
            question=text,
            answer=text,
        )
        for status, role, detail, licence, lang_by, text in [
            ("question_overlaps_test_set", "question", "wikiqa,trecqa", "x", "fasttext", "q"),
            ("answer_overlaps_test_set", "answer", "wikiqa", "x", "", ""),
            ("positive", "answer", "", "", "langdetect", " \x1c odd\u2028 white\xa0space "),
            ("question", "question", "", "", "none", ""),
        ]
    ]
    extra[2].update(author="", author_id=None)  # a deleted user's post: no attribution but its link
    extra[3].update(author="a name, no id", author_id=None)
    batch = pa.concat_tables([threads, pa.Table.from_pylist(extra, schema=THREAD_ROWS)])
    counts = json.loads(count_threads(batch)["counts"][0].as_py())
    assert counts == _counts_row_by_row(batch) and counts["attribution\x1fwithout"] >= 1
    for mode in ("any", "tag"):
        assert json.loads(count_threads(batch, mode)["counts"][0].as_py()) == _counts_row_by_row(batch, mode), mode


def test_word_counts_are_pythons_split_over_every_unicode_whitespace():
    import sys

    whitespace = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF and chr(c).isspace()]
    alphabet = whitespace + list("ab é漢") + ["\u200b", "\ufeff"]  # zero-width space and BOM: not whitespace
    rng = random.Random(0)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(20_000)]
    assert word_counts(pa.array(texts + [None])).tolist() == [len(t.split()) for t in texts] + [0]
    chunked = pa.chunked_array([texts[:7], texts[7:20]])
    assert word_counts(chunked).tolist() == [len(t.split()) for t in texts[:20]]
    assert word_counts(pa.array(texts).slice(5, 3000)).tolist() == [len(t.split()) for t in texts[5:3005]]
    # Every other character of Unicode is part of a word.
    others = [f"a{chr(c)}b" for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF and not chr(c).isspace()]
    assert set(word_counts(pa.array(others)).tolist()) == {1}

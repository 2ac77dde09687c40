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


def test_vocabulary_ids_are_stable_with_caps_and_reserved_ids(tmp_path):
    from pipelines.vocabulary import RESERVED, Vocabulary, char_counts

    counts = {"b": 3, "a": 3, "c": 5, "rare": 1, "<unk>": 9}
    vocab = Vocabulary.from_counts(counts, min_count=2)
    assert vocab.tokens == list(RESERVED) + ["c", "a", "b"]  # by count, ties by token; reserved never twice
    assert Vocabulary.from_counts(dict(reversed(list(counts.items()))), min_count=2).tokens == vocab.tokens
    assert Vocabulary.from_counts(counts, max_size=5).tokens == list(RESERVED) + ["c"]
    assert vocab.ids(["a", "zzz"]) == [5, 1]
    chars = Vocabulary.from_counts(char_counts({"ab": 2, "b": 1})).tokens
    assert chars == list(RESERVED) + ["b", "a"]  # b: 2 + 1, a: 2
    full = Vocabulary(vocab.tokens, chars)
    assert full.char_ids(["abc", "b"], max_word_chars=2) == [[5, 4], [4]]
    full.save(str(tmp_path / "vocab.json"))
    again = Vocabulary.load(str(tmp_path / "vocab.json"))
    assert again.tokens == full.tokens and again.chars == full.chars

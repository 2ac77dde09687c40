"""Duplicate answers (exact and near, MinHash LSH) and test-set overlap, on hand-made and real texts."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from pipelines.dedup import BandKeys, MinHasher, find_duplicates, shingles, similarity
from pipelines.overlap import OverlapFilter, reference_index

BASE = (
    "Dry hopping adds aroma without bitterness because the hop oils dissolve in beer while the alpha acids "
    "need boiling to isomerise, so add the hops after primary fermentation for three to five days"
)


def _answers(texts_scores):
    return pa.table(
        {
            "site": ["s"] * len(texts_scores),
            "id": list(range(1, len(texts_scores) + 1)),
            "thread": [100 + i for i in range(len(texts_scores))],
            "score": [s for _, s in texts_scores],
            "text": [t for t, _ in texts_scores],
        }
    )


def _duplicates(texts_scores, mode="near"):
    keys = BandKeys(mode=mode)(_answers(texts_scores))
    found = {}
    for key in set(keys.column("key").to_pylist()):
        group = keys.filter(pa.compute.equal(keys["key"], key))
        for row in find_duplicates(group).to_pylist():
            found[row["id"]] = row["duplicate_of"]
    return found


def test_minhash_estimates_jaccard():
    hasher = MinHasher(256)
    a, b = shingles(BASE), shingles(BASE.replace("three to five", "four"))
    exact = len(set(a.tolist()) & set(b.tolist())) / len(set(a.tolist()) | set(b.tolist()))
    estimate = similarity(hasher.signature(a).tobytes(), hasher.signature(b).tobytes())
    assert abs(estimate - exact) < 0.1


def test_exact_and_near_duplicates_keep_the_best_scored_copy():
    near = BASE.replace("for three to five days", "for three to five days.")  # punctuation only
    lightly_edited = BASE + " and then cold crash"
    other = "Lagers ferment cold with bottom-fermenting yeast and need weeks of conditioning near freezing"
    found = _duplicates([(BASE, 3), ("  " + BASE.upper() + " ", 9), (near, 1), (lightly_edited, 2), (other, 5)])
    # the upper-cased copy has the best score, so it is kept and the others point at it
    assert found == {1: "s:2", 3: "s:2", 4: "s:2"}
    assert 5 not in found
    assert _duplicates([(BASE, 3), (BASE.upper(), 9), (lightly_edited, 2)], mode="exact") == {1: "s:2"}


def test_distinct_short_answers_are_not_duplicates():
    assert _duplicates([("Use Saaz hops.", 2), ("Use Cascade hops.", 2), ("Try a Belgian yeast.", 2)]) == {}


@pytest.fixture(scope="module")
def wikiqa_index(shared_data):
    path = os.path.join(shared_data, "wikiqa")
    if not os.path.exists(os.path.join(path, "WikiQA-test.tsv.gz")):
        pytest.skip(f"{path}/WikiQA-test.tsv.gz not found")
    return reference_index({"wikiqa": path, "trecqa": os.path.join(shared_data, "trecqa", "jacana_xml")})


def test_overlap_with_real_test_sets(wikiqa_index):
    assert wikiqa_index["wikiqa"]["count"] == 633 + 6165  # raw test questions and sentences
    stage = OverlapFilter([wikiqa_index])
    batch = pa.table(
        {
            "text": [
                # a WikiQA test question
                "How African Americans were immigrated to the US?\nI read about it somewhere.",
                "Quote: African immigration to the United States refers to immigrants to the United States who are or "
                "were nationals of Africa.",  # a WikiQA test sentence inside an answer
                "What do practitioners of Wicca worship?",  # a TrecQA test question
                "How are glacier caves formed?",  # WikiQA *train*: not a test overlap
                "African immigration is a topic.",
                "",
            ]
        }
    )
    assert stage(batch).column("overlap").to_pylist() == ["wikiqa", "wikiqa", "trecqa", "", "", ""]


def test_unknown_test_set_name_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown test set 'squad'"):
        reference_index({"squad": str(tmp_path)})


def test_insuranceqa_test_pools_read_through_the_vocabulary(shared_data, tmp_path):
    """InsuranceQA's test1/test2 pools and answers file are not in ../shared/data; the test pools have the
    dev pool's published layout (`labels<TAB>question ids<TAB>pool`), so the real dev pool stands in for
    test1 under its name, and two answer lines are written by hand in the published answers layout."""
    import gzip

    from pipelines.overlap import insuranceqa_texts

    source = os.path.join(shared_data, "insuranceqa_v1_incomplete")
    if not os.path.isdir(source):
        pytest.skip(f"{source} not found")
    folder = tmp_path / "insuranceqa"
    folder.mkdir()
    os.symlink(os.path.join(source, "vocabulary.gz"), folder / "vocabulary.gz")
    os.symlink(
        os.path.join(source, "question.dev.label.token_idx.pool.gz"), folder / "question.test1.label.token_idx.pool.gz"
    )
    with pytest.raises(FileNotFoundError, match="no InsuranceQA test file"):
        list(insuranceqa_texts(str(source)))  # train and dev only: no test set to exclude
    with gzip.open(os.path.join(source, "vocabulary.gz"), "rt", encoding="utf-8") as f:
        vocab = dict(line.rstrip("\n").split("\t", 1) for line in f)
    with gzip.open(os.path.join(source, "question.dev.label.token_idx.pool.gz"), "rt", encoding="utf-8") as f:
        first = f.readline().split("\t")[1]
    texts = list(insuranceqa_texts(str(folder)))
    assert len(texts) == 1000  # PROVENANCE: 1,000 pooled questions
    assert texts[0] == " ".join(vocab[i] for i in first.split())
    (folder / "answers.label.token_idx").write_text("1\tidx_1 idx_2\n2\tidx_3\n")
    texts = list(insuranceqa_texts(str(folder)))
    assert len(texts) == 1002 and texts[-1] == vocab["idx_3"]

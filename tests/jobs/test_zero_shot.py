"""jobs/zero_shot.py end to end on real shards with the shipped MiniLM: each candidate scored by the cosine of the
encoder's sentence vectors, the figures of that ranking, the per-question file, and a line saying what ranked."""

import json

import pytest
import torch

from tests.conftest import make_tokenised

QUESTIONS = [
    "Which hops give a stout its bitterness?",
    "How long should a lager ferment before bottling?",
    "Why does my homebrew taste sour?",
]
ANSWERS = [
    "Fuggles and East Kent Goldings are the classic bittering hops for a dry Irish stout.",
    "Give the lager two to three weeks of cold fermentation, then a few more weeks of lagering before you bottle.",
    "A sour taste usually means a bacterial infection: sanitise every piece of equipment that touches the wort.",
]
UNRELATED = ["The train to the airport leaves every twenty minutes.", "Prime numbers have exactly two divisors."]


def _texts(q: int, a: int) -> tuple[str, str]:
    # candidate 0 is the question's own answer; the others another question's answer and unrelated sentences
    return QUESTIONS[q], [ANSWERS[q], ANSWERS[(q + 1) % 3], *UNRELATED][a]


def test_zero_shot_ranks_by_the_cosine_of_the_encoders_sentence_vectors(tmp_path, capsys):
    from jobs import zero_shot
    from qa_models.encoders import SentenceEmbedder, resolve_encoder

    data = make_tokenised(tmp_path / "tokenised", questions=3, candidates=4, texts=_texts)
    output = tmp_path / "zero_shot.jsonl"
    assert zero_shot.main(["--data", data, "--split", "test", "--output", str(output)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["rows"] == 12 and summary["metrics"]["questions"] == 3
    assert summary["metrics"]["map"] == 1.0  # each question's own answer first, above a neighbour's and noise
    assert "minilm zero-shot (cosine), test: MAP 1.0000" in err  # says what ranked the split, not only its figures

    embedder = SentenceEmbedder(resolve_encoder("minilm"), 256).eval()
    with torch.no_grad():
        questions, answers = embedder(QUESTIONS), embedder(ANSWERS + UNRELATED)
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["qid"] for r in records] == ["test-q0", "test-q1", "test-q2"]
    for q, record in enumerate(records):
        candidates = {c["aid"]: c["score"] for c in record["ranking"]}
        for a in range(4):
            text = _texts(q, a)[1]
            expected = float(questions[q] @ answers[(ANSWERS + UNRELATED).index(text)])
            assert candidates[f"test-q{q}-a{a}"] == pytest.approx(expected, abs=1e-5)

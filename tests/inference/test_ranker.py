"""inference.Ranker on real WikiQA: a checkpoint written by jobs/train.py's loop ranks a test question's answers
from their text with the scores jobs/evaluate.py gives the same pairs; what it cannot rank is refused in a line."""

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest

from runtime.checks import MissingInput, UsageError

pytestmark = pytest.mark.slow  # WikiQA tokenised and a model trained under Ray Train: a minute and a half


@pytest.fixture(scope="module")
def wikiqa(shared_data, ray_local, tmp_path_factory) -> str:
    from pipelines.tokenize import TokenizeConfig, write

    source = os.path.join(shared_data, "wikiqa")
    if not os.path.exists(os.path.join(source, "WikiQA-train.tsv.gz")):
        pytest.skip(f"{source}: WikiQA not found")
    out = str(tmp_path_factory.mktemp("wikiqa") / "tokenised")
    write(TokenizeConfig(dataset="wikiqa", input=source, output=out))
    return out


@pytest.fixture(scope="module")
def trained(wikiqa, ray_local, tmp_path_factory) -> dict:
    from training.config import TrainConfig
    from training.trainer import run

    storage = tmp_path_factory.mktemp("runs")
    cfg = TrainConfig(
        model="gsamn", data=wikiqa, storage_path=str(storage), name="gsamn", max_steps=6, dim=16, batch_size=16, seed=0
    )
    return dict(run(cfg), run=str(storage / "gsamn"))


def _test_question(wikiqa: str, records: list[dict]) -> tuple[dict, str, dict]:
    """A test question with a positive and at least three candidates: its evaluation record, its text and the
    text of each of its answers by aid."""
    from pipelines.shards import shard_paths

    table = pq.read_table(shard_paths(wikiqa, "test")[0], columns=["qid", "aid", "question", "answer"]).to_pylist()
    record = next(r for r in records if len(r["ranking"]) >= 3 and r["positives"])
    rows = [row for row in table if row["qid"] == record["qid"]]
    return record, rows[0]["question"], {row["aid"]: row["answer"] for row in rows}


def test_ranker_ranks_a_wikiqa_question_as_evaluate_scores_it(wikiqa, trained):
    from inference import Ranker
    from training.evaluation import EvaluateConfig, evaluate_checkpoint

    checkpoint = trained["best"]["checkpoint"]
    assert os.path.exists(os.path.join(checkpoint, "vocab.json"))  # the vocabulary travels with the weights
    _, records = evaluate_checkpoint(EvaluateConfig(checkpoint=checkpoint, data=wikiqa, split="test"))
    record, question, answers = _test_question(wikiqa, records)
    aids = list(answers)

    ranker = Ranker.from_checkpoint(trained["run"], device="cpu")  # the run folder: its best checkpoint
    assert ranker.checkpoint == checkpoint
    best = trained["best"]
    assert ranker.chosen == f"the run's best checkpoint by dev MAP {best['value']:.4f} (step {best['step']})"
    ranking = ranker.rank(question, [answers[aid] for aid in aids])
    expected = {entry["aid"]: entry["score"] for entry in record["ranking"]}
    assert sorted(i for i, _ in ranking) == list(range(len(aids)))
    assert [score for _, score in ranking] == sorted((score for _, score in ranking), reverse=True)
    for index, score in ranking:
        assert score == pytest.approx(expected[aids[index]], abs=1e-5), aids[index]
    # score() keeps the order given, one score per pair, whatever the batch
    pairs = [(question, answers[aid]) for aid in aids]
    one_by_one = [ranker.score([pair], batch_size=1)[0] for pair in pairs]
    assert ranker.score(pairs, batch_size=2) == pytest.approx(one_by_one, abs=1e-5)
    assert ranker.score([]) == [] and ranker.rank(question, []) == []


def test_a_checkpoint_from_before_the_vocabulary_travelled_reads_its_data_folders(wikiqa, trained, tmp_path):
    from inference import Ranker
    from training.checkpoints import write_checksums

    old = tmp_path / "old"
    shutil.copytree(trained["checkpoint"], old)
    os.remove(old / "vocab.json")
    write_checksums(str(old))
    question, answer = "what is a glacier cave?", "a glacier cave is a cave formed within the ice of a glacier"
    assert Ranker.from_checkpoint(str(old), device="cpu").score([(question, answer)]) == pytest.approx(
        Ranker.from_checkpoint(trained["checkpoint"], device="cpu").score([(question, answer)]), abs=1e-6
    )
    saved = json.loads((old / "config.json").read_text())
    saved["vocab_sha256"] = "0" * 64  # its data folder now holds another vocabulary
    (old / "config.json").write_text(json.dumps(saved))
    write_checksums(str(old))
    with pytest.raises(MissingInput, match="another vocabulary"):
        Ranker.from_checkpoint(str(old), device="cpu")


def test_what_the_ranker_cannot_read_is_refused_in_a_line(trained, tmp_path):
    from inference import Ranker

    with pytest.raises(MissingInput, match="no such checkpoint"):
        Ranker.from_checkpoint(str(tmp_path / "missing"))
    with pytest.raises(MissingInput, match="neither a checkpoint"):
        Ranker.from_checkpoint(str(tmp_path))
    ranker = Ranker.from_checkpoint(trained["checkpoint"], device="cpu")
    with pytest.raises(UsageError, match=r"pairs\[1\]"):
        ranker.score([("q", "a"), ("only a question",)])


def _halves(wikiqa: str, folder) -> list[str]:
    """The tokenised test split as two Parquet files (the job's input: a folder of them)."""
    from pipelines.shards import shard_paths

    table = pq.read_table(shard_paths(wikiqa, "test")[0])
    folder.mkdir()
    half = table.num_rows // 2
    paths = [str(folder / "a.parquet"), str(folder / "b.parquet")]
    pq.write_table(table.slice(0, half), paths[0])
    pq.write_table(table.slice(half), paths[1])
    return paths


def test_the_score_job_scores_as_evaluate_and_resumes_where_it_stopped(wikiqa, trained, tmp_path, ray_local):
    import pyarrow as pa

    from inference.scoring import JOB, ScoreConfig, plan_of, prepared_staging, score
    from pipelines.atomic import output_job
    from training.evaluation import EvaluateConfig, evaluate_checkpoint

    inputs = _halves(wikiqa, tmp_path / "in")
    checkpoint = trained["best"]["checkpoint"]
    cfg = ScoreConfig(checkpoint=trained["run"], input=str(tmp_path / "in"), output=str(tmp_path / "out"), actors=1)
    summary = score(cfg, log=lambda line: None)
    out = tmp_path / "out"
    assert output_job(str(out)) == JOB and summary["rows"] == summary["rows_scored_now"]
    best = trained["best"]
    assert summary["checkpoint"] == checkpoint and summary["chosen"] == (
        f"the run's best checkpoint by dev MAP {best['value']:.4f} (step {best['step']})"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checkpoint"] == checkpoint and [f["path"] for f in manifest["files"]] == ["a.parquet", "b.parquet"]
    scored = pa.concat_tables(pq.read_table(out / f["path"]) for f in manifest["files"])
    given = pa.concat_tables(pq.read_table(p) for p in inputs)
    assert scored.drop_columns(["score"]).equals(given)  # the input rows, in order, plus score
    _, records = evaluate_checkpoint(EvaluateConfig(checkpoint=checkpoint, data=wikiqa, split="test"))
    expected = {(r["qid"], e["aid"]): e["score"] for r in records for e in r["ranking"]}
    rows = scored.select(["qid", "aid", "score"]).to_pylist()
    compared = [row for row in rows if (row["qid"], row["aid"]) in expected]
    assert len(compared) > len(rows) // 2  # the questions evaluation keeps (clean: with a positive and a negative)
    for row in compared:
        assert row["score"] == pytest.approx(expected[(row["qid"], row["aid"])], abs=1e-5), row

    # a run that stopped after the first file: the same command scores only the second
    again = ScoreConfig(checkpoint=trained["run"], input=str(tmp_path / "in"), output=str(tmp_path / "again"))
    staging, done = prepared_staging(again, plan_of(again, checkpoint, inputs))
    assert done == set()
    shutil.copyfile(out / "a.parquet", os.path.join(staging, "a.parquet"))
    first = os.stat(os.path.join(staging, "a.parquet")).st_ino
    said: list[str] = []
    resumed = score(again, log=said.append)
    assert said[0] == f"[score] {checkpoint}: {summary['chosen']}"
    assert said[1].startswith("[score] 1 of 2 files scored by an earlier run")
    assert resumed["rows"] == summary["rows"] and resumed["rows_scored_now"] == given.num_rows - len(
        pq.read_table(inputs[0])
    )
    assert os.stat(tmp_path / "again" / "a.parquet").st_ino == first  # kept, not scored again
    resumed_part, first_part = pq.read_table(tmp_path / "again" / "b.parquet"), pq.read_table(out / "b.parquet")
    assert resumed_part.drop_columns(["score"]).equals(first_part.drop_columns(["score"]))
    # the first run's batches held rows of both files: the same scores up to float rounding
    assert resumed_part["score"].to_pylist() == pytest.approx(first_part["score"].to_pylist(), abs=1e-6)
    assert not os.path.exists(staging)

    # rows with a score of their own (a StackExchangeQA shard's: the answer's votes) take the model's in another
    # column, and keep theirs; by default they are refused before any work, naming the option
    (tmp_path / "votes").mkdir()
    first_half = pq.read_table(inputs[0])
    votes = first_half.append_column("score", pa.array(range(first_half.num_rows), pa.int32()))
    pq.write_table(votes, tmp_path / "votes" / "a.parquet")
    with pytest.raises(UsageError, match=r"already has a column score .* name another with --score-column"):
        ScoreConfig(checkpoint=trained["run"], input=str(tmp_path / "votes"), output=str(tmp_path / "o")).check_inputs()
    by_model = ScoreConfig(
        checkpoint=trained["run"], input=str(tmp_path / "votes"), output=str(tmp_path / "scored"), score_column="ms"
    )
    score(by_model, log=lambda line: None)
    both = pq.read_table(tmp_path / "scored" / "a.parquet")
    assert both.drop_columns(["ms"]).equals(votes)
    assert both["ms"].to_pylist() == pytest.approx(pq.read_table(out / "a.parquet")["score"].to_pylist(), abs=1e-6)


def test_the_score_job_refuses_in_a_line_before_any_work(wikiqa, trained, tmp_path):
    from inference.scoring import ScoreConfig
    from pipelines.atomic import OutputError

    inputs = _halves(wikiqa, tmp_path / "in")
    with pytest.raises(OutputError, match="holds the input"):
        ScoreConfig(checkpoint=trained["run"], input=inputs[0], output=str(tmp_path)).check_inputs()
    with pytest.raises(UsageError, match=r"a\.parquet: no column text"):
        ScoreConfig(
            checkpoint=trained["run"], input=str(tmp_path / "in"), output=str(tmp_path / "o"), answer_column="text"
        ).check_inputs()
    with pytest.raises(MissingInput, match="no such checkpoint"):
        ScoreConfig(checkpoint=str(tmp_path / "none"), input=inputs[0], output=str(tmp_path / "o")).check_inputs()
    with pytest.raises(UsageError, match="--batch-size"):
        ScoreConfig(checkpoint=trained["run"], input=inputs[0], output=str(tmp_path / "o"), batch_size=0)
    with pytest.raises(UsageError, match="--score-column answer: the text column it would replace"):
        ScoreConfig(checkpoint=trained["run"], input=inputs[0], output=str(tmp_path / "o"), score_column="answer")


def test_a_checkpoint_mines_by_re_ranking_the_retrievers_shortlist(wikiqa, trained):
    """`--hard-negatives RUN`: the retriever's top `candidates` by cosine, re-ranked by the checkpoint's scores
    (those Ranker gives the same pairs), the best kept; a folder that is no miner is refused in a line."""
    import numpy as np
    import pyarrow as pa

    from inference import Ranker
    from inference.miner import ModelMiner, check_miner, miner_spec
    from pipelines.hard_negatives import EMBEDDED, mine_block
    from training.evaluation import EvaluateConfig, evaluate_checkpoint

    _, records = evaluate_checkpoint(
        EvaluateConfig(checkpoint=trained["best"]["checkpoint"], data=wikiqa, split="test")
    )
    _, question, answers = _test_question(wikiqa, records)
    texts = list(answers.values()) * 3  # enough candidates for a shortlist shorter than the pool
    n = len(texts)
    vectors = np.random.default_rng(0).normal(size=(n + 1, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    rows = [("question", "g", "q", "", "how?", False, 3, vectors[n])]
    rows += [("answer", "g", f"other{i}", f"a{i:03d}", text, True, 0, vectors[i]) for i, text in enumerate(texts)]
    columns = list(zip(*rows))
    block = pa.table(
        {
            "kind": columns[0],
            "group": columns[1],
            "qid": columns[2],
            "aid": columns[3],
            "text": columns[4],
            "score": [1] * len(rows),
            "positive": columns[5],
            "wanted": columns[6],
            "site": ["s"] * len(rows),
            "split": ["test"] * len(rows),
            "vector": [v.tolist() for v in columns[7]],
        }
    ).cast(EMBEDDED)
    block = block.set_column(4, "text", pa.array([question] + texts))
    spec = miner_spec(trained["run"], "minilm", candidates=5)
    check_miner(spec)
    negatives, summary = mine_block(block, ModelMiner(spec))
    shortlist = np.lexsort((np.arange(n), -(vectors[:n] @ vectors[n])))[:5]
    ranker = Ranker.from_checkpoint(trained["run"], device="cpu")
    scores = ranker.score([(question, texts[j]) for j in shortlist])
    best = [f"a{shortlist[k]:03d}" for k in np.lexsort((shortlist, -np.asarray(scores)))[:3]]
    assert negatives.column("aid").to_pylist() == best
    assert summary["scores"]["negative"]["points"] == pytest.approx(sorted(sorted(scores, reverse=True)[:3]), abs=1e-5)
    with pytest.raises(UsageError, match="neither 'minilm', 'mpnet-base', a sentence encoder folder"):
        check_miner(miner_spec(os.path.dirname(trained["run"]) + "/no-such-run"))

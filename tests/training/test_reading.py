"""DynSAN through jobs/train.py's Ray Train loop on real reading-comprehension shards: SQuAD (extractive, EM/F1)
and WikiHop (multiple choice, accuracy), then jobs/evaluate.py on the runs' best checkpoints.

Slow by design (tokenisation and Ray Train start-up); the tiny model learns little in a few steps, so what is
asserted is the wiring: exact step counts, the task's metrics, the best checkpoint chosen by them, and an
evaluation that reproduces the dev figure training recorded.
"""

import json
import os

import pytest
import torch

pytestmark = pytest.mark.slow

TINY = {
    "word_dim": 16,
    "char_dim": 4,
    "char_filters": 8,
    "char_kernel": 3,
    "dim": 16,
    "heads": 2,
    "top_k": 16,
    "kernel": 3,
    "cross_blocks": 1,
    "dropout": 0.0,
}


def _tokenised(shared_data, tmp_path_factory, dataset, links, **options):
    from pipelines.tokenize import TokenizeConfig, write

    folder = tmp_path_factory.mktemp(f"{dataset}_in")
    for name, target in links.items():
        os.symlink(os.path.join(shared_data, target), folder / name)
    out = str(tmp_path_factory.mktemp(dataset) / "out")
    write(TokenizeConfig(dataset=dataset, input=str(folder), output=out, **options))
    return out


@pytest.fixture(scope="module")
def squad_tokenised(shared_data, ray_local, tmp_path_factory):
    # one article (the official dev set's first) for both splits: enough rows to run the loop and its dev pass
    article = "squad_sample/dev-v1.1.first1article.json"
    return _tokenised(shared_data, tmp_path_factory, "squad", {"train-v1.1.json": article, "dev-v1.1.json": article})


@pytest.fixture(scope="module")
def wikihop_tokenised(shared_data, ray_local, tmp_path_factory):
    prefix = "wikihop_sample/wikihop_ml4g_prefix"
    return _tokenised(
        shared_data,
        tmp_path_factory,
        "wikihop",
        {"train.json": f"{prefix}/train.first22.json", "dev.json": f"{prefix}/dev.first28.json"},
        on_error="skip",
        max_context_tokens=3_000,
    )


@pytest.mark.parametrize("dataset, metrics", [("squad", ("f1", "em")), ("wikihop", ("accuracy",))])
def test_dynsan_trains_under_ray_train_and_evaluate_reproduces_dev(dataset, metrics, request, tmp_path, ray_local):
    from pipelines.shards import read_manifest
    from training.config import TrainConfig, batches_per_epoch_for
    from training.evaluation import EvaluateConfig, evaluate_checkpoint
    from training.trainer import run

    data = request.getfixturevalue(f"{dataset}_tokenised")
    manifest = read_manifest(data)
    cfg = TrainConfig(
        model="dynsan",
        data=data,
        storage_path=str(tmp_path),
        name=dataset,
        max_steps=6,
        batch_size=4,
        eval_every=3,
        keep_checkpoints=1,
        log_every=2,
        seed=0,
        model_overrides=TINY,
        test_split="dev",  # as the results page's dev rows run: the best checkpoint scored per question
    )
    summary = run(cfg)
    # on a private instance a run starts no preemption watcher (runtime/ray_env.py): nothing drains its one node
    import ray._private.state

    started = {actor["ActorClassName"] for actor in ray._private.state.actors().values()}
    assert "TrainController" in started and "PreemptionWatcher" not in started
    assert summary["steps"] == 6 and summary["task"] == ("extractive" if dataset == "squad" else "multiple_choice")
    assert set(summary["metrics"]) == set(metrics) | {"questions"}
    assert summary["metrics"]["questions"] == manifest["splits"]["dev"]["rows"]
    assert all(0 <= summary["metrics"][m] <= 1 for m in metrics)
    state = torch.load(os.path.join(summary["checkpoint"], "state.pt"), weights_only=True)
    with open(os.path.join(summary["checkpoint"], "config.json")) as f:
        saved = json.load(f)  # the configuration travels as JSON beside the tensors
    assert saved["model_config"]["task"] == summary["task"]
    # the paper's recipe: warm-up to a constant rate, and a moving average of the weights that dev is scored with
    assert saved["train"]["schedule"] == "warmup_constant" and state["weight_average"]["updates"] == 6
    assert saved["model_config"]["char_vocab_size"] == manifest["char_vocab_size"]
    history = state["dev_history"]
    per_epoch = batches_per_epoch_for(cfg, manifest["splits"]["train"]["rows"])
    expected = sorted({3, 6} | set(range(per_epoch, 6, per_epoch)))  # every 3 steps, epoch ends, the last
    assert [step for step, _ in history] == expected
    best = summary["best"]
    assert best["metric"] == metrics[0] and best["value"] == max(m[metrics[0]] for _, m in history)

    result, records = evaluate_checkpoint(EvaluateConfig(checkpoint=best["checkpoint"], data=data, split="dev"))
    assert result["metrics"][metrics[0]] == pytest.approx(best["value"], abs=1e-9)
    from inference import Ranker
    from runtime.checks import UsageError

    with pytest.raises(UsageError, match="a reading-comprehension model; Ranker ranks answers"):
        Ranker.from_checkpoint(best["checkpoint"], device="cpu")
    assert len(records) == manifest["splits"]["dev"]["rows"]
    if dataset == "squad":
        for record in records:
            start, end = record["span"]
            assert 0 <= start <= end < start + 30 and record["prediction"] and record["answers"]
    else:
        assert all(record["answer"] for record in records)
    json.dumps(records)  # every record can be written as a JSON line

    # --test-split dev: the best checkpoint's dev figures again, with the per-question records the results page
    # computes a dev row's interval and paired tests from
    from experiments.runner import question_figures

    test = summary["test"]
    assert test["split"] == "dev" and test["step"] == best["step"]
    assert test["metrics"][metrics[0]] == pytest.approx(best["value"], abs=1e-9)
    figures = question_figures(test["predictions"])
    assert figures["metric"] == ("f1" if dataset == "squad" else "correct")
    assert len(figures["values"]) == manifest["splits"]["dev"]["rows"]
    assert sum(figures["values"].values()) / len(figures["values"]) == pytest.approx(best["value"], abs=1e-4)

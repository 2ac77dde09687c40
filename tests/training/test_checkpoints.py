"""Which checkpoint of a run is its best, and what a job says of the one it scores (no Ray instance)."""

import math
from types import SimpleNamespace

import pytest

from training.checkpoints import NO_SCORE, SCORE, choose_checkpoint, select_score


def test_a_tie_ranks_one_float_step_below_the_evaluation_it_ties():
    assert select_score(0.75, []) == 0.75
    assert select_score(0.75, [0.5, 0.7]) == 0.75
    assert select_score(0.75, [0.75]) == math.nextafter(0.75, 0.0)
    assert select_score(0.75, [0.75, 0.6, 0.75]) == math.nextafter(math.nextafter(0.75, 0.0), 0.0)
    assert select_score(0.75, [0.75]) > 0.7499999999  # no figure shown changes
    assert select_score(None, [0.75]) == NO_SCORE


def test_the_first_of_tied_evaluations_is_the_one_ray_train_keeps_as_best():
    """Ray Train's own ordering (later reports above earlier ones of the same score) and eviction of all but the
    top `keep` and the latest: ranked by their dev MAP alone, these reports left step 6 as the best, a later tie
    of step 2, the first to reach it and the one --patience counts from."""
    from ray.train._internal.checkpoint_manager import _insert_into_sorted_list

    history = [(2, 0.61), (4, 0.55), (6, 0.61), (8, 0.61), (10, 0.58)]

    def kept(rank, keep=2):
        results, order, earlier = [], {}, []
        for index, (step, value) in enumerate(history):
            result = SimpleNamespace(checkpoint=f"checkpoint-{step}", step=step, score=rank(value, earlier))
            order[result.checkpoint] = index
            _insert_into_sorted_list(results, result, key=lambda r: r.score, checkpoint_to_report_index=order)
            evicted = set(map(id, results[:-keep])) - {id(result)}
            results = [r for r in results if id(r) not in evicted]
            earlier.append(value)
        return max(results, key=lambda r: r.score).step  # resolve_checkpoint's choice

    assert kept(lambda value, earlier: value) == 6  # as before: a later tie
    assert kept(select_score) == 2
    assert kept(select_score, keep=1) == 2


@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    """A run folder whose Ray Train record (`run_result`) is given: the latest checkpoint at step 30 and the kept
    checkpoints' reports."""
    (tmp_path / "checkpoint_manager_snapshot.json").write_text("{}")

    def with_reports(*reports):
        checkpoints = [(SimpleNamespace(path=str(tmp_path / f"checkpoint-{m['step']}")), m) for m in reports]
        result = SimpleNamespace(best_checkpoints=checkpoints, checkpoint=checkpoints[-1][0], metrics=reports[-1])
        monkeypatch.setattr("training.checkpoints.run_result", lambda path: result)
        return str(tmp_path)

    return with_reports


def test_the_best_checkpoint_is_named_with_its_dev_figure_and_step(run_folder):
    run = run_folder(
        {"step": 10, "select_metric": "map", "dev": {"map": 0.7412}, SCORE: 0.7412},
        {"step": 20, "select_metric": "map", "dev": {"map": 0.7412}, SCORE: math.nextafter(0.7412, 0.0)},
        {"step": 30, "select_metric": "map", "dev": {"map": 0.70}, SCORE: 0.70},
    )
    path, why = choose_checkpoint(run)
    assert path.endswith("checkpoint-10")
    assert why == "the run's best checkpoint by dev MAP 0.7412 (step 10)"
    path, why = choose_checkpoint(run, "latest")
    assert path.endswith("checkpoint-30") and why == "the run's latest checkpoint (step 30)"
    earlier_run = run_folder(
        {"step": 10, "dev": {"map": 0.61, "mrr": 0.65, "p@1": 0.5}, SCORE: 0.65}
    )  # --select-metric mrr
    assert choose_checkpoint(earlier_run)[1] == "the run's best checkpoint by dev MRR 0.6500 (step 10)"


def test_a_run_no_dev_evaluation_ranked_gives_its_latest_and_says_so(run_folder):
    """An interrupted pretraining run before its first dev evaluation: its checkpoints carry a loss, no score.
    --which best gave the latest without a word."""
    run = run_folder({"step": 15, "loss": 0.61, SCORE: NO_SCORE}, {"step": 30, "loss": 0.52, SCORE: NO_SCORE})
    path, why = choose_checkpoint(run)
    assert path.endswith("checkpoint-30")
    assert why == (
        "the run's latest checkpoint (step 30): no dev evaluation ranked the run's checkpoints, so none is its best"
    )


def test_a_checkpoint_folder_is_itself(tmp_path):
    (tmp_path / "state.pt").write_bytes(b"")
    assert choose_checkpoint(str(tmp_path), "latest") == (str(tmp_path), "the checkpoint named")

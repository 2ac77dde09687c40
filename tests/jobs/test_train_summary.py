"""What train.py prints at the end of a run, from its summary (no Ray)."""

from __future__ import annotations

from jobs.train import print_dev_figures

REFERENCES = {
    "random": {"map": 0.411, "mrr": 0.416, "p@1": 0.21},
    "word_overlap": {"map": 0.612, "mrr": 0.614, "p@1": 0.444},
}


def _summary(last_step: int, best_step: int) -> dict:
    """The summary of a CTRN run of 40 steps on WikiQA evaluated at steps 20 and 40 (its figures)."""
    last = {"map": 0.4632, "mrr": 0.4678, "p@1": 0.2698, "questions": 126}
    best = {"map": 0.4634, "mrr": 0.4728, "p@1": 0.2857, "questions": 126} if best_step != last_step else last
    return {
        "model": "ctrn",
        "steps": last_step,
        "metrics": last,
        "best": {"checkpoint": "RUN/checkpoint", "step": best_step, "metric": "map", "value": best["map"], "dev": best},
        "references": REFERENCES,
    }


def test_the_best_checkpoints_dev_figures_stand_beside_the_last_steps(capsys):
    """They were the last step's alone, under the line naming the best checkpoint that --test-split scored: a run
    stopped by --patience showed figures of weights it had not kept."""
    print_dev_figures(_summary(40, 20))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "dev 126 questions:"
    assert lines[1].split() == ["ctrn", "step", "40", "MAP", "0.463", "MRR", "0.468", "P@1", "0.270", "last", "step"]
    assert lines[2].split() == [
        "ctrn",
        "step",
        "20",
        "MAP",
        "0.463",
        "MRR",
        "0.473",
        "P@1",
        "0.286",
        "best",
        "checkpoint",
    ]
    assert [line.split()[0] for line in lines[3:]] == ["random", "word"]
    assert len({line.index("MAP") for line in lines[1:]}) == 1  # one column


def test_a_run_whose_last_step_is_its_best_shows_one_row_as_before(capsys):
    print_dev_figures(_summary(40, 40))
    lines = capsys.readouterr().err.splitlines()
    assert lines[1] == "  ctrn            MAP 0.463  MRR 0.468  P@1 0.270"
    assert len(lines) == 4

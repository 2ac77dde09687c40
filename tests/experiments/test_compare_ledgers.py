"""experiments/compare_ledgers.py: two ledgers of one plan, run on two machines, side by side."""

from __future__ import annotations

import json
import os
import random

import pytest

from experiments import compare_ledgers
from experiments.ledger import Ledger


def _run(row: str, seed: int, aps: list[float], inputs: str = "ab", profile: str = "hour", out="out/results") -> dict:
    return {
        "row": row,
        "seed": seed,
        "profile": profile,
        "split": "test",
        "test": {"map": sum(aps) / len(aps), "mrr": 0.5},
        "inputs_sha256": {
            f"{out}/data/trecqa/manifest.json": out,  # a manifest names the folders it was written to
            f"{out}/data/trecqa/embeddings.npy": inputs * 32,
        },
        "per_question": {"metric": "ap", "values": {f"q{i}": ap for i, ap in enumerate(aps)}},
    }


def _ledgers(tmp_path, gate_gain_b: float):
    """The IARNN gate/word claim on TrecQA: in A the gate row is better by 0.3 AP on each of 60 questions; in B
    (another machine, other word vectors) by `gate_gain_b`, the word row's figures the same."""
    noise = random.Random(0)
    word = [noise.uniform(0.2, 0.5) for _ in range(60)]
    paths = []
    for name, gain, inputs in (("a", 0.3, "ab"), ("b", gate_gain_b, "cd")):
        (tmp_path / name).mkdir(parents=True)
        ledger = Ledger(str(tmp_path / name / "ledger.json"))
        for seed in range(3):
            ledger.add(f"trecqa-iarnn-word-seed{seed}", _run("trecqa/iarnn-word", seed, word, inputs))
            ledger.add(
                f"trecqa-iarnn-gate-seed{seed}", _run("trecqa/iarnn-gate", seed, [w + gain for w in word], inputs)
            )
        ledger.add("full-trecqa-qrnn-seed0", _run("trecqa/qrnn", 0, word, profile="full"))  # another profile
        ledger.add("data:trecqa", {"command": "python jobs/tokenize_corpora.py ...", "seconds": 1.0})
        paths.append(ledger.path)
    return paths


def test_runs_rows_and_claims_are_set_side_by_side(tmp_path, capsys):
    a, b = _ledgers(tmp_path, gate_gain_b=-0.3)
    for path, epochs in ((a, 1), (b, 2)):  # recorded under other plans: not the same run
        Ledger(path).add("trecqa-qrnn-seed0", dict(_run("trecqa/qrnn", 0, [0.5] * 60), plan={"epochs": epochs}))
    for path, out in ((a, "out/results"), (b, "elsewhere/out")):  # the same plan under another results folder
        command = f"python jobs/train.py --model ctrn --data {out}/data/trecqa --storage-path {out}/runs"
        plan = {"commands": [command], "recipe": {"epochs": 1}}
        Ledger(path).add("trecqa-ctrn-seed0", dict(_run("trecqa/ctrn", 0, [0.5] * 60, out=out), plan=plan))
    out = tmp_path / "comparison.json"
    assert compare_ledgers.main([a, b, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "7 runs in both: 4 the same figure to the last bit, 4 within 0.002; of the 7 that read word vectors, 1 read "
        "the same in both (1 of those the same figure, 3 of the others)" in printed
    )
    assert "largest difference: trecqa-iarnn-gate-seed0 map -0.6000" in printed
    assert "left out, recorded under another plan in each: trecqa-qrnn-seed0" in printed
    comparison = json.loads(out.read_text())
    assert {r["run"] for r in comparison["runs"]} == {
        f"trecqa-iarnn-{m}-seed{s}" for m in ("word", "gate") for s in range(3)
    } | {"trecqa-ctrn-seed0"}
    rows = ["trecqa/ctrn", "trecqa/iarnn-word", "trecqa/iarnn-gate"]
    assert sorted(r["row"] for r in comparison["rows"]) == sorted(rows)  # not qrnn's
    assert comparison["other_plans"] == ["trecqa-qrnn-seed0"]
    (claim,) = comparison["claims"]  # the only claim both ledgers' rows answer
    assert claim["claim"] == "IARNN: gate attention against word attention (TrecQA)"
    assert (claim["a_verdict"], claim["b_verdict"], claim["same_verdict"]) == ("holds", "reversed", False)
    assert "0 of 1 claims judged alike" in printed and "**(differs)**" in printed

    a, b = _ledgers(tmp_path / "alike", gate_gain_b=0.25)
    Ledger(a).add("trecqa-iarnn-gate-seed3", _run("trecqa/iarnn-gate", 3, [0.0] * 60))  # a seed B has not run
    compare_ledgers.main([a, b])
    printed = capsys.readouterr().out
    assert "left out, in one ledger only: 1 runs of A, 0 of B" in printed
    assert "1 of 1 claims judged alike" in printed and "| trecqa/iarnn-gate | map | 3 |" in printed


def test_bad_arguments_are_refused_before_any_work(tmp_path, capsys):
    a, b = _ledgers(tmp_path, gate_gain_b=0.3)
    with open(os.path.join(tmp_path, "results.md"), "w") as f:
        f.write("# Results\n")
    for argv, message in (
        ([a, str(tmp_path / "none.json")], "none.json: no such ledger"),
        ([a, a], "the same ledger as"),
        ([a, b, "--json", a], "writing it would destroy that input"),
        ([a, b, "--json", os.path.join(tmp_path, "results.md")], "not an earlier comparison (JSON with claims)"),
        ([a, os.path.join(tmp_path, "results.md")], "results.md: not a run ledger: not JSON"),
    ):
        with pytest.raises(SystemExit):
            compare_ledgers.main(argv)
        assert message in capsys.readouterr().err
    with open(os.path.join(tmp_path, "results.md")) as f:
        assert f.read() == "# Results\n"

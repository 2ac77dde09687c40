"""A row's figures as the report's cells and sentences: mean ± standard deviation with the number of runs, the
hour's figure beside the full profile's, the difference from the paper, each run's wall time and learning curve,
the verdict on a claim, and a profile's wall time."""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable

from experiments.figures import metric_names, row_figures, row_profile, row_questions, row_records
from experiments.ledger import Ledger
from experiments.machine import device_kind, gpu_name
from experiments.plan import Row, run_name
from experiments.rows import MINILM_BATCH, MINILM_STEPS
from experiments.runner import data_identities, data_identity, source_run, started_elsewhere
from experiments.significance import aligned, bootstrap_interval, paired_comparison
from experiments.significance import verdict as significance_verdict


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
    text = ", ".join(
        wall(runs)
        + ("" if device == "cpu" else f" on {gpu_name(device)}")
        + (f" ({len(runs)} run{'s' if len(runs) > 1 else ''})" if len(by_device) > 1 else "")
        for device, runs in by_device.items()
    )
    curves = [
        (r.get("dev_history") or [], r.get("stopped_early", False)) for r in sorted(records, key=lambda r: r["seed"])
    ]
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
    return (
        text
        + f"; {evaluations} evaluations, best after {bests}"
        + (f" ({still} still improving at the end)" if still else "")
    )


def cell(figure, scale: str = "{:.3f}") -> str:
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
        return "left out of the hour's plan" if row.extra else "-"
    minutes = statistics.fmean(r["seconds"] for r in row_records(row, ledger, "hour")) / 60
    return (
        f"{cell(figure, scale)}, {minutes:.0f} min"
        if minutes >= 1.5
        else f"{cell(figure, scale)}, {minutes * 60:.0f} s"
    )


DIRTY_MARK = " (uncommitted code)"
EARLIER_PLAN_MARK = " (earlier plan)"
MIXED_START_MARK = " (mixed starting checkpoints)"
INPUTS_MARK = " (runs read other data)"
DEVICES_MARK = " (mixed devices)"


def compute_of(record: dict) -> str:
    """How a run trained: the precision its arithmetic ran in (fp32, bf16 or fp16) on a kind of device (a CPU or a
    GPU). Another precision changes what training computes, as a seed or another data file does, so a claim sets two
    rows side by side only where every run of both trained alike; another GPU model, or another CPU's kernels,
    changes only rounding (the re-run table measures how much) and is not told apart here."""
    device = device_kind(record)
    precision = record.get("precision")
    return f"{precision} on {device}" if precision else f"{device} with its precision not recorded"


def computes_of(records: Iterable[dict]) -> list[str]:
    """The ways (`compute_of`) that `records` trained, sorted: more than one in a row marks it (mixed devices)."""
    return sorted({compute_of(r) for r in records})


def computes_differ(with_records: list[dict], without_records: list[dict]) -> str | None:
    """How two rows' runs trained, where not all alike (`compute_of`): "bf16 on a GPU against fp32 on a CPU"."""
    with_it, without = computes_of(with_records), computes_of(without_records)
    if len(set(with_it) | set(without)) <= 1:
        return None
    return f"{' and '.join(with_it)} against {' and '.join(without)}"


def inputs_differ(records: Iterable[dict], ledger: Ledger | None = None) -> str | None:
    """Why runs meant to read the same data may not have, from their records' `inputs_sha256` (the data manifest
    and word vectors each read, by content: a manifest by its sha256 without the folders it names, a carried
    copy's by the one it was carried from, with what the `ledger` knows of them: `runner.data_identity`): a file
    that two of them read with other contents, or runs that recorded what they read beside runs that did not (made
    before records kept it, such as a row re-run in part). None where the files they share agree, or where no run
    recorded its inputs (nothing to set against each other). Files only some runs read (another set of vectors, by
    design) are not compared."""
    records = list(records)
    known = data_identities(ledger.records.values()) if ledger is not None else None
    recorded = [data_identity(r, known) for r in records if r.get("inputs_sha256")]
    if not recorded:
        return None
    contents: dict[str, set[str]] = {}
    for files in recorded:
        for path, sha in files.items():
            contents.setdefault(path, set()).add(sha)
    differing = sorted(path for path, shas in contents.items() if len(shas) > 1)
    if differing:
        return f"{', '.join(differing)} read with other contents"
    if len(recorded) < len(records):
        return f"{len(records) - len(recorded)} of {len(records)} runs recorded without the sha256 of their inputs"
    return None


def from_earlier_plan(row: Row, ledger: Ledger, earlier: Collection[str], profile: str | None = None) -> bool:
    """Whether any of the row's shown runs (in `profile`, default the shown one) is in `earlier`: recorded under
    a plan (commands, recipe) since changed."""
    return any(run_name(row, r["seed"], r.get("profile", "hour")) in earlier for r in row_records(row, ledger, profile))


def mixed_starts(row: Row, ledger: Ledger, profile: str | None = None) -> list[int]:
    """The seeds of a fine-tuning row's shown runs (in `profile`, default the shown one) that did not start from
    the checkpoint their source run's record holds (`runner.started_elsewhere`), so that the row's seeds may not
    share one starting point."""
    profile = profile or row_profile(row, ledger)
    if profile is None:
        return []
    mixed = []
    for record in row_records(row, ledger, profile):
        source = source_run(row, profile, record["seed"])  # None: the row fine-tunes nothing
        if source is not None and started_elsewhere(record, ledger.records.get(source.name)):
            mixed.append(record["seed"])
    return sorted(mixed)


def run_marks(row: Row, shown_runs: list[dict], ledger: Ledger, earlier: Collection[str] = ()) -> str:
    """The marks of a row whose `shown_runs` (`row_records`) do not stand together: where one is in `earlier`,
    recorded under a plan since changed; where a fine-tuning run did not start from its source record's
    checkpoint; where they read other data (`inputs_differ`); and where they trained in more than one precision or
    kind of device (`computes_of`)."""
    return (
        (EARLIER_PLAN_MARK if from_earlier_plan(row, ledger, earlier) else "")
        + (MIXED_START_MARK if mixed_starts(row, ledger) else "")
        + (INPUTS_MARK if inputs_differ(shown_runs, ledger) else "")
        + (DEVICES_MARK if len(computes_of(shown_runs)) > 1 else "")
    )


def row_start(row: Row, ledger: Ledger, figures: dict, earlier: Collection[str] = ()) -> str:
    """A table row's first cells: the row (marked where a shown run ran from uncommitted code: its record's commit
    ends in -dirty, and by `run_marks`), the profile its figures come from, and how many seeds they average."""
    seeds = max((figure[2] for figure in figures.values()), default=0)
    shown_runs = row_records(row, ledger)
    dirty = any(str(r.get("commit", "")).endswith("-dirty") for r in shown_runs)
    marks = (DIRTY_MARK if dirty else "") + run_marks(row, shown_runs, ledger, earlier)
    return f"| {row.label}{marks} | {row_profile(row, ledger) or '-'} | {seeds}"


def delta(ours, paper, digits: int) -> str:
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
    return (
        f"Trained for 3 epochs of all the training pairs (the row outside the hour, {seeds}), the same MiniLM "
        f"cross-encoder reaches MAP {epochs[0]:.3f}, {gap(epochs_gap)} the paper's BERT-base ({paper:.3f}); the "
        f"hour's {MINILM_STEPS * MINILM_BATCH:,} pairs leave it {gap(hour_gap)}. So {reading}."
    )


def wall_sentence(meta: dict, ledger: Ledger, planned: Collection[str]) -> str:
    """The wall time of the profile's last invocation that ran its whole plan; said to be another plan's where
    the runs that invocation planned (`runs`, recorded since it was kept) are not `planned`, the present plan's."""
    if "wall_s" not in meta:
        return "no complete invocation recorded yet"
    other_plan = "runs" in meta and set(meta["runs"]) != set(planned)
    text = (
        f"the last complete invocation ran another plan ({len(meta['runs'])} runs; the present one's "
        f"{len(planned)} have not been timed together) and took {meta['wall_s'] / 60:.0f} minutes of wall time"
        if other_plan
        else f"the last complete invocation took {meta['wall_s'] / 60:.0f} minutes of wall time"
    )
    over = (
        f"; **that is over the hour the plan is meant to fit by {meta['wall_s'] / 60 - 60:.0f} minutes**"
        if meta.get("profile", "hour") == "hour" and meta["wall_s"] > 3600 and not other_plan
        else ""
    )
    if meta.get("note"):  # what the recorded time does not show by itself (a shared machine, say)
        over += f" ({meta['note']})"
    parts = []
    if meta.get("data_wall_s"):
        parts.append(f"{meta['data_wall_s'] / 60:.0f} of them preparing the data")
    if meta.get("efficiency_s"):
        parts.append(f"{meta['efficiency_s'] / 60:.0f} timing the encoders for the efficiency plots")
    text += f" ({', '.join(parts)})" if parts else ""
    steps = sum(r["seconds"] for k, r in ledger.records.items() if k.startswith("data:"))
    if not meta.get("data_wall_s") and steps:
        text += (
            f"; the data had been prepared by an earlier one ({steps / 60:.0f} minutes, its steps summed, "
            "one after another)"
        )
    return text + over


def interval_cell(row: Row, ledger: Ledger, metric: str, scale: str = "{:.3f}") -> str:
    """The 95% bootstrap interval of the row's `metric` over its test questions, its seeds pooled per question
    (experiments.significance); "-" where its runs predate per-question figures."""
    seeds = row_questions(row, ledger, metric)
    if not seeds:
        return "-"
    interval = bootstrap_interval(aligned(seeds)[1])
    return f"[{scale.format(interval.low)}, {scale.format(interval.high)}]"


def p_text(p: float) -> str:
    """A p-value as the page prints it: three places, and "p < 0.001" below them (a permutation p is never 0)."""
    return "p < 0.001" if p < 0.001 else f"p {p:.3f}"


def paper_difference(with_row: Row, without_row: Row, metric: str, ours_only: bool) -> float | None:
    """The paper's own difference for the claim "with_row is better than without_row" (the figures of the paper's
    own comparison: DynSAN's ablations are SearchQA's, whatever its row stands beside); None where a paper gives
    either figure not, or for a comparison of ours."""
    pa = (with_row.claim_paper or with_row.paper).get(metric)
    pb = (without_row.claim_paper or without_row.paper).get(metric)
    return pa - pb if pa is not None and pb is not None and not ours_only else None


def claim_cells(
    with_row: Row, without_row: Row, ledger: Ledger, metric: str, paper_diff: float | None, same_budget: bool
) -> tuple[str, str]:
    """(ours, verdict) of the claim "with_row is better than without_row" on `metric`: the mean difference over
    the test questions both rows scored, its 95% bootstrap interval and the paired permutation p, and the word
    that follows from them (experiments.significance.verdict: "reversed" only where the interval excludes zero on
    the other side of the paper's). Runs recorded before per-question figures give the difference of the rows'
    means with their spread, untested; rows whose runs read other data (`inputs_differ`) or trained in another
    precision or on another kind of device (`computes_differ`) are not compared; rows shown at other budgets
    (`same_budget` false) give no difference at all."""
    reading = with_row.section.startswith("squad")
    digits = 1 if reading else 3
    a, b = row_figures(with_row, ledger).get(metric), row_figures(without_row, ledger).get(metric)
    if not a or not b:
        return "-", "not run"
    if not same_budget:  # a difference across budgets is mostly the budget's: none is printed
        return "-", "budgets differ: not compared"
    means = f"{a[0] - b[0]:+.{digits}f}"  # the difference of the rows' means, with their spread where both have one
    if a[1] is not None and b[1] is not None:  # a row of one run has no spread: not a ± 0
        means += f" ± {(a[1] ** 2 + b[1] ** 2) ** 0.5:.{digits}f}"
    with_records, without_records = row_records(with_row, ledger), row_records(without_row, ledger)
    other_data = inputs_differ(with_records + without_records, ledger)
    other_devices = computes_differ(with_records, without_records)
    if other_data:
        return means, f"inputs differ: not compared ({other_data})" + (
            f"; devices differ ({other_devices})" if other_devices else ""
        )
    if other_devices:
        return means, f"devices differ: not compared ({other_devices})"
    if reading and min(a[0], b[0]) < 10:  # see the DynSAN section
        return means, "no evidence: F1 under 10"
    seeds_a, seeds_b = row_questions(with_row, ledger, metric), row_questions(without_row, ledger, metric)
    if not seeds_a or not seeds_b:
        return means, "not tested: runs without per-question figures"
    questions, matrix = aligned(seeds_a + seeds_b)  # the questions every seed of both rows scored
    comparison = paired_comparison(matrix[: len(seeds_a)], matrix[len(seeds_a) :])
    ours = (
        f"{comparison.difference:+.{digits}f} [{comparison.low:+.{digits}f}, {comparison.high:+.{digits}f}], "
        f"{p_text(comparison.p)} ({len(questions)} questions)"
    )
    return ours, significance_verdict(comparison, paper_diff)

"""The report's plots: answer selection against the papers, DynSAN's ablations and learning curve, and the
efficiency curves of bench/encoders.py."""

from __future__ import annotations

from experiments.cells import inputs_differ
from experiments.figures import row_figures, row_profile, row_records
from experiments.ledger import Ledger
from experiments.plan import Row
from experiments.rows import ABLATION_F1, EFFICIENCY_PLOTS


def plot_answer_selection(rows: list[Row], ledger: Ledger, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [s for s in ("wikiqa", "trecqa") if any(r.section == s for r in rows)]
    fig, axes = plt.subplots(1, len(sections), figsize=(7 * len(sections), 5.5), squeeze=False)
    for ax, section in zip(axes[0], sections):
        chosen = [r for r in rows if r.section == section]
        figures = [row_figures(r, ledger).get("map") for r in chosen]
        y = range(len(chosen))
        ax.barh(
            [i + 0.2 for i in y],
            [f[0] if f else 0 for f in figures],
            0.4,
            xerr=[(f[1] or 0) if f else 0 for f in figures],
            label="ours (mean ± std over seeds)",
            color="tab:blue",
        )
        ax.barh([i - 0.2 for i in y], [r.paper.get("map", 0) for r in chosen], 0.4, label="paper", color="tab:gray")
        ax.set_yticks(list(y), [r.label for r in chosen], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0.4, 0.95)
        ax.set_xlabel("test MAP")
        ax.set_title(
            {"wikiqa": "WikiQA (clean test, 243 questions)", "trecqa": "TrecQA (TRAIN, clean test, 68 questions)"}[
                section
            ]
        )
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ablation_changes(rows: list[Row], ledger: Ledger) -> list[tuple[str, float, float, bool]]:
    """(label, our F1 change from the full DynSAN, the paper's, whether both read the same data) of each ablation
    whose shown runs are of the profile the full model shows: a change within one profile (a row with only the
    hour's runs, beside a full model shown at the full profile's budget, would be set against another budget). A
    change between runs that read other data or word vectors (`cells.inputs_differ`: vectors trained on another
    kind of CPU, say) is drawn, but marked: it is not the ablation's alone."""
    chosen = [r for r in rows if r.section == "squad"]
    full = next((r for r in chosen if r.id == "squad/dynsan"), None)
    base = row_figures(full, ledger).get("f1") if full else None
    if full is None or not base:
        return []
    shown = row_profile(full, ledger)
    paper = (full.claim_paper or full.paper)["f1"]  # Table 3's full model (SearchQA), not Table 4's SQuAD figure
    full_records = row_records(full, ledger, shown)
    changes = []
    for r in chosen[1:]:
        f1 = row_figures(r, ledger).get("f1")
        if f1 and row_profile(r, ledger) == shown:
            same = not inputs_differ(full_records + row_records(r, ledger), ledger)
            changes.append((r.label, f1[0] - base[0], r.paper["f1"] - paper, same))
    return changes


def plot_reading(rows: list[Row], ledger: Ledger, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    changes = ablation_changes(rows, ledger)
    labels, ours, theirs = [c[0] for c in changes], [c[1] for c in changes], [c[2] for c in changes]
    y = range(len(labels))
    bars = ax.barh(
        [i + 0.2 for i in y],
        ours,
        0.4,
        label="ours: F1 change from full DynSAN (SQuAD-style, mean of seeds)",
        color="tab:blue",
    )
    for bar, (*_, same) in zip(bars, changes):
        if not same:
            bar.set(hatch="//", facecolor="white", edgecolor="tab:blue")
    ax.barh([i - 0.2 for i in y], theirs, 0.4, label="paper: F1 change (Table 3, SearchQA)", color="tab:gray")
    handles, _ = ax.get_legend_handles_labels()
    if not all(c[3] for c in changes):
        from matplotlib.patches import Patch

        handles.insert(
            1,
            Patch(
                hatch="//",
                facecolor="white",
                edgecolor="tab:blue",
                label="ours, from runs on other data or word vectors",
            ),
        )
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("F1 points")
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.3, -0.15))  # below: clear of the bars
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_long_run(history: list, steps_per_epoch: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    epochs = [step / steps_per_epoch for step, _ in history]
    for name, style in (("f1", "o-"), ("em", "s--")):
        ax.plot(epochs, [f.get(name, 0) * 100 for _, f in history], style, label=f"dev {name.upper()}")
    ax.axhline(ABLATION_F1, color="gray", linewidth=0.8, linestyle=":", label=f"F1 {ABLATION_F1}: the ablations' level")
    ax.set_xlabel("epoch")
    ax.set_ylabel("points")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_transfer_curve(
    points: list[tuple],
    paper: tuple[float, float],
    fit: tuple[float, float] | None,
    path: str,
    band: tuple | None = None,
    baseline: tuple[float, float, float] | None = None,
):
    """WikiQA test MAP against pretraining pairs (log scale): ours with 95% intervals, `points` as (pairs, MAP,
    low, high, label); the paper's (pairs, MAP) with BERT-base; `fit` (a, b) of MAP = a + b log10(pairs), drawn
    through ours and on to the paper's corpus size, with `band` (pairs, lows, highs), its 95% interval, shaded;
    `baseline` (MAP, low, high), the same model without pretraining, as a level line across (no pairs has no place
    on a log axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    pairs = [p[0] for p in points]
    ax.errorbar(
        pairs,
        [p[1] for p in points],
        yerr=[[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]],
        fmt="o",
        capsize=3,
        label="MiniLM-L6 + GSAMN (ours, 95% interval)",
    )
    for p in points:
        ax.annotate(p[4], (p[0], p[1]), textcoords="offset points", xytext=(6, -10), fontsize=7)
    ax.plot([paper[0]], [paper[1]], "s", color="black", label="the paper: BERT-base, all of Stack Exchange")
    if fit is not None:
        xs = np.logspace(np.log10(min(pairs)), np.log10(paper[0]), 50)
        ax.plot(xs, fit[0] + fit[1] * np.log10(xs), "--", color="gray", linewidth=0.8, label="log-linear fit, extended")
    if band is not None:
        ax.fill_between(*band, color="gray", alpha=0.15, linewidth=0, label="the fit's 95% interval")
    if baseline is not None:
        label = "no pretraining (ours, 95% interval shaded)"
        ax.axhline(baseline[0], color="tab:orange", linestyle=":", linewidth=1.2, label=label)
        ax.axhspan(baseline[1], baseline[2], color="tab:orange", alpha=0.08, linewidth=0)
    ax.set_xscale("log")
    ax.set_xlabel("pretraining pairs (ours: the train split; the paper: its whole corpus)")
    ax.set_ylabel("WikiQA test MAP")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_efficiency(cases: list[dict], family: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, names = EFFICIENCY_PLOTS[family]
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for variant, name in names.items():
        points = sorted(
            (c["length"], c["seconds"] * 1000, c["peak_mb"])
            for c in cases
            if c["family"] == family and c["variant"] == variant
        )
        if not points:
            continue
        lengths, ms, mb = zip(*points)
        style = "-o" if variant in ("group", "ctrn", "dynsa") else "--s"
        time_ax.plot(lengths, ms, style, label=name, markersize=4)
        memory_ax.plot(lengths, [max(m, 1.0) for m in mb], style, label=name, markersize=4)
    for ax, ylabel in ((time_ax, "forward + backward, ms (best of 2)"), (memory_ax, "peak memory above start, MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    time_ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""A row's figures from the ledger: its records per profile, and the mean, spread and count of each metric over
its seeds (reading comprehension in percent)."""

from __future__ import annotations

import math
import statistics

from experiments.ledger import Ledger
from experiments.plan import Row
from experiments.rows import DYNSAN_STEPS_PER_EPOCH


def summarise(values: list[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def metric_names(row: Row) -> tuple[str, ...]:
    return ("em", "f1") if row.section.startswith("squad") else ("map", "mrr", "p@1")


def row_records(row: Row, ledger: Ledger, profile: str | None = None) -> list[dict]:
    """The row's recorded runs in `profile` (default: `row_profile`, the one the report shows)."""
    profile = profile or row_profile(row, ledger)
    return [
        r
        for k, r in ledger.records.items()
        if ":" not in k and isinstance(r, dict) and r.get("row") == row.id and r.get("profile", "hour") == profile
    ]


def row_profile(row: Row, ledger: Ledger) -> str | None:
    """The profile whose runs the report shows for `row`: the full one once it has any, else the hour's."""
    profiles = {
        r.get("profile", "hour")
        for k, r in ledger.records.items()
        if ":" not in k and isinstance(r, dict) and r.get("row") == row.id
    }
    return "full" if "full" in profiles else ("hour" if "hour" in profiles else None)


def row_figures(row: Row, ledger: Ledger, profile: str | None = None) -> dict:
    """{metric: (mean, std, n)} over the row's recorded seeds, reading-comprehension figures in percent."""
    records = row_records(row, ledger, profile)
    figures = {}
    for name in metric_names(row):
        values = [
            r["test"][name] * (100 if row.section.startswith("squad") else 1)
            for r in records
            if r["test"].get(name) is not None
        ]
        if values:
            figures[name] = (*summarise(values), len(values))
    return figures


# A row's metric and the figure its questions carry in their records (experiments.runner.question_figures).
QUESTION_METRIC = {"map": "ap", "f1": "f1", "accuracy": "correct"}


def row_questions(row: Row, ledger: Ledger, metric: str) -> list[dict[str, float]] | None:
    """Each seed's {question id: figure} of `metric` (map: AP, f1: F1), reading comprehension in percent; None
    unless every seed of the row shown recorded them (runs recorded before per-question figures have none)."""
    records = row_records(row, ledger)
    wanted = QUESTION_METRIC.get(metric)
    if not records or any((r.get("per_question") or {}).get("metric") != wanted for r in records):
        return None
    scale = 100 if row.section.startswith("squad") else 1
    return [{q: v * scale for q, v in r["per_question"]["values"].items()} for r in records]


def first_epoch_reaching(history: list, f1: float) -> int | None:
    """The first epoch after which a DynSAN run's dev F1 (in percent) reached `f1`, read off its per-epoch history
    (a record's `dev_history`, [step, figures] pairs); None if it never did."""
    step = next((step for step, figures in history if figures.get("f1", 0) * 100 >= f1), None)
    return math.ceil(step / DYNSAN_STEPS_PER_EPOCH) if step else None

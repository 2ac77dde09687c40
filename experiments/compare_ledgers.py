"""Set two ledgers' records of the same runs side by side: which figures, and which of the papers' conclusions,
depend on where the runs ran.

    python experiments/compare_ledgers.py A/ledger.json B/ledger.json [--profile hour] [--json OUT.json]

For the same plan run on two machines (say `results.py --profile hour --ledger B/ledger.json --out B/out` on another
kind of CPU, or on a GPU): each run both ledgers hold under the profile, its test figure in both (the same bits, the
same within 0.002, or how far apart) and whether both read the same word vectors (`inputs_sha256`); each
row's mean over its seeds in both; and each of the papers' claims judged on each ledger by the page's own paired
test (experiments/cells.py's `claim_cells`), with whether the verdict is the same. Rows and claims are computed over
the runs both ledgers hold (a run in one only is left out, and counted); a run recorded under another plan in each
(other commands or recipe) is not the same run: it is left out, and named. Reads only; `--json` writes what it
prints.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys

if __package__ in (None, ""):  # run as `python experiments/compare_ledgers.py` from a clone that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.cells import claim_cells, paper_difference
from experiments.figures import row_figures
from experiments.ledger import Ledger
from experiments.report import is_run_record
from experiments.rerun import PRIMARY_FIGURES, first_figure
from experiments.rows import COMPARISONS, OUR_COMPARISONS, ROWS
from pipelines.atomic import FileKind, OutputError, check_output_file

TOLERANCE = 0.002  # rerun.py's "the same"
COMPARISON = FileKind("an earlier comparison (JSON with claims)", "json", "claims")  # what --json may replace


def profile_view(ledger: Ledger, profile: str) -> Ledger:
    """`ledger` with only its run records of `profile` (each row's figures then come from that profile)."""
    view = copy.copy(ledger)
    view.records = {
        k: r for k, r in ledger.records.items() if is_run_record(k, r) and r.get("profile", "hour") == profile
    }
    return view


def plan_shape(record: dict) -> str:
    """A record's plan (its commands and recipe) without the results' folder it ran under (`--out`, which its
    commands name: out/results here, B/out there)."""
    text = json.dumps(record.get("plan"), sort_keys=True)
    out = re.search(r"--data (\S+)/data/", " ".join((record.get("plan") or {}).get("commands", [])))
    return text.replace(out.group(1) + "/", "OUT/") if out else text


def drop_other_plans(a: Ledger, b: Ledger) -> list[str]:
    """Leave out of both views the runs recorded under another plan in each (other commands or recipe): not the same
    runs. Their keys."""
    other = sorted(k for k in set(a.records) & set(b.records) if plan_shape(a.records[k]) != plan_shape(b.records[k]))
    for key in other:
        del a.records[key], b.records[key]
    return other


def keep_common(a: Ledger, b: Ledger) -> tuple[int, int]:
    """Leave in both views only the runs both hold, so that rows and claims are computed over the same seeds (a
    ledger still filling, a row run with fewer seeds elsewhere); how many each lost."""
    common = set(a.records) & set(b.records)
    lost = len(a.records) - len(common), len(b.records) - len(common)
    a.records = {k: r for k, r in a.records.items() if k in common}
    b.records = {k: r for k, r in b.records.items() if k in common}
    return lost


def figure_of(record: dict) -> tuple[str, float] | None:
    name = first_figure(record["test"])
    return (name, float(record["test"][name])) if name else None


def word_vectors(record: dict) -> dict[str, str]:
    """The sha256 of the word vectors a run read, by their path below the results' folder (`data/KEY/...`). Not the
    data's manifest: it names the folders it was written to, so two machines' differ whatever their shards."""
    return {
        "data/" + path.split("/data/", 1)[-1]: digest
        for path, digest in (record.get("inputs_sha256") or {}).items()
        if path.endswith(".npy")
    }


def compare_runs(a: Ledger, b: Ledger) -> list[dict]:
    """Each run both hold: its figure in each, their difference, and whether both read the same word vectors."""
    runs = []
    for key in sorted(set(a.records) & set(b.records)):
        ra, rb = a.records[key], b.records[key]
        fa, fb = figure_of(ra), figure_of(rb)
        vectors = word_vectors(ra)
        if fa is None or fb is None or fa[0] != fb[0]:
            continue
        runs.append(
            {
                "run": key,
                "row": ra["row"],
                "figure": fa[0],
                "a": fa[1],
                "b": fb[1],
                "difference": fb[1] - fa[1],
                # None: it read no word vectors (an encoder row), or its record predates their sha256
                "same_vectors": (vectors == word_vectors(rb)) if vectors else None,
            }
        )
    return runs


def compare_rows(a: Ledger, b: Ledger) -> list[dict]:
    rows = []
    for row in ROWS:
        fa, fb = row_figures(row, a), row_figures(row, b)
        metric = next((m for m in PRIMARY_FIGURES if m in fa and m in fb), None)
        if metric:
            rows.append(
                {"row": row.id, "metric": metric, "a": fa[metric][0], "b": fb[metric][0], "seeds": fa[metric][2]}
            )
    return rows


def compare_claims(a: Ledger, b: Ledger) -> list[dict]:
    by_id = {r.id: r for r in ROWS}
    ours_only = {c[0] for c in OUR_COMPARISONS}
    claims = []
    for what, with_id, without_id, metric in COMPARISONS + OUR_COMPARISONS:
        with_row, without_row = by_id[with_id], by_id[without_id]
        paper = paper_difference(with_row, without_row, metric, what in ours_only)
        judged = [claim_cells(with_row, without_row, ledger, metric, paper, True) for ledger in (a, b)]
        if any(verdict == "not run" for _, verdict in judged):
            continue
        claims.append(
            {
                "claim": what,
                "metric": metric,
                "a": judged[0][0],
                "a_verdict": judged[0][1],
                "b": judged[1][0],
                "b_verdict": judged[1][1],
                "same_verdict": judged[0][1] == judged[1][1],
            }
        )
    return claims


def report(runs: list[dict], rows: list[dict], claims: list[dict], names: tuple[str, str]) -> list[str]:
    a, b = names
    identical = sum(r["difference"] == 0 for r in runs)
    close = sum(abs(r["difference"]) <= TOLERANCE for r in runs)
    vectors = [r for r in runs if r["same_vectors"] is not None]
    same_vectors = [r for r in vectors if r["same_vectors"]]
    lines = [
        f"A: {a}",
        f"B: {b}",
        "",
        f"{len(runs)} runs in both: {identical} the same figure to the last bit, {close} within {TOLERANCE}; "
        f"of the {len(vectors)} that read word vectors, {len(same_vectors)} read the same in both "
        f"({sum(r['difference'] == 0 for r in same_vectors)} of those the same figure, "
        f"{sum(r['difference'] == 0 for r in vectors) - sum(r['difference'] == 0 for r in same_vectors)} of the "
        "others)",
    ]
    if runs:
        largest = max(runs, key=lambda r: abs(r["difference"]))
        lines.append(f"largest difference: {largest['run']} {largest['figure']} {largest['difference']:+.4f}")
    lines += ["", "| row | metric | seeds | A | B | B - A |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['row']} | {r['metric']} | {r['seeds']} | {r['a']:.4f} | {r['b']:.4f} | {r['b'] - r['a']:+.4f} |"
        )
    lines += [
        "",
        f"{sum(c['same_verdict'] for c in claims)} of {len(claims)} claims judged alike:",
        "",
        "| claim | metric | A | A's verdict | B | B's verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in claims:
        mark = "" if c["same_verdict"] else " **(differs)**"
        lines.append(
            f"| {c['claim']} | {c['metric']} | {c['a']} | {c['a_verdict']} | {c['b']} | {c['b_verdict']}{mark} |"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="a ledger (e.g. docs/results/ledger.json)")
    p.add_argument("b", help="another ledger of the same plan, run elsewhere")
    p.add_argument("--profile", default="hour", choices=("hour", "full"), help="the records compared (default: hour)")
    p.add_argument("--json", help="also write the comparison to this file")
    args = p.parse_args(argv)
    for path in (args.a, args.b):
        if not os.path.isfile(path):
            p.error(f"{path}: no such ledger")
    if os.path.realpath(args.a) == os.path.realpath(args.b):
        p.error(f"{args.b}: the same ledger as {args.a}")
    if args.json:
        try:
            check_output_file(args.json, inputs=(args.a, args.b), option="--json", kind=COMPARISON)
        except OutputError as error:
            p.error(str(error))
    try:  # each names its file: not JSON (the page given as a ledger), or per-question figures not beside it
        ledgers = [Ledger(path) for path in (args.a, args.b)]
    except (OSError, ValueError) as error:
        p.error(str(error))
    a, b = (profile_view(ledger, args.profile) for ledger in ledgers)
    other_plans = drop_other_plans(a, b)
    only_a, only_b = keep_common(a, b)
    runs, rows, claims = compare_runs(a, b), compare_rows(a, b), compare_claims(a, b)
    if other_plans:
        print(f"left out, recorded under another plan in each: {', '.join(other_plans)}")
    if only_a or only_b:
        print(f"left out, in one ledger only: {only_a} runs of A, {only_b} of B")
    print("\n".join(report(runs, rows, claims, (args.a, args.b))))
    if args.json:
        staged = f"{args.json}.partial-{os.getpid()}"
        with open(staged, "w") as f:
            json.dump(
                {
                    "profile": args.profile,
                    "a": args.a,
                    "b": args.b,
                    "other_plans": other_plans,
                    "only_in_a": only_a,
                    "only_in_b": only_b,
                    "runs": runs,
                    "rows": rows,
                    "claims": claims,
                },
                f,
                indent=1,
            )
            f.write("\n")
        os.replace(staged, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reproduce the papers where the data is here, and write the report: docs/results.md with its plots.

    python experiments/results.py [--profile full|hour] [--out out/results] [--ledger docs/results/ledger.json]
        [--report docs/results.md] [--seeds 0,1,2] [--lanes 2] [--only PATTERN] [--skip-efficiency]
        [--report-only] [--prepare-only] [--dry-run]

Every figure in the report comes from a command this script ran and records beside it: the data preparation
(jobs/tokenize_corpora.py, jobs/word_vectors.py, jobs/build_stackexchangeqa.py), then for each row of the plan
(`ROWS`) and each seed `python jobs/train.py ... --test-split test` (the job scores its best checkpoint on the
row's test split, as `jobs/evaluate.py` would, without a second process loading torch), or `python
jobs/zero_shot.py ...` for the zero-shot bi-encoder, and `python bench/encoders.py` for the efficiency plots.
The commands run as they are written, as subprocesses, joined to one local Ray instance that this script starts
(RAY_ADDRESS), `--lanes` runs at a time with one CPU per training worker, so a run does not pay for Ray's
start-up.

Two profiles: `full` trains every answer-selection row with its paper's recipe until dev MAP stops improving (a
word-vector model at most 25 epochs of all the training pairs with a patience of 5, CTRN's TrecQA recipe; a
pretrained encoder at most 10 with a patience of 2), three seeds for the WikiQA headline rows; `hour` is the plan
meant to regenerate within an hour on this project's CI machine (2 cores, no GPU), each row with the fewest steps
that still learn (the report gives the time the last complete invocation took). Each run's record (commands, the
recipe they resolve to, seed, resolved configuration, dev and test figures, the sha256 of the checkpoint it scored,
seconds, commit) goes into the ledger as it finishes. The ledger is committed beside the report
(docs/results/ledger.json; checkpoints stay in OUT), so a report resumes on any machine: a run whose record is
missing, or was made under another plan (a changed command or recipe), runs again, and nothing else does (nor
is any data prepared that no such run reads); --report-only rewrites the report from the ledger. The papers'
figures are quoted in `experiments/rows.py` (`ROWS`) with their table; missing data sets are listed there in
`MISSING`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

if __package__ in (None, ""):  # run as `python experiments/results.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.ledger import Ledger
from experiments.machine import git_commit, machine_description
from experiments.plan import REPO, SEEDS, data_steps, runs_of, say, shown
from experiments.report import report_refusal, report_rows, write_report
from experiments.rows import FULL_ENCODER_EPOCHS, FULL_EPOCHS
from experiments.runner import (
    EFFICIENCY,
    commands,
    data_needed,
    data_to_prepare,
    due_runs,
    efficiency_recorded,
    missing_inputs,
    prepare_all,
    run_all,
    run_efficiency,
    selected_rows,
    steps_to_run,
    unmatched_patterns,
)
from runtime.checks import LARGEST_SEED


def seeds_option(text: str, error) -> tuple[int, ...]:
    """--seeds as a tuple, or `error` called: whole numbers from 0, each once (`0,0` ran two lanes training one
    run's folder at once)."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        seeds = ()
    if not seeds or len(set(seeds)) < len(seeds) or not all(0 <= s <= LARGEST_SEED for s in seeds):
        error(f"--seeds {text!r}: comma-separated whole numbers from 0, each once (e.g. 0,1,2)")
    return seeds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--profile",
        default="full",
        choices=["full", "hour"],
        help="full (default): every answer-selection row with its paper's recipe until dev MAP stops "
        f"improving (at most {FULL_EPOCHS} epochs, {FULL_ENCODER_EPOCHS} for a pretrained encoder); hour: the plan "
        "meant to regenerate within an hour (the report gives the time it last took)",
    )
    p.add_argument("--out", default=os.path.join(REPO, "out", "results"), help="data, runs, checkpoints and logs")
    p.add_argument(
        "--ledger",
        default=os.path.join(REPO, "docs", "results", "ledger.json"),
        help="the run ledger the report is written from (committed beside it)",
    )
    p.add_argument("--report", default=os.path.join(REPO, "docs", "results.md"), help="the report to write")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds of every multi-seed row")
    p.add_argument(
        "--lanes",
        type=int,
        default=2,
        help="runs at a time, one CPU each (more lanes than cores only slows every run down)",
    )
    p.add_argument("--all", action="store_true", help="also the rows left out of the hour's plan (see MISSING)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="rows whose id matches (fnmatch, e.g. 'wikiqa/*'); repeatable; rows they fine-tune from are added",
    )
    p.add_argument(
        "--use-gpu",
        action="store_true",
        help="train on this machine's GPU, the lanes sharing it (each "
        "run's record names its device; the plan is unchanged)",
    )
    p.add_argument("--skip-efficiency", action="store_true", help="leave out bench/encoders.py")
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run from a working tree with uncommitted changes (its records' commit ends in -dirty and the page "
        "marks their rows); without it such a tree is refused, since no commit would hold the code that ran",
    )
    p.add_argument(
        "--retest",
        action="store_true",
        help="also run again the selected runs recorded without per-question figures, without the sha256 of "
        "what they read or (on a CPU) without the CPU they ran on (before each was kept), so that their rows get a "
        "95%% interval, their claims a paired test, and experiments/rerun.py can check them on their own kind of "
        "device; and the runs that read other data or word vectors than this machine's data steps wrote, so that a "
        "row never sets runs on other data against each other. Only runs recorded on this invocation's kind of "
        "device (a GPU with --use-gpu, else CPUs)",
    )
    p.add_argument(
        "--to-this-device",
        action="store_true",
        help="also run again, on this invocation's kind of device (a GPU with --use-gpu, else CPUs), the selected "
        "runs recorded on the other kind, so that rows a claim sets side by side trained alike: the page compares no "
        "rows whose runs trained in other precisions or on other kinds of device. Needs --only (rows they fine-tune "
        "from are added, and run again with them)",
    )
    only = p.add_mutually_exclusive_group()
    only.add_argument("--report-only", action="store_true", help="rewrite the report from the ledger, run nothing")
    only.add_argument(
        "--prepare-only",
        action="store_true",
        help="prepare the data the selected rows read, whether or not their runs are recorded, and run nothing: the "
        "tokenised shards for a machine that will run them (infra/offline_gpu/prepare.sh packs them for a GPU node)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the commands of the selected rows, their data steps and the efficiency benchmark, each marked "
        "with whether it is done (its output prepared, its record in the ledger), and exit",
    )
    args = p.parse_args(argv)
    refusal = report_refusal(args.report, args.ledger)
    if refusal:
        p.error(refusal)
    if not (args.report_only or args.dry_run or args.allow_dirty) and git_commit().endswith("-dirty"):
        p.error(
            "the working tree has uncommitted changes: commit them so that each record names the code it ran "
            "from, or pass --allow-dirty (the page marks such rows)"
        )
    out = os.path.abspath(args.out)
    if not os.path.relpath(out, REPO).startswith(".."):  # commands run from the repository: shorter, portable
        out = os.path.relpath(out, REPO)
    seeds = seeds_option(args.seeds, p.error)
    if args.lanes < 1:
        p.error(f"--lanes must be at least 1, got {args.lanes}")
    if args.use_gpu and not (args.report_only or args.prepare_only):  # each run's train.py would refuse it
        from runtime.checks import UsageError
        from runtime.ray_env import check_fits_local_ray

        try:
            check_fits_local_ray(
                "--use-gpu", unit="training run", options="--lanes runs share it", gpus=round(1 / args.lanes, 3)
            )
        except UsageError as error:
            p.error(str(error))
    if args.to_this_device and not args.only:
        p.error("--to-this-device needs --only: name the rows to run again on this kind of device")
    unmatched = unmatched_patterns(args.only, args.profile)
    if unmatched:
        p.error(
            f"--only {unmatched[0]!r}: matches no row of the {args.profile} profile (rows are named like "
            "'wikiqa/gsamn'; --dry-run --all lists every command)"
        )
    rows = selected_rows(args.only, args.all, args.profile)
    os.makedirs(os.path.dirname(os.path.abspath(args.ledger)), exist_ok=True)
    try:
        ledger = Ledger(args.ledger)
    except (OSError, ValueError) as error:  # not JSON (the report named as --ledger), a per-question file lost
        p.error(f"--ledger {error}")
    if args.prepare_only:  # every selected row's data, whether or not its runs are recorded
        needed = data_needed(rows, args.profile)
    else:
        # every selected row's data where runs may run again for what is found in their records
        needed = data_to_prepare(rows, seeds, out, args.profile, ledger, every_row=args.retest or args.to_this_device)
    if args.dry_run:  # what this invocation would run, and what it would find done
        prepared = steps_to_run(out, needed)  # what prepare_data would run: the same test of a step's output
        for step in data_steps(out):
            if step.key in needed:
                print(("" if step in prepared else "# prepared: ") + shown(step.argv))
        if args.prepare_only:
            return 0
        due = due_runs(rows, seeds, out, args.profile, ledger, args.retest, args.use_gpu, args.to_this_device)
        for run in runs_of(rows, args.profile, seeds):
            for argv in commands(run.row, run.seed, out, args.profile):
                print(("" if run in due else "# recorded: ") + shown(argv))
        if not args.skip_efficiency:
            efficiency = shown(EFFICIENCY + ["--json", os.path.join(out, "encoders.json")])
            print(("# recorded: " if efficiency_recorded(ledger) else "") + efficiency)
        return 0
    os.makedirs(out, exist_ok=True)
    if not args.report_only:
        missing = missing_inputs(needed, out)
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise SystemExit(
                f"{missing[0]} not found{more}: the data steps still to run read ../shared/data (or QA_SHARED_DATA)"
            )
        if args.prepare_only:
            seconds = prepare_all(needed, out, args.lanes, ledger)
            say(f"the data of {len(rows)} rows is under {os.path.join(out, 'data')} ({seconds:.0f} s); nothing run")
            return 0
        started = time.time()
        invocation = run_all(
            rows, seeds, out, args.lanes, ledger, needed, args.profile, args.use_gpu, args.retest, args.to_this_device
        )
        efficiency_seconds = 0.0 if args.skip_efficiency else run_efficiency(out, ledger)
        if not (args.only or args.all):  # the profile's whole plan: timed only by an invocation that ran every run
            if invocation.whole_plan:
                timed = [run.name for run in runs_of(rows, args.profile, seeds)]
                ledger.add(
                    f"meta:{args.profile}",
                    {
                        "profile": args.profile,
                        "commit": git_commit(),
                        "wall_s": round(time.time() - started, 1),
                        "data_wall_s": round(invocation.data_seconds, 1),
                        "efficiency_s": round(efficiency_seconds, 1),
                        "lanes": args.lanes,
                        "runs": sorted(timed),  # what it timed: a later plan's page says the time is not its
                        "finished": datetime.date.today().isoformat(),
                        "machine": machine_description(args.use_gpu),
                    },
                )
            else:
                print(
                    f"{invocation.runs_done} of the plan's {invocation.runs_planned} runs ran in this invocation "
                    "(the others were recorded already): the report keeps the wall time of the last invocation "
                    "that ran them all"
                )
    write_report(report_rows(ledger), ledger, out, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

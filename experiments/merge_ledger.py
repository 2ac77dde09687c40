"""Merge the run records of another results ledger into this one: runs made in another clone or on another machine.

    python experiments/merge_ledger.py OTHER_LEDGER [--ledger docs/results/ledger.json] [--dry-run]

Rows fill in as machines allow: a clean clone running rows beside the working one, a GPU node given the tokenised
shards (infra/offline_gpu/), a colleague's run. Each brings back its copy of the ledger (with its per-question files
beside it, `ledger-questions/`); this puts its runs into the committed ledger, then `results.py --report-only`
rewrites the page.

A run record of OTHER_LEDGER is taken where this ledger has none under its key, where it re-ran this ledger's record
(its `replaces` names that record's commit and day), or where it ran from a later commit than this ledger's record
(this ledger's commit an ancestor of its commit in this repository: a record from uncommitted code gives way to one
from its commit). Left, each with its reason: a record from uncommitted code (no commit holds what it ran; run it
again from a clean tree), one from a commit this repository lacks (fetch it first: its order cannot be told), one no
later than this ledger's. The other entries (data steps' times, re-run checks, plan timings) are taken only where
this ledger lacks them; a `replaced:` entry (a re-run cut off before its record) is never taken. Each taken record
is printed with the figure it replaces; `--dry-run` prints the same and writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

if __package__ in (None, ""):  # run as `python experiments/merge_ledger.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.ledger import Ledger
from experiments.plan import REPO
from experiments.report import is_run_record
from experiments.rerun import PRIMARY_FIGURES  # the figure printed beside a taken record: its first one


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the merge does with one entry of the other ledger, and why (printed)."""

    take: bool
    why: str


def known(commit: str, repo: str = REPO) -> bool:
    """Whether `repo`'s history holds `commit`."""
    found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo, capture_output=True)
    return found.returncode == 0


def is_ancestor(older: str, newer: str, repo: str = REPO) -> bool:
    """Whether commit `older` is an ancestor of `newer` (or is it) in `repo`'s history; False where either is not
    there."""
    found = subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=repo, capture_output=True)
    return found.returncode == 0


def judge(key: str, theirs, ours, repo: str = REPO) -> Verdict:
    """Whether `theirs` (the other ledger's entry under `key`) replaces `ours` (this ledger's, or None)."""
    if ours == theirs:
        return Verdict(False, "the same")
    if key.startswith("replaced:"):
        return Verdict(False, "a re-run not finished there (its earlier record set aside): not taken")
    if not is_run_record(key, theirs):
        return Verdict(ours is None, "not here" if ours is None else "another entry here: kept")
    commit = str(theirs.get("commit", ""))
    if commit.endswith("-dirty") or not commit:
        return Verdict(False, f"from uncommitted code ({commit or 'no commit'}): run it again from a clean tree")
    if not known(commit, repo):
        return Verdict(False, f"its commit {commit} is not in this repository: fetch it first")
    if ours is None:
        return Verdict(True, "not here")
    replaced = theirs.get("replaces") or {}
    if replaced.get("commit") == ours.get("commit") and replaced.get("finished") == ours.get("finished"):
        return Verdict(True, f"re-ran the record here ({ours.get('commit')})")
    our_commit = str(ours.get("commit", "")).removesuffix("-dirty")
    if our_commit != commit and is_ancestor(our_commit, commit, repo):
        return Verdict(True, f"from a later commit than the record here ({ours.get('commit')})")
    if str(ours.get("commit", "")).endswith("-dirty") and our_commit == commit:
        return Verdict(True, f"from the commit of the record here ({ours.get('commit')})")
    return Verdict(False, f"no later than the record here ({ours.get('commit')}): kept")


def figure(record: dict | None) -> str:
    test = (record or {}).get("test") or {}
    name = next((name for name in PRIMARY_FIGURES if name in test), None)
    return "-" if name is None else f"{name} {test[name]:.4f}"


def merge(other: Ledger, ledger: Ledger, dry_run: bool = False, repo: str = REPO) -> dict[str, list[str]]:
    """Each entry of `other` judged against `ledger` and taken where `judge` says so (unless `dry_run`); returns the
    keys by what was done: "taken", and "left: WHY" for each reason an entry was left."""
    done: dict[str, list[str]] = {}
    for key, theirs in sorted(other.records.items()):
        ours = ledger.records.get(key)
        verdict = judge(key, theirs, ours, repo)
        if verdict.why == "the same":
            continue
        if verdict.take:
            print(
                f"taken: {key}: {verdict.why}"
                + (f"; {figure(ours)} -> {figure(theirs)}" if is_run_record(key, theirs) else "")
            )
            if not dry_run:
                ledger.add(key, theirs)
            done.setdefault("taken", []).append(key)
        else:
            print(f"left: {key}: {verdict.why}")
            done.setdefault(f"left: {verdict.why}", []).append(key)
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("other", metavar="OTHER_LEDGER", help="the ledger.json of the clone or machine whose runs to take")
    p.add_argument(
        "--ledger",
        default=os.path.join(REPO, "docs", "results", "ledger.json"),
        help="the ledger to merge into (the committed one by default)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be taken and left, write nothing")
    args = p.parse_args(argv)
    if not os.path.isfile(args.other):
        p.error(f"{args.other}: no such ledger")
    if os.path.realpath(args.other) == os.path.realpath(args.ledger):
        p.error(f"{args.other} is the ledger merged into")
    try:  # each names its file: not JSON, or a record naming per-question figures that are not beside it
        other, ledger = Ledger(args.other), Ledger(args.ledger)
    except (OSError, ValueError) as error:
        p.error(str(error))
    done = merge(other, ledger, args.dry_run)
    counts = ", ".join(f"{len(keys)} {what}" for what, keys in sorted(done.items())) or "nothing new"
    print(f"{'would merge' if args.dry_run else 'merged'} into {args.ledger}: {counts}")
    if done.get("taken") and not args.dry_run:
        print("then: python experiments/results.py --report-only (from a clean tree)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

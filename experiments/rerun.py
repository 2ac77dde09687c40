"""Re-run one record of the results ledger from what it stored, and say whether its figures come back.

    python experiments/rerun.py (--record RUN | --pick-random [--seed N] [--max-seconds S])
        [--ledger docs/results/ledger.json] [--out out/rerun] [--tolerance 0.002]

A reviewer's check of the results page. The record's own argument lists (`argv`: every option, device options
included) run again from the code of the commit the record names, extracted with `git archive` into OUT (the working
tree is left alone and need not be clean), from the repository root, so that the data paths it names
(`out/results/data/...`) are the ones it read, on a Ray instance of its own. Only where the run writes moves, into
OUT (`--storage-path`, `--test-output`, `--output`): the recorded run's checkpoint stays as it was. A fine-tuning
run's starting checkpoint must be here with the sha256 its record names (re-run its source first otherwise), and
so must the data manifest and word vectors it read (`inputs_sha256`, where its record keeps them; a manifest by its
content without the folders it names, so that data built here from ../shared/data at another path than the record's
machine had counts as the same, and so do a copy of the data carried to a GPU machine and the build it was carried
from: `runner.data_identity`); data the run reads and this machine lacks is prepared first by the data steps of
`experiments/results.py`.

Refused before any work: a record from uncommitted code (no commit holds what it ran), a commit this clone lacks,
a GPU record where no GPU is (the same device kind), a CPU record that names another kind of CPU than this one
(processor and torch's vector kernels: other kernels round differently in the last bits, and training amplifies
that; `--other-cpu` runs it anyway), an OUT that holds one of the run's inputs or is the results' OUT.
`--pick-random` draws among the records that can re-run here (those, and at most --max-seconds recorded), with the
seed it prints, so a draw can be repeated.

The re-run's test figures are set against the record's: the same within --tolerance on the record's first figure
(MAP for answer selection, F1 for reading comprehension, accuracy for multiple choice); also whether the scored
checkpoint holds the same weights, bit for bit: by the record's `weights_sha256` (the scored weights by content),
or for a record made before it kept that, where the recorded checkpoint is here. The check goes into the ledger as
`rerun:RUN` (the page lists it; earlier checks of the same record are kept in it, under `earlier`) and is printed
as one JSON line; the exit status is 1 when the figures differ.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import difflib
import functools
import io
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping

if __package__ in (None, ""):  # run as `python experiments/rerun.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.ledger import Ledger
from experiments.machine import cpu_kind, cpu_mismatch, describe_cpu, device_name, git_commit, trained_on_gpu
from experiments.plan import REPO, say
from experiments.report import run_records
from experiments.rows import ROWS
from experiments.runner import changed_inputs, data_identities, data_needed, known_by_bytes_only, prepare_data, run_job

# The options of the ledger's commands that name what a run writes, and where a re-run writes instead.
OUTPUT_OPTIONS = {"--storage-path": "runs", "--test-output": "predictions", "--output": "predictions"}
INPUT_OPTIONS = ("--data", "--init-from", "--embeddings")
PRIMARY_FIGURES = ("map", "f1", "accuracy")  # the first of these a record's test figures hold is its figure


class RerunRefused(SystemExit):
    """A record that cannot re-run here, with the one line that says why."""

    def __init__(self, message: str):
        super().__init__(f"rerun: {message}")


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]


def redirected(argv: list[str], scratch: str, name: str) -> list[str]:
    """`argv` with what it writes (OUTPUT_OPTIONS) moved under `scratch`: its run folders to scratch/runs, a
    predictions file to scratch/predictions/NAME.jsonl. Every other argument is as recorded."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in OUTPUT_OPTIONS:
            folder = os.path.join(scratch, OUTPUT_OPTIONS[arg])
            out[i + 1] = folder if arg == "--storage-path" else os.path.join(folder, name + ".jsonl")
    return out


def out_as_named(scratch: str) -> str:
    """The re-run's OUT as its check names it: relative to the repository where it lies inside (out/rerun), else
    "OUT", so that the ledger and the page hold no machine's absolute path."""
    relative = os.path.relpath(os.path.abspath(scratch), REPO)
    return relative if not relative.startswith("..") else "OUT"


def first_figure(test: dict) -> str | None:
    """The first of PRIMARY_FIGURES that a record's test figures hold, or None."""
    return next((m for m in PRIMARY_FIGURES if isinstance(test.get(m), (int, float))), None)


def primary_figure(test: dict) -> str:
    figure = first_figure(test)
    if figure is None:
        raise RerunRefused(f"the record's test figures ({sorted(test)}) hold none of {', '.join(PRIMARY_FIGURES)}")
    return figure


def is_gpu_record(record: dict) -> bool:
    """Whether a record's run trained on a GPU, by its `device` or, for a record older than that field, by the
    `--use-gpu` its argument lists carry."""
    return trained_on_gpu(record) or any("--use-gpu" in a for a in record.get("argv", []))


def why_not_here(name: str, record: dict, gpu_here: bool, commit_known, cpu_here: dict | None = None) -> str | None:
    """Why the run record `name` cannot re-run on this machine, or None. With `cpu_here`, a CPU record that names
    another kind of CPU is one (records made before they named it are not)."""
    found = not_here(name, record, gpu_here, commit_known, cpu_here)
    return found[1] if found else None


def not_here(
    name: str, record: dict, gpu_here: bool, commit_known, cpu_here: dict | None = None
) -> tuple[str, str] | None:
    """`why_not_here` with the kind of reason first (a key of NOT_HERE), so that a draw can count them."""
    if "test" not in record:
        return "not a run", f"{name}: not a run record with test figures"
    if "argv" not in record:  # its `commands` may lack the device options it ran with
        return (
            "no argv",
            f"{name}: recorded before records kept the argument lists that ran (argv); re-run its row first",
        )
    commit = str(record.get("commit", ""))
    if commit.endswith("-dirty") or commit in ("", "unknown"):
        return "uncommitted", f"{name}: ran from uncommitted code (commit {commit or '?'}); no commit holds what it ran"
    if not commit_known(commit):
        return "commit missing", f"{name}: its commit {commit} is not in this clone (fetch it first)"
    if is_gpu_record(record) and not gpu_here:
        device = record.get("device", "a GPU")
        return "gpu", f"{name}: ran on {device}; it re-runs on the same kind of device, and none is here"
    if cpu_here and not is_gpu_record(record) and record.get("cpu") and record["cpu"] != cpu_here:
        return "other cpu", (
            f"{name}: ran on {describe_cpu(record['cpu'])}; a CPU record re-runs to its figures on the same kind of "
            f"CPU, and this is {describe_cpu(cpu_here)} (--other-cpu runs it anyway"
            + (
                f"; ATEN_CPU_CAPABILITY={record['cpu']['kernels'].lower()} selects its kernels here)"
                if record["cpu"].get("processor") == cpu_here.get("processor")
                else ")"
            )
        )
    return None


# How a draw that finds no record says why, by kind of reason: (how the count reads, what to do about it).
NOT_HERE = {
    "other cpu": ("ran on another kind of CPU", "--other-cpu draws among them too"),
    "gpu": ("ran on a GPU", "they re-run on a machine with one"),
    "uncommitted": ("ran from uncommitted code", "results.py re-runs their rows from a clean tree"),
    "commit missing": ("name a commit this clone lacks", "fetch it"),
    "no argv": ("predate argument lists", "results.py --retest re-runs their rows"),
    "longer": ("took longer than --max-seconds", "raise it"),
    "not a run": ("hold no test figures", "nothing to re-run"),
    "source missing": ("start from a checkpoint that is not here", "re-run their source record first"),
    "inputs differ": ("read data or word vectors that differ here", "see `rerun.py --record RUN`"),
}


def nothing_to_draw(counts: dict[str, int], other_cpus: list[dict], cpu_here: dict | None) -> str:
    """The one line of a draw that found no record: how many run records, and how many for each reason."""
    parts = []
    for kind, (reads, remedy) in NOT_HERE.items():
        if counts.get(kind):
            if kind == "other cpu" and cpu_here:
                kinds = "; ".join(describe_cpu(cpu) for cpu in other_cpus)
                reads += f" ({kinds}; this is {describe_cpu(cpu_here)})"
            parts.append(f"{counts[kind]} {reads}: {remedy}")
    return f"no record of the ledger can re-run here, of {sum(counts.values())} run records: " + "; ".join(parts)


def source_checkpoint_problem(name: str, record: dict) -> str | None:
    """Why a fine-tuning record's starting checkpoint is not the one it started from here, or None."""
    from pipelines.shards import sha256_file
    from training.checkpoints import STATE_FILE, resolve_checkpoint

    for argv in record["argv"]:
        for source in option_values(argv, "--init-from"):
            try:
                checkpoint = resolve_checkpoint(os.path.join(REPO, source), "best")
            except (OSError, ValueError) as error:  # a missing or unreadable run folder: say which
                return f"{name}: starts from {source}, which is not here ({error})"
            recorded = record.get("init_checkpoint_sha256")
            if recorded and sha256_file(os.path.join(checkpoint, STATE_FILE)) != recorded:
                return (
                    f"{name}: starts from {source}, whose best checkpoint here is not the one it fine-tuned "
                    "(sha256 differs); re-run the source record first"
                )
    return None


@functools.cache
def _sha256(path: str) -> str:
    from pipelines.shards import sha256_file

    return sha256_file(path)


def inputs_problem(
    name: str, record: dict, cpu_here: dict | None = None, known: Mapping[str, str] | None = None
) -> str | None:
    """Why a file the record read (`inputs_sha256`: its data's manifest, its word vectors) is here with other
    content than it read, or None: the same rows count, where the record or this machine read a carried copy or a
    manifest built from folders at other paths (`runner.changed_inputs`, `known` from the ledger). A file not here
    is prepared by the data steps first, and checked again then.
    With `cpu_here`, a CPU record of another kind of CPU (or of none named) says that may be the cause: the data
    steps' fastText vectors are other bytes where OpenBLAS ran other kernels (measured: SQuAD's and TrecQA's, AMD
    EPYC family 25 model 1 against model 17), though the tokenised data is the same; the data step pins them by
    instruction set (runtime/blas.py), so the kernels the vectors here ran on are named where they are known. A
    manifest the ledger knows only by its bytes (no record or data step named it path-free) may also have been
    built from the shared data at another absolute path than the record's machine had (the manifest keeps it,
    `config.input`): the refusal names the one here."""
    changed = changed_inputs(record, _sha256, known)
    if not changed:
        return None
    cause = "its data step ran again since"
    other = cpu_here and not is_gpu_record(record) and record.get("cpu") != cpu_here
    if other and changed[0].endswith("embeddings.npy"):
        cause += (
            f", or ran on the record's kind of CPU ({describe_cpu(record.get('cpu'))}) and here on "
            f"{describe_cpu(cpu_here)}: word vectors trained on another kind of CPU are other bytes where OpenBLAS "
            f"ran other kernels (pinned by instruction set: SkylakeX with AVX-512, Haswell with AVX2 alone"
            f"{vectors_kernels(changed[0])})"
        )
    built_from = manifest_input(changed[0]) if known_by_bytes_only(record, changed[0], known) else None
    if built_from:
        cause += (
            f", or ran from another folder here than on the record's machine: a manifest keeps the absolute path of "
            f"the data it was built from (here {built_from}), and the ledger knows the record's only by its bytes "
            f"(no data step or record named it without its paths), so the same rows built from elsewhere look other"
        )
    return (
        f"{name}: read {changed[0]} with sha256 {record['inputs_sha256'][changed[0]][:12]}, and the file here differs "
        f"({cause}): a re-run would not test the record"
    )


def manifest_input(path: str) -> str | None:
    """The input folder a tokenised folder's manifest says it was built from (`config.input`), or None (not a
    manifest, or none named)."""
    from pipelines.shards import read_manifest

    if not path.endswith("manifest.json"):
        return None
    try:
        config = read_manifest(os.path.dirname(os.path.join(REPO, path))).get("config")
    except (OSError, ValueError):  # missing, damaged or not a manifest: read_manifest's refusals
        return None
    built_from = config.get("input") if isinstance(config, dict) else None
    return built_from if isinstance(built_from, str) else None


def vectors_kernels(vectors: str) -> str:
    """ "; here KERNELS" where the statistics beside a vectors file name the OpenBLAS kernels it trained on."""
    try:
        with open(vectors[: -len(".npy")] + ".json") as f:
            kernels = json.load(f).get("blas_kernels") or {}
    except (OSError, ValueError):
        return ""
    names = sorted(set(kernels.values()))
    return f"; here {', '.join(names)}" if names else ""


def with_earlier_checks(check: dict, before: dict | None) -> dict:
    """The check to record, keeping the ones of the same record before it (`earlier`, oldest first): a check on
    another kind of CPU, or of a record since replaced, does not erase what an earlier one showed."""
    if not before:
        return check
    earlier = [*before.get("earlier", []), {k: v for k, v in before.items() if k != "earlier"}]
    return dict(check, earlier=earlier)


def commit_in_clone(commit: str) -> bool:
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return found.returncode == 0


def cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


def pick(ledger: Ledger, seed: int, max_seconds: float | None, cpu_here: dict | None = None) -> tuple[str, int]:
    """A record drawn with `seed` among those that can re-run here (with `cpu_here`, only CPU records of that kind
    of CPU or of none named); (its name, how many could). None can: the refusal counts why, by kind."""
    gpu = cuda_here()
    eligible: list[str] = []
    counts: collections.Counter[str] = collections.Counter()
    other_cpus: list[dict] = []
    known = data_identities(ledger.records.values())
    for name, record in sorted(run_records(ledger).items()):
        found = not_here(name, record, gpu, commit_in_clone, cpu_here)
        if found is None and max_seconds is not None and float(record.get("seconds", 0)) > max_seconds:
            found = "longer", ""
        if found is None and source_checkpoint_problem(name, record) is not None:
            found = "source missing", ""
        if found is None and inputs_problem(name, record, known=known) is not None:
            found = "inputs differ", ""
        if found is None:
            eligible.append(name)
        else:
            counts[found[0]] += 1
            if found[0] == "other cpu" and record["cpu"] not in other_cpus:
                other_cpus.append(record["cpu"])
    if not eligible:
        raise RerunRefused(nothing_to_draw(counts, other_cpus, cpu_here))
    return random.Random(seed).choice(eligible), len(eligible)


def extract_code(commit: str, scratch: str) -> str:
    """The tracked files of `commit`, as `git archive` gives them, in scratch/code-COMMIT (made once, whole)."""
    code = os.path.join(scratch, f"code-{commit}")
    if os.path.isdir(code):
        return code
    os.makedirs(scratch, exist_ok=True)
    staged = tempfile.mkdtemp(prefix=f".code-{commit}-", dir=scratch)
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(staged, filter="data")
    os.replace(staged, code)
    return code


def check_scratch(scratch: str, record: dict) -> None:
    """Refuse an OUT that is, holds or lies in what the run reads or where the results keep their runs (OUT/runs
    would then be the recorded runs' folder)."""
    from pipelines.atomic import OutputError, real_path, within_folder

    real = real_path(scratch)
    for argv in record["argv"]:
        runs = option_values(argv, "--storage-path")
        for path in [v for option in INPUT_OPTIONS for v in option_values(argv, option)] + runs:
            where = real_path(os.path.join(REPO, path))
            if (
                within_folder(where, real)
                or within_folder(real, where)
                or (path in runs and where == os.path.join(real, "runs"))
            ):
                raise OutputError(
                    f"--out {scratch}: overlaps {path}, which the record's run reads or the results keep their "
                    "runs in; name a folder of its own"
                )


def prepare_inputs(record: dict, env: dict) -> None:
    """Run the data steps (experiments/results.py's) for data the record reads and this machine lacks: a folder or
    file its commands name, or a file it read without naming it (`inputs_sha256`: the data folder's word vectors,
    which `--embeddings auto` reads where they are and does without where they are not, so a re-run without them
    would train other embeddings and still seem to test the record). Refused where the data steps did not write
    such a file."""
    named = [
        path for argv in record["argv"] for option in ("--data", "--embeddings") for path in option_values(argv, option)
    ]
    read = list(record.get("inputs_sha256", {}))
    missing = [path for path in dict.fromkeys(named + read) if not os.path.exists(os.path.join(REPO, path))]
    if not missing:
        return
    row = next((r for r in ROWS if r.id == record.get("row")), None)
    data = option_values(record["argv"][0], "--data")
    if row is None or not data:
        raise RerunRefused(f"{', '.join(missing)}: not here, and no row of the plan says how to prepare it")
    out = os.path.dirname(os.path.dirname(data[0]))  # rows read OUT/data/KEY
    say(f"{', '.join(missing)}: not here; preparing it with experiments/results.py's data steps")
    with tempfile.TemporaryDirectory() as scratch_ledger:  # the committed ledger's data records stay as they are
        prepare_data(out, env, Ledger(os.path.join(scratch_ledger, "ledger.json")), data_needed([row], "full"), 1)
    still = [path for path in missing if not os.path.exists(os.path.join(REPO, path))]
    if still:
        raise RerunRefused(f"{', '.join(still)}: read by the record, and not written here by the data steps")


def rerun(
    name: str,
    record: dict,
    scratch: str,
    tolerance: float,
    other_cpu: bool = False,
    known: Mapping[str, str] | None = None,
) -> dict:
    """Run `record` again from its commit and stored arguments; the check, as the ledger keeps it. With
    `other_cpu`, a CPU record of another kind of CPU runs too (the check says so); `known`: the ledger's
    `data_identities`, for a record made before records named its data path-free or by its build."""
    gpu = is_gpu_record(record)
    cpu_here = cpu_kind()
    problem = why_not_here(name, record, gpu and cuda_here(), commit_in_clone, None if other_cpu else cpu_here)
    problem = problem or source_checkpoint_problem(name, record) or inputs_problem(name, record, cpu_here, known)
    if problem:
        raise RerunRefused(problem)
    check_scratch(scratch, record)
    figure = primary_figure(record["test"])
    tool_commit = git_commit()  # this script's own code, before anything else changes the tree
    # a Ray instance of its own: workers of a running results.py's instance would import that tree's code
    env = dict(os.environ, RAY_ADDRESS="local", PYTHONUNBUFFERED="1")
    prepare_inputs(record, env)
    _sha256.cache_clear()  # what the data steps just wrote
    problem = inputs_problem(name, record, cpu_here, known)
    if problem:
        raise RerunRefused(problem)
    code = extract_code(record["commit"], scratch)
    env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else code
    argvs = [redirected(argv, scratch, name) for argv in record["argv"]]
    shutil.rmtree(os.path.join(scratch, "runs", name), ignore_errors=True)  # this tool's own earlier re-run
    os.makedirs(os.path.join(scratch, "logs"), exist_ok=True)
    started = time.time()
    say(f"{name}: re-running from commit {record['commit']} (recorded {record.get('seconds', 0):.0f} s)")
    with open(os.path.join(scratch, "logs", name + ".log"), "w") as log:
        summaries = [run_job([os.path.join(code, argv[0]), *argv[1:]], env, log) for argv in argvs]
    seconds = time.time() - started
    last = summaries[-1]
    figures = last["test"]["metrics"] if last.get("test") else last["metrics"]
    check = {
        "record": name,
        "commit": record["commit"],
        "argv": [redirected(argv, out_as_named(scratch), name) for argv in record["argv"]],
        "device": device_name(1 if gpu else None),
        "recorded_device": record.get("device", "cpu"),
        "cpu": cpu_here,
        "recorded_cpu": record.get("cpu"),  # None: a record made before records named their CPU
        "figure": figure,
        "recorded": record["test"][figure],
        "rerun": figures.get(figure),
        "tolerance": tolerance,
        "seconds": round(seconds, 1),
        "recorded_seconds": record.get("seconds"),
        "finished": datetime.date.today().isoformat(),
        "tool_commit": tool_commit,
        # False for a record made before the sha256 of its data and word vectors was kept: a difference may then
        # be other inputs (a data step run again since) rather than training that does not reproduce
        "inputs_checked": bool(record.get("inputs_sha256")),
    }
    check["difference"] = None if check["rerun"] is None else check["rerun"] - check["recorded"]
    check["same"] = check["difference"] is not None and abs(check["difference"]) <= tolerance
    if last.get("test"):
        from training.checkpoints import checkpoint_weights_sha256

        check["weights_sha256"] = checkpoint_weights_sha256(last["test"]["checkpoint"])
        if record.get("weights_sha256"):  # by content: no need of the recorded checkpoint on this machine
            check["weights_identical"] = check["weights_sha256"] == record["weights_sha256"]
        else:
            check["weights_identical"] = same_weights(recorded_checkpoint(record), last["test"]["checkpoint"])
    return check


def cpu_caveat(check: dict) -> str:
    """What a CPU check that came back different should be read with: whether it ran on the record's kind of CPU."""
    mismatch = cpu_mismatch(check)
    if mismatch is None:
        return ""
    if mismatch == "unnamed":
        return (
            "; the record does not name the CPU it ran on, and on another kind (other vector kernels) training can "
            "end elsewhere"
        )
    return f"; it ran on {describe_cpu(check['recorded_cpu'])}, not this kind of CPU"


def recorded_checkpoint(record: dict) -> str | None:
    """The checkpoint the record scored, where it is on this machine as the record left it (its sha256), or None.
    Records name it relative to the results' OUT, the folder above --storage-path."""
    from pipelines.shards import sha256_file
    from training.checkpoints import STATE_FILE

    storage = option_values(record["argv"][-1], "--storage-path")
    if not storage or not record.get("checkpoint") or not record.get("checkpoint_sha256"):
        return None
    path = os.path.join(REPO, os.path.dirname(storage[0]), record["checkpoint"])
    state = os.path.join(path, STATE_FILE)
    return path if os.path.exists(state) and sha256_file(state) == record["checkpoint_sha256"] else None


def same_weights(recorded: str | None, rerun_checkpoint: str) -> bool | None:
    """Whether two checkpoints hold the same scored weights, bit for bit (their state.pt files differ anyway: they
    carry the seconds trained); None where the recorded checkpoint is not here. For a record made before records
    kept `weights_sha256`."""
    if recorded is None:
        return None
    from training.checkpoints import checkpoint_weights_sha256

    return checkpoint_weights_sha256(recorded) == checkpoint_weights_sha256(rerun_checkpoint)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--record", help="the ledger key of the run to re-run (e.g. full-trecqa-qrnn-seed2)")
    which.add_argument("--pick-random", action="store_true", help="draw one of the records that can re-run here")
    p.add_argument("--seed", type=int, help="the draw's seed (default: a fresh one, printed)")
    p.add_argument("--max-seconds", type=float, help="draw only among records that trained at most this long")
    p.add_argument("--ledger", default=os.path.join(REPO, "docs", "results", "ledger.json"))
    p.add_argument("--out", default=os.path.join(REPO, "out", "rerun"), help="the code, runs and logs of re-runs")
    p.add_argument("--tolerance", type=float, default=0.002, help="the largest difference that counts as the same")
    p.add_argument("--no-record", action="store_true", help="leave the ledger as it is")
    p.add_argument(
        "--other-cpu",
        action="store_true",
        help="re-run a CPU record that names another kind of CPU (its figures may then differ beyond --tolerance)",
    )
    args = p.parse_args(argv)
    if args.seed is not None and not args.pick_random:
        p.error("--seed draws a record: it goes with --pick-random")
    if not 0 <= args.tolerance < 1:
        p.error(f"--tolerance {args.tolerance}: a difference of figures between 0 and 1")
    if not os.path.isfile(args.ledger):
        p.error(f"--ledger {args.ledger}: no such ledger")
    try:  # it names its file: not JSON (the page given as the ledger), or per-question figures not beside it
        ledger = Ledger(args.ledger)
    except (OSError, ValueError) as error:
        p.error(f"--ledger {error}")
    drawn = None
    if args.pick_random:
        seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
        name, eligible = pick(ledger, seed, args.max_seconds, None if args.other_cpu else cpu_kind())
        drawn = {"seed": seed, "eligible": eligible, "max_seconds": args.max_seconds}
        say(f"drew {name} of {eligible} records that can re-run here (--seed {seed})")
    else:
        name = args.record
        if name not in ledger.records or ":" in name:  # a typo: a usage error, with the nearest names
            runs = [key for key in ledger.records if ":" not in key]
            near = difflib.get_close_matches(name, runs, n=3, cutoff=0.8)
            hint = f"did you mean {' or '.join(near)}?" if near else "the page's 'Every run' lists them"
            p.error(f"--record {name}: not a run of {args.ledger} ({hint})")
    known = data_identities(ledger.records.values())
    check = rerun(name, ledger.records[name], args.out, args.tolerance, args.other_cpu, known)
    if drawn:
        check["drawn"] = drawn
    if not args.no_record:
        ledger.add(f"rerun:{name}", with_earlier_checks(check, ledger.records.get(f"rerun:{name}")))
    if check["rerun"] is None:
        say(f"{name}: the re-run printed no test {check['figure']}; see {args.out}/logs/{name}.log")
    else:
        say(
            f"{name}: test {check['figure']} {check['recorded']:.4f} recorded, {check['rerun']:.4f} re-run "
            f"({check['difference']:+.4f}): {'the same' if check['same'] else 'DIFFERENT'} within {args.tolerance}"
            + {True: "; the same weights", False: "; other weights", None: ""}[check.get("weights_identical")]
            + (
                ""
                if check["same"] or check["inputs_checked"]
                else "; the record predates the sha256 of the data and word vectors it read, so it may have read "
                "others (results.py --retest runs it again and keeps them)"
            )
            + ("" if check["same"] else cpu_caveat(check))
        )
    print(json.dumps(check))
    return 0 if check["same"] else 1


if __name__ == "__main__":
    sys.exit(main())

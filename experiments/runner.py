"""Running the plan: the runs due (a missing record, a changed plan or input, a record to test again), the data
steps, and the lanes that run them on one local Ray instance, each finished run recorded in the ledger
(experiments/ledger.py) with what it ran on (experiments/machine.py)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import fnmatch
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, overload

from experiments.ledger import Ledger
from experiments.machine import (
    cpu_kind,
    device_kind,
    device_name,
    git_commit,
    machine_description,
    software_versions,
    trained_on_gpu,
)
from experiments.plan import (
    REPO,
    SHARED_DATA,
    DataStep,
    Row,
    Run,
    data_folder,
    data_steps,
    link_squad,
    run_name,
    runs_of,
    say,
    shown,
)
from experiments.rows import EFFICIENCY_LENGTHS, EFFICIENCY_PLOTS, ROWS


def _text_of(path: str) -> str | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


@overload
def run_job(argv: list[str], env: dict, log, summary: Literal[True] = True) -> dict: ...
@overload
def run_job(argv: list[str], env: dict, log, summary: Literal[False]) -> None: ...
def run_job(argv: list[str], env: dict, log, summary: bool = True) -> dict | None:
    """Run `python ARGV` from the repository root; return the JSON summary each job prints last on stdout."""
    started = time.time()
    process = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    if process.returncode:
        raise RuntimeError(
            f"{shown(argv)} failed with exit code {process.returncode} after "
            f"{time.time() - started:.0f} s; see {log.name}"
        )
    if not summary:
        return None
    # the job's summary is its last JSON line; Ray may forward its workers' log lines to stdout after it
    for line in reversed(process.stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)
    raise RuntimeError(f"{shown(argv)} printed no JSON summary on stdout; see {log.name}")


def source_run(row: Row, profile: str, seed: int) -> Run | None:
    """The run a fine-tuning row's run of `seed` starts from, in the same profile: its source row's run of the
    same seed (a pretraining run of its own)."""
    if not row.init_from:
        return None
    source = next(r for r in ROWS if r.id == row.init_from)
    return Run(source, seed, profile)


def commands(row: Row, seed: int, out: str, profile: str = "hour") -> list[list[str]]:
    """The argv lists (after `python`) that produce this row's figures for one seed in `profile`."""
    data = data_folder(out, row.data)
    name = run_name(row, seed, profile)
    predictions = os.path.join(out, "predictions", name + ".jsonl")
    if row.model is None:  # the row's options name its encoder (MiniLM where they name none)
        encoder = row.options_of(profile) or ["--encoder-path", "minilm"]
        return [["jobs/zero_shot.py", "--data", data, "--split", row.split, *encoder, "--output", predictions]]
    runs = os.path.join(out, "runs")
    options = [o.replace("{data}", data) for o in row.options_of(profile)]  # files beside the row's data
    cpus = [] if "--cpus-per-worker" in options else ["--cpus-per-worker", "1"]  # a lane's one CPU by default
    train = [
        "jobs/train.py",
        "--model",
        row.model,
        "--data",
        data,
        "--storage-path",
        runs,
        "--name",
        name,
        "--seed",
        str(seed),
        *cpus,
        "--log-every",
        "10",
        *options,
    ]
    source = source_run(row, profile, seed)
    if source:
        train += ["--init-from", os.path.join(runs, source.name)]
    # A dev row (SQuAD, whose test set is not public) scores its best checkpoint on dev once more: the same
    # figures as its best dev evaluation, and the per-question records its interval and paired tests need.
    return [train + ["--test-split", row.split, "--test-output", predictions]]


def plan_of(run: Run, out: str) -> dict:
    """What decides a run's figures, compared with its ledger record to tell whether it must run again: its
    commands, the recipe they resolve to (a recipe changed in the code changes the plan though the commands do
    not), and the row's revision."""
    argvs = commands(run.row, run.seed, out, run.profile)
    plan = {"commands": [shown(a) for a in argvs], "revision": run.row.revision}
    if argvs[0][0] == "jobs/train.py":
        from training.command import parse_train_args
        from training.config import RECIPE_FIELDS

        cfg, _ = parse_train_args(argvs[0][1:])
        plan["recipe"] = {name: getattr(cfg, name) for name in ("recipe",) + RECIPE_FIELDS + ("recipe_options",)}
    return json.loads(json.dumps(plan))  # as the ledger stores it (tuples become lists)


def dev_history(checkpoint: str) -> list:
    """[step, dev figures] of every evaluation of a run, from its latest checkpoint: the learning curve."""
    from training.checkpoints import read_state

    return [
        [step, {k: round(v, 4) for k, v in figures.items() if isinstance(v, float)}]
        for step, figures in read_state(checkpoint).get("dev_history", [])
    ]


def on_device(argv: list[str], gpus_per_run: float | None) -> list[str]:
    """A training command as it runs: on a GPU share where the report runs on one. Where a run trains is not part
    of its plan (the commands the ledger compares): a run on a GPU stands for the same row as one on the CPU, and
    its record says which device it had."""
    if gpus_per_run and argv[0] == "jobs/train.py":
        return [*argv, "--use-gpu", "--gpus-per-worker", f"{gpus_per_run:g}"]
    return argv


# The figure a question contributes, by the kind of record a predictions file holds: AP (answer selection), F1
# (extractive reading comprehension), 1 or 0 (multiple choice).
QUESTION_FIGURES = ("ap", "f1", "correct")


def question_figures(path: str) -> dict | None:
    """{"metric": "ap" | "f1" | "correct", "values": {question id: figure}} from a run's predictions file (one JSON
    record per question, as jobs/train.py --test-output and jobs/zero_shot.py write them); questions the evaluation
    policy skipped are left out. None where no record carries one of QUESTION_FIGURES."""
    metric, values = None, {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("skipped"):
                continue
            metric = metric or next((m for m in QUESTION_FIGURES if record.get(m) is not None), None)
            if metric is not None and record.get(metric) is not None:
                values[str(record["qid"])] = round(float(record[metric]), 4)
    return {"metric": metric, "values": values} if metric else None


def run_one(run: Run, out: str, env: dict, ledger: Ledger, gpus_per_run: float | None = None) -> dict:
    from pipelines.shards import sha256_file
    from training.checkpoints import checkpoint_weights_sha256

    row, seed, key = run.row, run.seed, run.name
    argvs = commands(row, seed, out, run.profile)
    planned, commit = plan_of(run, out), git_commit()  # the plan and the code the jobs start from
    # A run folder left by an interrupted run resumes only under the same plan and from the same commit (the one
    # its first part started from, beside it): otherwise its record would name one commit for steps that another
    # trained. Anything else starts afresh.
    plan = os.path.join(out, "runs", key + ".plan.json")
    began = os.path.join(out, "runs", key + ".commit")
    if os.path.exists(os.path.join(out, "runs", key)):
        left_plan, left_commit = json.loads(_text_of(plan) or "null"), (_text_of(began) or "").strip()
        if left_plan != planned or left_commit != commit:
            why = "another plan" if left_plan != planned else f"commit {left_commit or 'unrecorded'}"
            say(f"{key}: the run folder left under {why} is not resumed: it starts afresh at {commit}")
            shutil.rmtree(os.path.join(out, "runs", key))
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    with open(plan, "w") as f:
        json.dump(planned, f)
    with open(began, "w") as f:
        f.write(commit + "\n")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    started = time.time()
    with open(os.path.join(out, "logs", key + ".log"), "w") as log:
        summaries = [run_job(on_device(argv, gpus_per_run), env, log) for argv in argvs]
    seconds = time.time() - started
    if git_commit() != commit:  # the tree changed under the run (a commit, a checkout, an edit): its jobs may have
        commit = commit.removesuffix("-dirty") + "-dirty"  # imported some of either, so no commit holds what ran
    record = {
        "row": row.id,
        "seed": seed,
        "profile": run.profile,
        "commands": planned["commands"],
        "argv": [on_device(argv, gpus_per_run) for argv in argvs],  # exactly what ran, device options included
        "versions": software_versions(),
        "plan": planned,
        "seconds": round(seconds, 1),
        "commit": commit,
        "finished": datetime.date.today().isoformat(),
        "device": device_name(gpus_per_run),
        "cpu": cpu_kind(),  # the jobs run on this machine's Ray instance
    }
    if row.model is None:
        # the bi-encoder embeds in fp32 (no autocast)
        record.update(test=summaries[0]["metrics"], split=row.split, encoder=summaries[0]["encoder"], precision="fp32")
        record.update(inputs_record(data_read(data_folder(out, row.data))))  # for rerun.py, and --retest
    else:
        train = summaries[0]
        # the best checkpoint's figures on the row's split, scored by the training job
        checkpoint, figures = train["test"]["checkpoint"], train["test"]["metrics"]
        with open(os.path.join(checkpoint, "config.json")) as f:
            config = json.load(f)
        earlier = train.get("resumed_trained_seconds") or 0.0
        if earlier:  # resumed: the invocations before this one trained that long, up to the checkpoint it resumed
            record.update(
                seconds=round(seconds + earlier, 1),
                seconds_this_invocation=round(seconds, 1),
                resumed_from_step=train.get("resumed_from_step"),
            )
        record.update(
            split=row.split,
            test=figures,
            dev=(train.get("best") or {}),
            steps=train.get("steps"),
            stopped_early=train.get("stopped_early", False),
            examples_per_s=train.get("examples_per_s"),
            precision=train.get("precision"),  # as trained: fp32, bf16 or fp16
            checkpoint=os.path.relpath(checkpoint, out),
            checkpoint_sha256=sha256_file(os.path.join(checkpoint, "state.pt")),
            # the scored weights by content: a re-run that trains to them bit for bit shares it (not the file's)
            weights_sha256=checkpoint_weights_sha256(checkpoint),
            config=config["train"],
            model_config=config["model_config"],
            dev_history=dev_history(train["checkpoint"]),
        )
        if train.get("init_from"):  # the checkpoint it fine-tuned from, by content
            record["init_checkpoint_sha256"] = sha256_file(os.path.join(train["init_from"], "state.pt"))
        record.update(inputs_record(inputs_read(config["train"])))  # the data and word vectors, by content
    predictions = os.path.join(out, "predictions", key + ".jsonl")
    if os.path.exists(predictions):  # what the row's interval and the paired tests of its claims are computed from
        record["per_question"] = question_figures(predictions)
    before = ledger.records.get(f"replaced:{key}")  # the record todo_runs set aside when this run became due again
    if before and before.get("plan") == planned:  # comparable: the same commands and recipe
        record["replaces"] = replaced_record(before)
    ledger.add(key, record, removing=f"replaced:{key}")  # one write: a crash leaves the one or the other
    metrics = {k: round(v, 4) for k, v in record["test"].items() if isinstance(v, float)}
    say(f"{key}: {row.split} {metrics} in {seconds:.0f} s")
    return record


REPLACED_FIELDS = (
    "commit",
    "finished",
    "device",
    "cpu",
    "test",
    "checkpoint_sha256",
    "weights_sha256",
    "inputs_sha256",
    "inputs_as_built_sha256",
    "inputs_path_free_sha256",
    "init_checkpoint_sha256",
)


def replaced_record(before: dict) -> dict:
    """What a record that ran again under the same plan keeps of the one it replaces: where and from which code that
    one ran, what it read and scored, so that the page can say how often a run re-ran to the same figures, and on
    which kinds of device; and under `earlier`, oldest first, what that one had replaced in turn, so that a third
    run does not drop the evidence of the second (`before` is a whole record, or one set aside, whose chain is
    already under `earlier`)."""
    kept = {field: before[field] for field in REPLACED_FIELDS if field in before}
    earlier = list(before.get("earlier", []))
    if before.get("replaces"):
        previous = before["replaces"]
        earlier = [*previous.get("earlier", []), {k: v for k, v in previous.items() if k != "earlier"}]
    if earlier:
        kept["earlier"] = earlier
    return kept


def set_aside(ledger: Ledger, run: Run, recorded: dict) -> None:
    """Keep what a run due again under its plan replaces, under `replaced:RUN` until its new record takes it (in the
    ledger, not in memory: an invocation cut off before the run finishes leaves it for the next one); its plan
    goes with it, so that a run whose plan changes meanwhile is not set against it."""
    ledger.add(f"replaced:{run.name}", dict(replaced_record(recorded), plan=recorded.get("plan")))


def inputs_read(train: dict) -> dict[str, str]:
    """The sha256 of the files a training run read besides its code and starting checkpoint, by the paths its saved
    configuration `train` names: its data's manifest (which holds every shard's sha256) and the word vectors it
    started from, if any. experiments/rerun.py checks them: a data step run again since (on other software, or
    an earlier fastText on several threads) gives a run other inputs than its record's."""
    from training.config import TrainConfig
    from training.data import embeddings_path

    cfg = TrainConfig.from_saved(dict(train, data=_in_repo(train["data"])))
    if cfg.embeddings not in ("auto", "none"):
        cfg.embeddings = _in_repo(cfg.embeddings)
    return _sha256_by_name([os.path.join(cfg.data, "manifest.json"), embeddings_path(cfg)])


def data_read(data: str) -> dict[str, str]:
    """The sha256 of the data manifest a zero-shot run scored (`data`: its folder as the command names it); it
    reads no word vectors, and its encoder is named by its record."""
    return _sha256_by_name([os.path.join(_in_repo(data), "manifest.json")])


def inputs_record(read: dict[str, str]) -> dict[str, dict[str, str]]:
    """A record's fields for the files it read (`read`: their sha256 by name): `inputs_sha256`, the bytes read;
    `inputs_path_free_sha256`, each data manifest's sha256 without the folders it names
    (`pipelines.shards.path_free_sha256`), so that a run re-run where ../shared/data or the repository lies at
    another path is known to read the same data; and where a data folder is a carried copy (infra/offline_gpu/
    carry.py: the same rows, written by another pyarrow), `inputs_as_built_sha256`, its manifest's sha256 as built,
    so that the record is set beside runs on the build (`data_identity`); a copy's path-free sha256 is its build's."""
    from pipelines.shards import manifest_as_built

    manifests = {
        name: manifest_as_built(_in_repo(name), sha) for name, sha in read.items() if name.endswith("manifest.json")
    }
    built = {name: as_built for name, (as_built, _) in manifests.items() if as_built}
    free = {name: path_free for name, (_, path_free) in manifests.items() if path_free}
    return {
        "inputs_sha256": read,
        **({"inputs_as_built_sha256": built} if built else {}),
        **({"inputs_path_free_sha256": free} if free else {}),
    }


def data_identities(records: Iterable[dict]) -> dict[str, str]:
    """What the ledger knows of the manifests its records name by their bytes: each sha256 to the manifest's
    path-free sha256 as built (`inputs_path_free_sha256` of a record that read it; `manifests` of a data step that
    wrote or found it), so that records made before they kept it, or on a machine whose folders lie elsewhere, name
    the same data alike; and each carried copy's sha256 to its build's (`inputs_as_built_sha256` of a later record
    that read the same copy: the same bytes, the same rows unpacked by the same pyarrow), or on to the build's
    path-free sha256 where that is known."""
    carried: dict[str, str] = {}
    path_free: dict[str, str] = {}
    for record in records:
        read = record.get("inputs_sha256") or {}
        built = record.get("inputs_as_built_sha256") or {}
        carried.update({read[name]: sha for name, sha in built.items() if name in read})
        for name, free in (record.get("inputs_path_free_sha256") or {}).items():
            if name in read:
                path_free[built.get(name, read[name])] = free
        path_free.update(record.get("manifests") or {})  # a data step's
    return {**path_free, **{copy: path_free.get(build, build) for copy, build in carried.items()}}


def data_identity(record: dict, known: Mapping[str, str] | None = None) -> dict[str, str]:
    """The contents a record read, each file by the most its sha256 is known as: a manifest by its path-free sha256
    as built (the record's `inputs_path_free_sha256`, or for a record made before that was kept, `known`:
    `data_identities` of the ledger), else by its sha256 as built (a carried copy's manifest by the one it was
    carried from); a file known no further (word vectors: their bytes are their content) by its own sha256. Two
    runs on the same rows, one where they were built and one on a copy carried to a GPU machine or built from
    ../shared/data at another path, name the same contents."""
    built, free, known = (
        record.get("inputs_as_built_sha256") or {},
        record.get("inputs_path_free_sha256") or {},
        known or {},
    )
    return {
        name: free.get(name) or known.get(built.get(name, sha), built.get(name, sha))
        for name, sha in (record.get("inputs_sha256") or {}).items()
    }


def known_by_bytes_only(record: dict, name: str, known: Mapping[str, str] | None = None) -> bool:
    """Whether what a record read as `name` is known only by its bytes (as read or as built): a manifest that no
    record or data step in the ledger named path-free, so that the same rows built at another path look other."""
    identity = data_identity(record, known).get(name)
    return identity in (
        (record.get("inputs_sha256") or {}).get(name),
        (record.get("inputs_as_built_sha256") or {}).get(name),
    )


def _in_repo(path: str) -> str:  # relative paths are the repository's, as the commands name them
    return os.path.join(REPO, path)


def _sha256_by_name(paths: list[str | None]) -> dict[str, str]:
    """Each existing file's sha256, keyed by the name the commands give it (relative to the repository)."""
    from pipelines.shards import sha256_file

    def named(path: str) -> str:
        return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path

    return {named(path): sha256_file(path) for path in paths if path and os.path.exists(path)}


def steps_to_run(out: str, keys: set[str]) -> list[DataStep]:
    """The data steps named by `keys` whose output is not there yet, in the plan's order."""
    return [step for step in data_steps(out) if step.key in keys and not os.path.exists(step.done)]


def prepare_data(out: str, env: dict, ledger: Ledger, only: set[str], lanes: int) -> float:
    """The data steps that `only` names, not yet done; each data set's steps in order (its vectors need its
    shards), the data sets `lanes` at a time, the longest first by the seconds the ledger recorded for their steps
    (so that the last to finish is a short one; a data set never timed goes last, in plan order)."""
    link_squad(out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    chains: dict[str, list[DataStep]] = {}
    for step in steps_to_run(out, only):
        chains.setdefault(step.key.split("-")[0], []).append(step)

    def run_chain(steps: list[DataStep]) -> None:
        for step in steps:
            say(f"data {step.key}: {shown(step.argv)}")
            started = time.time()
            with open(os.path.join(out, "logs", f"data-{step.key}.log"), "w") as log:
                run_job(step.argv, env, log, summary=False)
            record = {"command": shown(step.argv), "seconds": round(time.time() - started, 1)}
            earlier = ledger.records.get(f"data:{step.key}", {}).get("manifests")  # records may name them
            ledger.add(
                f"data:{step.key}", dict(record, **corpus_summary(step), **({"manifests": earlier} if earlier else {}))
            )

    def recorded_seconds(steps: list[DataStep]) -> float:
        return sum(ledger.records.get(f"data:{step.key}", {}).get("seconds", 0) for step in steps)

    longest_first = sorted(chains.values(), key=recorded_seconds, reverse=True)  # stable: ties keep the plan's order
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(lanes) as pool:
        for future in [pool.submit(run_chain, steps) for steps in longest_first]:
            future.result()
    seconds = time.time() - started if chains else 0.0
    attest_manifests(out, ledger, only)
    return seconds


def attest_manifests(out: str, ledger: Ledger, only: set[str]) -> None:
    """Keep in the record of each data step that `only` names and that wrote a manifest here (run now or before)
    the manifest's sha256 with its path-free sha256 (`manifests`; every one kept, since records made on an earlier
    build name it), so that records naming it by its bytes, made before records kept the path-free sha256, are
    known by it (`data_identities`): a reviewer whose ../shared/data lies elsewhere builds other bytes of the same
    data. A carried copy's manifest is named by its build's path-free sha256 (`manifest_path_free_sha256`), as its
    records name it. A step without a record here is left."""
    from pipelines.shards import manifest_path_free_sha256, sha256_file

    for step in data_steps(out):
        key = f"data:{step.key}"
        if step.key not in only or key not in ledger.records or not step.done.endswith("manifest.json"):
            continue
        if not os.path.exists(step.done):
            continue
        sha = sha256_file(step.done)
        manifests = ledger.records[key].get("manifests") or {}
        try:
            path_free = manifest_path_free_sha256(step.done, sha)
        except ValueError:  # not JSON: nothing to name it by (training refuses it, naming the file)
            continue
        if path_free and manifests.get(sha) != path_free:
            ledger.add(key, dict(ledger.records[key], manifests={**manifests, sha: path_free}))


def corpus_summary(step: DataStep) -> dict:
    """What a StackExchangeQA build step made, for the page: its pairs per split and how its negatives were drawn
    (the build's stats.json); for a fastText vectors step, the OpenBLAS kernels it trained on (its vectors' bytes
    follow them: runtime/blas.py); nothing for the other steps."""
    if step.done.endswith(".npy"):
        try:
            with open(step.done[: -len(".npy")] + ".json") as f:
                kernels = json.load(f).get("blas_kernels")
        except FileNotFoundError:  # a vectors file from before its statistics were kept beside it
            return {}
        if not kernels:  # loaded or distilled vectors, or none of OpenBLAS's loaded
            return {}
        names = sorted(set(kernels.values()))
        return {"blas_kernels": names[0] if len(names) == 1 else kernels}
    if not step.key.endswith("-build"):
        return {}
    with open(step.done) as f:
        stats = json.load(f)
    return {
        "pairs": stats["pairs"],
        "splits": {split: {"questions": s["questions"], "rows": s["rows"]} for split, s in stats["splits"].items()},
        "negatives": stats.get("negatives", {"drawn": "random"}),
    }


def unmatched_patterns(patterns: list[str], profile: str = "hour") -> list[str]:
    """The --only patterns that match no row of `profile` (a typo: `wikqa/*`), which would run nothing but the
    efficiency benchmark; `efficiency` itself names that benchmark."""
    ids = [r.id for r in ROWS if (r.full is not None if profile == "full" else r.in_hour)]
    return [p for p in patterns if p != "efficiency" and not any(fnmatch.fnmatch(i, p) for i in ids)]


def selected_rows(patterns: list[str], everything: bool = False, profile: str = "hour") -> list[Row]:
    """The profile's plan: the hour's rows without `extra`, or the rows with full-profile options without
    `full_extra`; with `patterns`,
    the rows they match (in the hour, extra ones included); with `everything`, every row of the profile. Rows
    they fine-tune from come along."""
    if profile == "full":
        candidates = [r for r in ROWS if r.full is not None]
        plan = [r for r in candidates if everything or not r.full_extra]
    else:
        candidates = [r for r in ROWS if r.in_hour]
        plan = [r for r in candidates if everything or not r.extra]
    if not patterns:
        chosen = plan
    else:
        chosen = [r for r in candidates if any(fnmatch.fnmatch(r.id, p) for p in patterns)]
    needed = {r.init_from for r in chosen if r.init_from}
    return [r for r in candidates if r in chosen or r.id in needed]


def changed_inputs(record: dict, sha256: Callable[[str], str], known: Mapping[str, str] | None = None) -> list[str]:
    """The files a record read (`inputs_sha256`: its data's manifest, its word vectors) that are here with other
    contents than it read (a data step run again since, on other software, say), by `sha256` (a file's hash, cached
    by the caller). The same rows count as the same contents: a manifest here built from folders at other paths
    than the record's machine had, a record on a carried copy of this machine's build, or here a carried copy of
    what the record read (`data_identity`, with `known` from the ledger). A file not here tells nothing: the data
    steps prepare it first."""
    from pipelines.shards import manifest_as_built

    identity, changed = data_identity(record, known), []
    for path, recorded in record.get("inputs_sha256", {}).items():
        here = _in_repo(path)
        if not os.path.exists(here):
            continue
        sha_here = sha256(here)
        if sha_here == recorded:
            continue
        same: set[str | None] = {sha_here}
        if path.endswith("manifest.json"):
            built_here, path_free_here = manifest_as_built(here, sha_here)
            same |= {built_here, path_free_here, (known or {}).get(built_here or sha_here)}
        if identity[path] not in same:
            changed.append(path)
    return changed


def rerun_reason(
    record: dict,
    clean_tree: bool,
    retest: bool = False,
    sha256: Callable[[str], str] | None = None,
    use_gpu: bool = False,
    known: Mapping[str, str] | None = None,
    to_this_device: bool = False,
) -> str | None:
    """Why a run recorded under its present plan must run again, or None: it ran from uncommitted code (no commit
    holds what it ran; only from a `clean_tree`, where the new record will name its commit), or, with `retest`, its
    record predates per-question figures (its row then has no interval and its claims no paired test) or the sha256
    of what it read (experiments/rerun.py cannot then tell a re-run on other data or word vectors from training
    that does not reproduce) or, for a run on a CPU, the CPU it ran on (rerun.py re-runs a CPU record only on its own
    kind of CPU, whose kernels it reproduces; one naming none may come from any machine), or (given `sha256`) it
    read other contents than this machine's data steps wrote, so that its row would set runs on other data against
    each other. `retest` re-runs only a record of the invocation's kind of device (a GPU's with `use_gpu`, else a
    CPU's): a GPU record re-run on CPUs would take hours a run and leave its row's seeds on two kinds of device.
    With `to_this_device`, a record of the other kind of device runs again on this one, so that rows a claim sets
    side by side trained alike (the page compares no rows whose runs trained in other precisions or on other kinds
    of device)."""
    if str(record.get("commit", "")).endswith("-dirty") and clean_tree:
        return "recorded from uncommitted code"
    on_gpu = trained_on_gpu(record)
    if to_this_device and on_gpu != use_gpu:
        return f"recorded on {device_kind(record)} (--to-this-device)"
    if retest and on_gpu != use_gpu:
        return None
    if retest and "per_question" not in record:
        return "recorded without per-question figures (--retest)"
    if retest and "inputs_sha256" not in record:
        return "recorded without the sha256 of the data and word vectors it read (--retest)"
    if retest and not on_gpu and "cpu" not in record:
        return "recorded without the CPU it ran on (--retest)"
    changed = changed_inputs(record, sha256, known) if retest and sha256 is not None else []
    if changed:
        return f"read other contents of {', '.join(changed)} than this machine's (--retest)"
    return None


def started_elsewhere(record: dict, source: dict | None) -> bool:
    """Whether a fine-tuning run's `record` did not start from the checkpoint its source run's record (`source`)
    holds: its `init_checkpoint_sha256` is not the source's `checkpoint_sha256`, or (a record from before that
    field was kept) it finished on an earlier day than the source's record, whose checkpoint it therefore cannot
    have fine-tuned. Such a run and its row's other seeds may not share a start. A source without a record tells
    nothing (`todo_runs` runs it, and so its fine-tunings, again)."""
    if source is None:
        return False
    started = record.get("init_checkpoint_sha256")
    if started is not None:
        return started != source.get("checkpoint_sha256")
    return str(record.get("finished", "")) < str(source.get("finished", ""))  # ISO dates compare as strings


def start_afresh(run: Run, out: str) -> None:
    """Remove what a finished run left (its run folder, plan and predictions), so that running it again trains
    anew instead of resuming the finished run from its last checkpoint."""
    shutil.rmtree(os.path.join(out, "runs", run.name), ignore_errors=True)
    for leftover in (
        os.path.join(out, "runs", run.name + ".plan.json"),
        os.path.join(out, "runs", run.name + ".commit"),
        os.path.join(out, "predictions", run.name + ".jsonl"),
    ):
        if os.path.exists(leftover):
            os.remove(leftover)


@dataclasses.dataclass(frozen=True)
class Due:
    """Why a run runs in this invocation, and what running it again does to what its last run left."""

    said: str | None  # printed as it is set due (None: no record, or one under another plan: nothing to set aside)
    afresh: bool = False  # its finished run's folder goes, so that it trains anew instead of resuming
    keep: bool = False  # its record, under the same plan, is set aside for the new one to replace (`replaces`)


def due_runs(
    rows: list[Row],
    seeds: tuple,
    out: str,
    profile: str,
    ledger: Ledger,
    retest: bool = False,
    use_gpu: bool = False,
    to_this_device: bool = False,
) -> dict[Run, Due]:
    """The runs of `rows` that must run, changing nothing: those whose ledger record is missing, was made under
    another plan (a changed command, recipe or revision) or must run again (`rerun_reason`), the runs they fine-tune
    from whose checkpoint is not on this machine (the ledger travels with the repository, checkpoints do not), and
    the runs fine-tuning from a run that runs again or that fine-tuned another checkpoint than its source's record
    holds (a row never mixes starting checkpoints). With `retest`, a record's inputs are compared only with the data
    already on this machine (`changed_inputs`); with `to_this_device`, records of the other kind of device run
    again (`rerun_reason`)."""
    runs, due = runs_of(rows, profile, seeds), {}
    clean_tree = not git_commit().endswith("-dirty")  # two git calls: once, not once per recorded run
    from pipelines.shards import sha256_file

    sha256 = functools.cache(sha256_file)  # each data file hashed once, not once per run that read it
    known = data_identities(ledger.records.values())
    for run in runs:
        recorded = ledger.records.get(run.name)
        if not recorded or recorded.get("plan") != plan_of(run, out):
            due[run] = Due(None)  # a run cut off before its record resumes from its last checkpoint
            continue
        why = rerun_reason(recorded, clean_tree, retest, sha256, use_gpu, known, to_this_device)
        source = source_run(run.row, profile, run.seed)
        if why is None and source is not None and started_elsewhere(recorded, ledger.records.get(source.name)):
            why = "fine-tuned another checkpoint than its pretraining run's record holds"
        if why is not None:
            due[run] = Due(f"{run.name}: {why}: it runs again", afresh=True, keep=True)
    for run in list(due):
        source = source_run(run.row, profile, run.seed)
        if source and source not in due and not os.path.isdir(os.path.join(out, "runs", source.name)):
            # recorded, it is under its plan (else it would be due already): comparable with the new record
            said = f"{run.name} fine-tunes {source.name}, whose checkpoint is not here: it runs again first"
            due[source] = Due(said, keep=True)
    for run in runs:  # a run whose source runs again fine-tunes the new checkpoint
        source = source_run(run.row, profile, run.seed)
        if run not in due and source is not None and source in due:
            due[run] = Due(f"{run.name} fine-tunes {source.name}, which runs again: so does it", afresh=True)
    return due


def todo_runs(
    rows: list[Row],
    seeds: tuple,
    out: str,
    profile: str,
    ledger: Ledger,
    retest: bool = False,
    use_gpu: bool = False,
    to_this_device: bool = False,
) -> list[Run]:
    """The runs `due_runs` finds, each made ready to run: a finished run's folder removed where it must train
    anew, its record set aside where the new one replaces it under the same plan, and removed. Sources first, then
    every row's first seed before any second one, the zero-shot row and the slowest (MiniLM) rows first within a
    seed."""
    due = due_runs(rows, seeds, out, profile, ledger, retest, use_gpu, to_this_device)
    for run, why in due.items():
        if why.said:
            say(why.said)
        if why.afresh:
            start_afresh(run, out)
        recorded = ledger.records.get(run.name)
        if recorded and why.keep:
            set_aside(ledger, run, recorded)
        if recorded:  # the plan changed since, or it runs again: its record goes
            ledger.remove(run.name)
    todo = list(due)
    is_source = {source_run(r.row, profile, r.seed) for r in todo}
    order = {r.id: i for i, r in enumerate(ROWS)}
    todo.sort(
        key=lambda r: (
            r not in is_source,
            r.seed if len(r.row.seeds_of(profile, seeds)) > 1 else 0,
            r.row.model is not None,
            "minilm" not in r.row.options_of(profile),
            order[r.row.id],
        )
    )
    return todo


def data_to_prepare(
    rows: list[Row],
    seeds: tuple,
    out: str,
    profile: str,
    ledger: Ledger,
    every_row: bool = False,
) -> set[str]:
    """The data steps (keys of `data_steps`) an invocation of `rows` prepares: those its due runs read, so that a
    machine whose ledger holds every selected run builds no data to run nothing; with `every_row`, every selected
    row's: results.py asks so for --retest, since a record is compared with this machine's data only once that data
    is here (`changed_inputs`), and for --to-this-device, whose runs become due from their records."""
    if every_row:
        return data_needed(rows, profile)
    due = due_runs(rows, seeds, out, profile, ledger)  # without --retest no file is hashed: cheap
    return data_needed(list({run.row: None for run in due}), profile)


def data_needed(rows: list[Row], profile: str) -> set[str]:
    """The data steps (keys of `data_steps`) that `rows` read: each row's data set, the steps it names, and word
    vectors only for the rows that read them (an encoder's rows and the zero-shot rows never do, so a machine
    without fastText can run them)."""
    word_rows = [r for r in rows if r.model is not None and "--encoder-path" not in r.options_of(profile)]
    needed = {r.data for r in rows} | {f"{r.data}-vectors" for r in word_rows} | {s for r in rows for s in r.needs}
    builds = {step.key for step in data_steps("")} & {f"{key}-build" for key in needed}
    return needed | builds  # a StackExchangeQA corpus is tokenised from its build


def missing_inputs(needed: set[str], out: str) -> list[str]:
    """The ../shared/data paths that the data steps `needed` (keys of `data_steps`) still to run read and this
    machine lacks: a step whose output is already there reads nothing, so a machine holding the prepared data (a
    GPU node given the tokenised shards) runs the rows without the raw data."""
    missing: list[str] = []
    for step in steps_to_run(out, needed):
        reads = [arg.split("=", 1)[-1] for arg in step.argv]  # --dump HOST=PATH, --exclude-overlap NAME=PATH
        if step.key == "squad":  # its input folder links into the shared SQuAD files (link_squad)
            reads.append(os.path.join(SHARED_DATA, "squad_sample"))
        for path in reads:
            if path.startswith(SHARED_DATA) and not os.path.exists(path) and path not in missing:
                missing.append(path)
    return missing


@dataclasses.dataclass(frozen=True)
class Invocation:
    """What one invocation of a plan did: the wall time of its data preparation, and how many of the plan's runs it
    ran (the others were recorded already). Only an invocation that ran them all timed the plan."""

    data_seconds: float
    runs_done: int
    runs_planned: int

    @property
    def whole_plan(self) -> bool:
        return self.runs_done == self.runs_planned


@contextlib.contextmanager
def local_ray(cpus: int):
    """One local Ray instance of `cpus` CPUs for an invocation's jobs to join: yields the environment they run in
    (RAY_ADDRESS), so that no job pays for Ray's start-up. The dashboard serves the State API that each training
    run's PlacementGroupCleaner polls (runtime/ray_env.py)."""
    import ray

    from runtime.ray_env import init_local_ray

    init_local_ray(num_cpus=cpus, include_dashboard=True, logging_level="WARNING")
    try:
        yield dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address, PYTHONUNBUFFERED="1")
    finally:
        ray.shutdown()


def prepare_all(needed_data: set[str], out: str, lanes: int, ledger: Ledger) -> float:
    """The data steps `needed_data` not done yet, whether or not the runs that read them are recorded (`results.py
    --prepare-only`: the tokenised shards for a machine that will run them, a GPU node without the raw data);
    returns its wall seconds."""
    with local_ray(lanes + 1) as env:  # one CPU beyond the lanes for Ray Data's read tasks
        return prepare_data(out, env, ledger, needed_data, lanes)


def run_all(
    rows: list[Row],
    seeds: tuple,
    out: str,
    lanes: int,
    ledger: Ledger,
    needed_data: set[str],
    profile: str = "hour",
    use_gpu: bool = False,
    retest: bool = False,
    to_this_device: bool = False,
) -> Invocation:
    """Every run of `rows` in `profile` not yet recorded under its present plan, `lanes` at a time (fine-tuning
    runs once their source is recorded), after the data steps `needed_data` (`data_to_prepare`, whose inputs the
    caller has checked: not found again here); with `use_gpu`, the lanes share one GPU."""
    planned = runs_of(rows, profile, seeds)
    widest = max((run_cpus(run, out) for run in planned), default=1)
    # One CPU beyond the runs' for their Ray Data read tasks: a run whose workers hold every CPU waits forever for
    # its next epoch's read.
    with local_ray(max(lanes, widest) + 1) as env:
        data_seconds = prepare_data(out, env, ledger, needed_data, lanes)
        todo = todo_runs(rows, seeds, out, profile, ledger, retest, use_gpu, to_this_device)
        gpus_per_run = round(1 / lanes, 3) if use_gpu else None
        failed = schedule(
            todo, lanes, lambda run: run_one(run, out, env, ledger, gpus_per_run), ledger, lambda r: run_cpus(r, out)
        )
        if failed:
            raise SystemExit(
                f"{len(failed)} runs failed: {', '.join(failed)} (logs in {out}/logs); the others are "
                f"recorded in {ledger.path}, and running again resumes"
            )
        return Invocation(data_seconds, len(todo), len(planned))


def run_cpus(run: Run, out: str) -> int:
    """The CPUs a run's training worker asks Ray for: its command's --cpus-per-worker (one where it names none,
    and for a zero-shot run, which trains nothing)."""
    argv = commands(run.row, run.seed, out, run.profile)[0]
    if "--cpus-per-worker" not in argv:
        return 1
    return max(1, math.ceil(float(argv[argv.index("--cpus-per-worker") + 1])))


def schedule(todo: list[Run], lanes: int, run, ledger: Ledger, cpus=lambda run: 1) -> list[str]:
    """Run every Run of `todo` in order on `lanes` CPUs, each taking `cpus(run)` of them (a run wider than the
    lanes runs alone) once the run it fine-tunes from is recorded; a run that must wait for CPUs holds back the
    runs after it, so that narrow runs never starve a wide one. A failed run is logged and its dependants skipped.
    Returns the names of the runs that failed or were skipped."""
    pending, failed = list(todo), []
    running: dict[concurrent.futures.Future, Run] = {}
    held: dict[concurrent.futures.Future, int] = {}  # the lanes each running run takes
    total, started = len(todo), time.time()
    say(f"{total} runs to do, {lanes} at a time")
    with concurrent.futures.ThreadPoolExecutor(lanes) as pool:
        while pending or running:
            waiting = False  # a ready run is waiting for CPUs: the runs after it wait too
            for item in list(pending):
                source_of = source_run(item.row, item.profile, item.seed)
                source = source_of.name if source_of else None
                if source in failed:
                    pending.remove(item)
                    failed.append(item.name)
                    say(f"{item.name}: skipped, its pretraining run {source} failed")
                elif source is None or source in ledger.records:
                    need = min(cpus(item), lanes)
                    if waiting or sum(held.values()) + need > lanes:
                        waiting = True
                        continue
                    pending.remove(item)
                    future = pool.submit(run, item)
                    running[future], held[future] = item, need
            if not running:  # only runs waiting for a source that is neither running nor recorded
                failed += [item.name for item in pending]
                break
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                item = running.pop(future)
                held.pop(future)
                try:
                    future.result()
                except Exception as error:  # one run's failure costs that run, not the report
                    failed.append(item.name)
                    say(f"{item.name}: FAILED: {error}")
            finished = total - len(pending) - len(running)
            rate = (time.time() - started) / max(finished, 1)
            say(f"{finished}/{total} runs, {time.time() - started:.0f} s, ETA {rate * (total - finished):.0f} s")
    return failed


EFFICIENCY = [
    "bench/encoders.py",
    "--families",
    ",".join(EFFICIENCY_LENGTHS),
    "--repeats",
    "2",
    *(a for f, lengths in EFFICIENCY_LENGTHS.items() for a in ("--lengths", f"{f}={','.join(map(str, lengths))}")),
]
EFFICIENCY_RECORDED = shown(EFFICIENCY + ["--json", "OUT/encoders.json"])  # the command as its record names it


def efficiency_cases_due() -> set[tuple[str, str, int]]:
    """(family, variant, L) of every case the page's efficiency plots draw, at the EFFICIENCY command's lengths."""
    return {(f, v, n) for f, lengths in EFFICIENCY_LENGTHS.items() for v in EFFICIENCY_PLOTS[f][1] for n in lengths}


def efficiency_recorded(ledger: Ledger) -> bool:
    """Whether the ledger holds the figures of every case the benchmark measures now, on any machine: a record
    without a case added to bench/encoders.py since (Bi-BloSA's), or of another command, is due again."""
    record = ledger.records.get("efficiency", {})
    if "cases" not in record or record.get("command") != EFFICIENCY_RECORDED:
        return False
    return efficiency_cases_due() <= {(c["family"], c["variant"], c["length"]) for c in record["cases"]}


def run_efficiency(out: str, ledger: Ledger) -> float:
    """bench/encoders.py, unless the ledger holds its figures; returns the seconds it took (0 where it did not run)."""
    path = os.path.join(out, "encoders.json")
    if efficiency_recorded(ledger):
        return 0.0
    argv = EFFICIENCY + ["--json", path]
    say(f"efficiency: {shown(argv)}")
    started = time.time()
    with open(os.path.join(out, "logs", "efficiency.log"), "w") as log:
        run_job(argv, dict(os.environ), log, summary=False)
    with open(path) as f:
        cases = json.load(f)["cases"]
    ledger.add(
        "efficiency",
        {
            "command": EFFICIENCY_RECORDED,
            "seconds": round(time.time() - started, 1),
            "commit": git_commit(),
            "machine": machine_description(),
            "cases": cases,
        },
    )
    return time.time() - started

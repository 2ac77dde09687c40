"""The driver of a training run, and the only place that starts Ray Train: checks the data against the model,
sizes the workers, runs `training.loop.train_loop_per_worker` under a TorchTrainer (checkpoints kept by dev
metric, failures retried, SIGINT and SIGTERM turned into a checkpoint), then scores --test-split with the best
checkpoint and writes the curve. `check_run` does every check a run can do before Ray starts."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

from runtime.checks import UsageError
from runtime.stop import fit_until_signalled, new_key
from training.checkpoints import (
    SCORE,
    best_scored,
    checkpoint_summary,
    predictions_name,
    pretrained_config,
    publish,
    run_checkpoints,
    run_dir,
    run_result,
    state_sha256,
    usable_checkpoint,
    write_jsonl,
)
from training.config import (
    TASK_METRICS,
    TrainConfig,
    batches_per_epoch_for,
    data_fields,
    data_task,
    select_metric,
    total_steps_for,
)
from training.data import check_data_fits_model, embeddings_path, embeddings_shape
from training.evaluation import EvaluateConfig, dev_references, evaluate_checkpoint
from training.loop import train_loop_per_worker
from training.models import model_config
from training.progress import figures_line, log, plot_curves
from training.rows import row_groups


@dataclass
class RunPlan:
    """What a run reads and starts from, checked before Ray starts (`check_run`): jobs/train.py's --dry-run prints
    it, `run` trains from it."""

    manifest: dict
    task: str
    metric: str
    train_groups: list
    train_rows: int
    dev_paths: list
    dev_columns: list
    test_paths: list
    test_columns: list
    total_steps: int
    vectors: str | None
    model_config: Any  # the model's config dataclass (each model has its own)
    init_from: str | None = None
    init_chosen: str | None = None  # why init_from is the checkpoint (`checkpoints.choose_checkpoint`)
    pretrained: dict | None = None
    # what a resume must share with the run it resumes (kept in every checkpoint's config.json): the data's manifest
    # without the folders it names, and the state.pt sha256 of the checkpoint --init-from resolved to
    data_path_free_sha256: str | None = None
    init_checkpoint_sha256: str | None = None
    resume_from: str | None = None  # the checkpoint a resume starts from (the latest intact one)
    damaged_latest: str | None = None  # Ray Train's latest checkpoint, where it is damaged


def worker_cpus(cfg: TrainConfig, cpus: float) -> float:
    """The CPUs each training worker reserves on a cluster of `cpus`: --cpus-per-worker, else a share that leaves
    Ray Data's reads a CPU (a quarter at least, four at most)."""
    return cfg.cpus_per_worker or max(0.25, min(4.0, (cpus - 1) / cfg.num_workers))


def check_workers_fit(cfg: TrainConfig, num_cpus: int | None = None) -> None:
    """The workers fit the local Ray a job run directly starts (--num-cpus, else every core; this machine's GPUs):
    Ray Train waited for ever otherwise, its worker group timing out and starting again every minute."""
    from runtime.ray_env import check_fits_local_ray, local_cpus

    options = "--num-workers, --cpus-per-worker"
    cpus = worker_cpus(cfg, local_cpus(num_cpus))
    option = "--cpus-per-worker" if cfg.cpus_per_worker else "--num-workers"
    check_fits_local_ray(option, cfg.num_workers, "worker", options, cpus=cpus, num_cpus=num_cpus)
    if cfg.use_gpu:
        options = "--num-workers, --gpus-per-worker"
        check_fits_local_ray("--use-gpu", cfg.num_workers, "worker", options, gpus=cfg.gpus_per_worker)


def check_run(cfg: TrainConfig, log=log) -> RunPlan:
    """Everything a run would refuse before training, checked without Ray: the data (manifest, splits, shards
    against the manifest, rows enough for the workers), word vectors, --init-from, the model configuration, and
    the run folder (a folder of something else, the data or a folder inside it, or the --init-from run, is
    refused; a damaged latest checkpoint is reported and the newest intact one chosen; a checkpoint of another
    model or configuration, or of other data or another start, is refused)."""
    from pipelines.shards import check_vocabulary, path_free_sha256, read_manifest, shard_paths

    manifest = read_manifest(cfg.data)
    check_data_fits_model(cfg, manifest)
    task = data_task(manifest)
    metric = select_metric(cfg, task)
    for split in ("train", "dev") + ((cfg.test_split,) if cfg.test_split else ()):
        if split not in manifest["splits"]:
            flag = " (--test-split)" if split == cfg.test_split and split not in ("train", "dev") else ""
            raise UsageError(
                f"{cfg.data}: manifest.json has no {split!r} split{flag}; it has "
                f"{', '.join(sorted(manifest['splits']))}"
            )
    check_vocabulary(cfg.data, manifest)
    train_paths, _ = shard_paths(os.path.abspath(cfg.data), "train")
    train_groups = row_groups(train_paths)
    train_rows = sum(rows for *_, rows in train_groups)
    if train_rows // cfg.num_workers == 0:
        raise UsageError(
            f"{cfg.data}: {train_rows} train rows cannot be shared by {cfg.num_workers} workers (--num-workers)"
        )
    dev_paths, dev_schema = shard_paths(os.path.abspath(cfg.data), "dev")
    test_paths: list[str] = []
    test_columns: list[str] = []
    if cfg.test_split:
        test_paths, test_schema = shard_paths(os.path.abspath(cfg.data), cfg.test_split)
        test_columns = test_schema.names
    vectors = embeddings_path(cfg)
    shape = embeddings_shape(vectors, manifest.get("vocab_size")) if vectors else None
    init_from, pretrained, init_chosen = pretrained_config(cfg, manifest) if cfg.init_from else (None, None, None)
    try:
        config = model_config(
            cfg, manifest.get("vocab_size"), shape[1] if shape else None, data_fields(manifest), pretrained
        )
    except (TypeError, ValueError, AssertionError) as error:  # options that conflict, or a model option out of range
        raise UsageError(str(error)) from None
    if cfg.encoder_path:  # the parser only resolves its names: the folder is checked here, for --dry-run too
        from qa_models.encoders import encoder_name, require_encoder

        length = getattr(config, "max_len", None)  # --max-len, else the model's (a --model-option, a pretraining's)
        try:
            require_encoder(cfg.encoder_path, length, "--max-len" if cfg.max_len else "the model's max_len")
        except (ImportError, FileNotFoundError, ValueError) as error:
            raise UsageError(f"--encoder-path {encoder_name(cfg.encoder_path)}: {error}") from None
    plan = RunPlan(
        manifest=manifest,
        task=task,
        metric=metric,
        train_groups=train_groups,
        train_rows=train_rows,
        dev_paths=dev_paths,
        dev_columns=dev_schema.names,
        test_paths=test_paths,
        test_columns=test_columns,
        total_steps=total_steps_for(cfg, manifest["splits"]["train"]["rows"]),
        vectors=os.path.abspath(vectors) if vectors else None,
        model_config=config,
        init_from=init_from,
        init_chosen=init_chosen,
        pretrained=pretrained,
        data_path_free_sha256=path_free_sha256(manifest),
        init_checkpoint_sha256=state_sha256(init_from) if init_from else None,
    )
    check_run_folder(cfg, plan, log)
    return plan


# What a run folder of jobs/train.py holds: Ray Train's files (checkpoints, its snapshot, its storage marker) and
# ours (TensorBoard events, the curve, --test-split's predictions), or what a kill left of them half written.
RUN_FOLDER_PREFIXES = ("checkpoint_", ".validate_storage_marker", "tensorboard", "training_curve.png")


def _run_artefact(name: str) -> bool:
    return name.startswith(RUN_FOLDER_PREFIXES) or "_predictions.jsonl" in name


def check_run_folder(cfg: TrainConfig, plan: RunPlan, log) -> None:
    """The run folder STORAGE/NAME: refused where it is, holds or lies inside --data (a new tokenisation there
    would delete it), where it holds the checkpoint --init-from names (the run would resume that run, not start
    from it, and rotate its checkpoints away), or where it holds files that are not a run's; where it holds
    checkpoints, the one a resume starts from (Ray Train's latest, or the newest intact one before it, reported)
    must be of the same model and model configuration, trained on the same data from the same start."""
    from pipelines.atomic import check_folder_can_be_made, real_path, within_folder

    run = run_dir(cfg)
    local = "://" not in run
    where = f"--storage-path {cfg.storage_path} --name {cfg.name}"
    if local:  # else Ray Train's controller dies at start (ActorDiedError), far from the option's name
        check_folder_can_be_made(run, where)
    if local and within_folder(real_path(cfg.data), real_path(run)):
        raise UsageError(f"{where}: the run folder {run} is or holds --data {cfg.data}")
    if local and within_folder(real_path(run), real_path(cfg.data)):
        raise UsageError(
            f"{where}: the run folder {run} lies inside --data {cfg.data}, where tokenising again would delete "
            "it; put runs beside the data"
        )
    if (
        local
        and plan.init_from
        and "://" not in plan.init_from
        and within_folder(real_path(plan.init_from), real_path(run))
    ):
        raise UsageError(
            f"{where}: the run folder {run} holds --init-from's checkpoint {plan.init_from}; this run would resume "
            "that run instead of starting from it, and rotate its checkpoints away: choose another --name"
        )
    if local and os.path.isdir(run):
        strangers = [name for name in sorted(os.listdir(run)) if not _run_artefact(name)]
        if strangers:
            raise UsageError(
                f"--storage-path {cfg.storage_path} --name {cfg.name}: {run} holds {strangers[0]!r} "
                f"({len(strangers)} such entries), so it is not a run folder of jobs/train.py; choose "
                "another --name"
            )
    if not run_checkpoints(run):
        return
    try:
        latest = run_result(run).checkpoint
    except Exception:  # no snapshot yet: Ray Train starts the run afresh
        return
    if latest is None:
        return
    plan.resume_from = usable_checkpoint(latest.path, log)
    if plan.resume_from != latest.path:
        plan.damaged_latest = latest.path
    check_resume(cfg, plan, run, checkpoint_summary(plan.resume_from))


def check_resume(cfg: TrainConfig, plan: RunPlan, run: str, saved: dict) -> None:
    """A resume continues the run in `run` (its checkpoint's config.json: `saved`) only as the same run: the same
    model and model configuration, on the data it trained on (its manifest without the folders it names; a
    checkpoint from before that was kept: its vocabulary) and from the start it began from (none, or the same
    --init-from checkpoint, by its state.pt sha256): otherwise the run's steps would mix two models, data sets or
    starts under one name."""
    step = saved.get("step", "?")
    remedy = "choose another --name, or remove the folder to start over"
    if saved["train"]["model"] != cfg.model:
        raise UsageError(
            f"--name {cfg.name}: {run} holds a {saved['train']['model']} run (step {step}), this command "
            f"trains {cfg.model}; {remedy}"
        )
    held = f"--name {cfg.name}: {run} holds a {cfg.model} run (step {step})"
    ours_config = asdict(plan.model_config)
    differ = [
        f"{key} {saved['model_config'][key]!r} there, {ours_config[key]!r} here"
        for key in sorted(ours_config)
        if key in saved.get("model_config", {}) and saved["model_config"][key] != ours_config[key]
    ]
    if differ:
        raise UsageError(
            f"{held} of another model configuration ({'; '.join(differ[:3])}); a resume needs the same one: {remedy}"
        )
    theirs, ours = saved.get("data_path_free_sha256"), plan.data_path_free_sha256
    field = "manifest"
    if not theirs:  # a checkpoint from before data_path_free_sha256 was kept
        theirs, ours, field = saved.get("vocab_sha256"), plan.manifest.get("vocab_sha256"), "vocabulary"
    if theirs and ours and theirs != ours:
        raise UsageError(
            f"{held} trained on other data than --data {cfg.data} (its {field}'s sha256 {theirs[:12]} there, "
            f"{ours[:12]} here; it read {saved['train'].get('data')}); a resume needs the same data: {remedy}"
        )
    began = saved["train"].get("init_from")
    if bool(began) != bool(plan.init_from):
        there = f"from --init-from {began}" if began else "from scratch"
        here = f"from --init-from {cfg.init_from}" if plan.init_from else "from scratch"
        raise UsageError(f"{held} that started {there}, this command starts {here}; {remedy}")
    theirs, ours = saved.get("init_checkpoint_sha256"), plan.init_checkpoint_sha256
    if theirs and ours and theirs != ours:
        raise UsageError(
            f"{held} that started from another checkpoint than --init-from {cfg.init_from} resolves to "
            f"{plan.init_from} (state.pt sha256 {theirs[:12]} there, {ours[:12]} here; it named {began}); "
            f"a resume needs the same start: {remedy}"
        )


def run(cfg: TrainConfig, plan: RunPlan | None = None) -> dict:
    """Train (or resume) on the connected Ray cluster; return the job's summary. `plan`: `check_run(cfg)`, done
    here when not given. SIGINT or SIGTERM (Ctrl-C, `ray job stop`, a preempted head) makes the workers save a
    checkpoint at their next step and stop: the summary then says `interrupted`."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from runtime.ray_env import train_log_level

    plan = plan or check_run(cfg)
    manifest, task, metric = plan.manifest, plan.task, plan.metric
    train_groups, train_rows, vectors = plan.train_groups, plan.train_rows, plan.vectors
    dev_paths, total_steps = plan.dev_paths, plan.total_steps
    init_from, pretrained = plan.init_from, plan.pretrained

    cpus = float(ray.cluster_resources().get("CPU", 1))
    per_worker = worker_cpus(cfg, cpus)
    resources = {"CPU": per_worker}
    # The workers' Ray Data reads need a CPU of their own; where the workers reserve the whole cluster (one worker
    # with every core of a laptop) the reads reserve none rather than wait forever, and share the workers' cores.
    read_cpus = max(0.0, min(1.0, cpus - per_worker * cfg.num_workers))
    if cfg.use_gpu:
        resources["GPU"] = cfg.gpus_per_worker
    storage = os.path.abspath(cfg.storage_path) if "://" not in cfg.storage_path else cfg.storage_path
    # Workers run in the Ray session's artifacts folder: a relative path there names another place (TensorBoard
    # logs and predictions written under it were lost in /tmp/ray/session_*/artifacts).
    cfg = dataclasses.replace(cfg, storage_path=storage)
    stop_key = new_key()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "train": asdict(cfg),
            "total_steps": total_steps,
            "batches_per_epoch": batches_per_epoch_for(cfg, manifest["splits"]["train"]["rows"]),
            "train_row_groups": train_groups,
            "train_rows": train_rows,
            "dev_paths": dev_paths,
            "dev_columns": plan.dev_columns,
            "test_paths": plan.test_paths,
            "test_columns": plan.test_columns,
            "vocab_size": manifest.get("vocab_size", 0),
            "embeddings": vectors,
            "select_metric": metric,
            "from_data": data_fields(manifest),
            "init_from": init_from,
            "init_chosen": plan.init_chosen,
            "pretrained_config": pretrained,
            "data_path_free_sha256": plan.data_path_free_sha256,
            "init_checkpoint_sha256": plan.init_checkpoint_sha256,
            "vocab_sha256": manifest.get("vocab_sha256"),
            "vocab_path": os.path.join(os.path.abspath(cfg.data), "vocab.json"),
            # how the data's text became tokens: what a checkpoint's user needs to feed it new text
            "text": {"tokenizer": manifest.get("tokenizer"), "lowercase": manifest.get("lowercase", True)},
            "max_context": manifest.get("max_context_tokens"),
            "read_cpus": read_cpus,
            "log_level": train_log_level(),
            "stop_key": stop_key,
            "resume_from": plan.resume_from,
            "damaged_latest": plan.damaged_latest,
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker=resources
        ),
        torch_config=TorchConfig(backend=cfg.collective_backend()),
        run_config=ray.train.RunConfig(
            name=cfg.name,
            storage_path=storage,
            # The best by dev metric are kept, and Ray Train always keeps the latest too (what a resume needs).
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=cfg.keep_checkpoints, checkpoint_score_attribute=SCORE, checkpoint_score_order="max"
            ),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            # Ray Train v2's RunConfig (what `ray.train` gives at run time) takes it; the stubs are v1's
            logging_config=ray.train.LoggingConfig(log_level=train_log_level()),  # type: ignore[call-arg]
        ),
    )
    result, interrupted = fit_until_signalled(trainer, stop_key, log)
    metrics = result.metrics or {}
    dev = metrics.get("dev", {})
    best = None
    scored = best_scored(result)
    if scored:
        checkpoint, best_metrics = scored
        best = {
            "checkpoint": checkpoint.path,
            "step": best_metrics["step"],
            "metric": metric,
            "value": best_metrics.get("dev", {}).get(metric, best_metrics[SCORE]),
            "dev": {k: v for k, v in best_metrics.get("dev", {}).items() if k != "skipped"},
        }
    test = held_out_figures(cfg, result, best) if cfg.test_split and not interrupted else None
    curve_png = run_dir(cfg) + "/training_curve.png"
    with tempfile.TemporaryDirectory() as directory:
        local = os.path.join(directory, "training_curve.png")
        plot_curves(
            metrics.get("curve", []),
            metrics.get("dev_history", []),
            metric,
            local,
            f"{cfg.model} on {os.path.basename(os.path.normpath(cfg.data))} ({cfg.name})",
        )
        publish(local, curve_png)
    return {
        "model": cfg.model,
        "embeddings": vectors,
        "init_from": init_from,
        "steps": metrics.get("step", 0),
        "resumed_from_step": metrics.get("resumed_from_step", 0),
        "trained_seconds": metrics.get("trained_seconds"),
        "resumed_trained_seconds": metrics.get("resumed_trained_seconds", 0.0),
        "task": task,
        "metrics": {name: dev.get(name) for name in TASK_METRICS[task] + ("questions",)},
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        "best": best,
        "training_curve": curve_png,
        "tensorboard": run_dir(cfg) + "/tensorboard",
        "examples_per_s": metrics.get("examples_per_s"),
        "timed_window": metrics.get("timed_window"),  # wall-clock [start, end] of examples_per_s's steps
        "progress_times": metrics.get("progress_times"),  # [step, time] at each progress line since the start
        "backend": cfg.collective_backend(),
        "precision": metrics.get("precision"),  # as trained (fp32, bf16 or fp16), --precision auto resolved
        "device": metrics.get("device"),
        "stopped_early": metrics.get("stopped_early", False),
        "test": test,
        "loss_curve": metrics.get("curve", []),
        "total_steps": total_steps,
        "interrupted": interrupted,
        "references": (
            dev_references(dev_paths, cfg.eval_policy, cfg.seed) if task == "ranking" and not interrupted else None
        ),
    }


def held_out_figures(cfg: TrainConfig, result, best: dict | None) -> dict:
    """--test-split scored with the best checkpoint's weights (the latest when dev gives no figure): rank 0's
    figures at the last step when that step is the best (the records lie in its checkpoint); otherwise this process
    scores the best checkpoint, as jobs/evaluate.py would, and puts the records in the run folder. Returns split,
    step, checkpoint, rows, metrics (and policy), and `predictions`: where the per-question records are."""
    split = cfg.test_split
    if not split:
        raise ValueError("held_out_figures needs --test-split")
    final = result.metrics or {}
    chosen = best["checkpoint"] if best else (result.checkpoint.path if result.checkpoint else None)
    if chosen is None:
        raise RuntimeError(f"{run_dir(cfg)}: the run left no checkpoint to score {split!r} with")
    name = predictions_name(split)
    if final.get("test") and (best is None or best["step"] == final["test"]["step"]):
        return dict(
            final["test"],
            checkpoint=result.checkpoint.path,
            predictions=result.checkpoint.path.rstrip("/") + "/" + name,
        )
    summary, records = evaluate_checkpoint(EvaluateConfig(checkpoint=chosen, data=cfg.data, split=split))
    log(f"[train] best checkpoint (step {summary['step']}) {split} {figures_line(summary['metrics'])}")
    destination = run_dir(cfg) + "/" + name
    with tempfile.TemporaryDirectory() as directory:
        write_jsonl(records, os.path.join(directory, name))
        publish(os.path.join(directory, name), destination)
    figures = {k: summary[k] for k in ("policy", "rows", "metrics") if k in summary}
    return dict(figures, split=cfg.test_split, step=summary["step"], checkpoint=chosen, predictions=destination)

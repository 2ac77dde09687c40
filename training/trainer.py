"""The driver of a training run, and the only place that starts Ray Train: checks the data against the model,
sizes the workers, runs `training.loop.train_loop_per_worker` under a TorchTrainer (checkpoints kept by dev
metric, failures retried), then scores --test-split with the best checkpoint and writes the curve."""
from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import asdict

from training.checkpoints import (SCORE, predictions_name, pretrained_config, publish, run_dir, scored_checkpoints,
                                  write_jsonl)
from training.config import (TASK_METRICS, TrainConfig, batches_per_epoch_for, data_fields, data_task, select_metric,
                             total_steps_for)
from training.data import check_data_fits_model, embeddings_path, embeddings_shape, read_manifest
from training.evaluation import EvaluateConfig, dev_references, evaluate_checkpoint
from training.loop import train_loop_per_worker
from training.progress import figures_line, log, plot_curves
from training.rows import row_groups


def run(cfg: TrainConfig) -> dict:
    """Train (or resume) on the connected Ray cluster; return the job's summary."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from pipelines.shards import shard_paths
    from runtime.ray_env import train_log_level

    manifest = read_manifest(cfg.data)
    check_data_fits_model(cfg, manifest)
    task = data_task(manifest)
    metric = select_metric(cfg, task)
    init_from, pretrained = pretrained_config(cfg, manifest) if cfg.init_from else (None, None)
    for split in ("train", "dev"):
        if split not in manifest["splits"]:
            raise FileNotFoundError(f"{cfg.data}: manifest.json has no {split!r} split")
    train_paths, _ = shard_paths(os.path.abspath(cfg.data), "train")
    train_groups = row_groups(train_paths)
    train_rows = sum(rows for *_, rows in train_groups)
    if train_rows // cfg.num_workers == 0:
        raise ValueError(f"{cfg.data}: {train_rows} train rows cannot be shared by {cfg.num_workers} workers")
    dev_paths, dev_schema = shard_paths(os.path.abspath(cfg.data), "dev")
    test_paths, test_columns = [], []
    if cfg.test_split:
        if cfg.test_split not in manifest["splits"]:
            raise FileNotFoundError(f"{cfg.data}: manifest.json has no {cfg.test_split!r} split (--test-split); "
                                    f"it has {', '.join(sorted(manifest['splits']))}")
        test_paths, test_schema = shard_paths(os.path.abspath(cfg.data), cfg.test_split)
        test_columns = test_schema.names
    total_steps = total_steps_for(cfg, manifest["splits"]["train"]["rows"])
    vectors = embeddings_path(cfg)
    if vectors:
        embeddings_shape(vectors, manifest.get("vocab_size"))
        vectors = os.path.abspath(vectors)

    cpus = float(ray.cluster_resources().get("CPU", 1))
    per_worker = cfg.cpus_per_worker or max(0.25, min(4.0, (cpus - 1) / cfg.num_workers))
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
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": asdict(cfg), "total_steps": total_steps,
                           "batches_per_epoch": batches_per_epoch_for(cfg, manifest["splits"]["train"]["rows"]),
                           "train_row_groups": train_groups, "train_rows": train_rows,
                           "dev_paths": dev_paths, "dev_columns": dev_schema.names,
                           "test_paths": test_paths, "test_columns": test_columns,
                           "vocab_size": manifest.get("vocab_size", 0), "embeddings": vectors,
                           "select_metric": metric, "from_data": data_fields(manifest),
                           "init_from": init_from, "pretrained_config": pretrained,
                           "vocab_sha256": manifest.get("vocab_sha256"),
                           "vocab_path": os.path.join(os.path.abspath(cfg.data), "vocab.json"),
                           "max_context": manifest.get("max_context_tokens"), "read_cpus": read_cpus,
                           "log_level": train_log_level()},
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=cfg.name, storage_path=storage,
            # The best by dev metric are kept, and Ray Train always keeps the latest too (what a resume needs).
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints,
                                                         checkpoint_score_attribute=SCORE,
                                                         checkpoint_score_order="max"),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            logging_config=ray.train.LoggingConfig(log_level=train_log_level())),
    )
    result = trainer.fit()
    metrics = result.metrics or {}
    dev = metrics.get("dev", {})
    best = None
    scored = scored_checkpoints(result)
    if scored:
        checkpoint, best_metrics = max(scored, key=lambda pair: pair[1][SCORE])
        best = {"checkpoint": checkpoint.path, "step": best_metrics["step"], "metric": metric,
                "value": best_metrics[SCORE]}
    test = held_out_figures(cfg, result, best) if cfg.test_split else None
    curve_png = run_dir(cfg) + "/training_curve.png"
    with tempfile.TemporaryDirectory() as directory:
        local = os.path.join(directory, "training_curve.png")
        plot_curves(metrics.get("curve", []), metrics.get("dev_history", []), metric, local,
                    f"{cfg.model} on {os.path.basename(os.path.normpath(cfg.data))} ({cfg.name})")
        publish(local, curve_png)
    return {"model": cfg.model, "embeddings": vectors, "init_from": init_from, "steps": metrics.get("step", 0),
            "resumed_from_step": metrics.get("resumed_from_step", 0),
            "trained_seconds": metrics.get("trained_seconds"),
            "resumed_trained_seconds": metrics.get("resumed_trained_seconds", 0.0),
            "task": task, "metrics": {name: dev.get(name) for name in TASK_METRICS[task] + ("questions",)},
            "checkpoint": result.checkpoint.path if result.checkpoint else None,
            "best": best, "training_curve": curve_png, "tensorboard": run_dir(cfg) + "/tensorboard",
            "examples_per_s": metrics.get("examples_per_s"), "stopped_early": metrics.get("stopped_early", False),
            "test": test, "loss_curve": metrics.get("curve", []),
            "references": dev_references(dev_paths, cfg.eval_policy, cfg.seed) if task == "ranking" else None}


def held_out_figures(cfg: TrainConfig, result, best: dict | None) -> dict:
    """--test-split scored with the best checkpoint's weights (the latest when dev gives no figure): rank 0's
    figures at the last step when that step is the best (the records lie in its checkpoint); otherwise this process
    scores the best checkpoint, as jobs/evaluate.py would, and puts the records in the run folder. Returns split,
    step, checkpoint, rows, metrics (and policy), and `predictions`: where the per-question records are."""
    final = result.metrics or {}
    chosen = best["checkpoint"] if best else (result.checkpoint.path if result.checkpoint else None)
    if chosen is None:
        raise RuntimeError(f"{run_dir(cfg)}: the run left no checkpoint to score {cfg.test_split!r} with")
    name = predictions_name(cfg.test_split)
    if final.get("test") and (best is None or best["step"] == final["test"]["step"]):
        return dict(final["test"], checkpoint=result.checkpoint.path,
                    predictions=result.checkpoint.path.rstrip("/") + "/" + name)
    summary, records = evaluate_checkpoint(EvaluateConfig(checkpoint=chosen, data=cfg.data, split=cfg.test_split))
    log(f"[train] best checkpoint (step {summary['step']}) {cfg.test_split} {figures_line(summary['metrics'])}")
    destination = run_dir(cfg) + "/" + name
    with tempfile.TemporaryDirectory() as directory:
        write_jsonl(records, os.path.join(directory, name))
        publish(os.path.join(directory, name), destination)
    figures = {k: summary[k] for k in ("policy", "rows", "metrics") if k in summary}
    return dict(figures, split=cfg.test_split, step=summary["step"], checkpoint=chosen, predictions=destination)

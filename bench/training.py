"""Training throughput under Ray Train against a plain PyTorch loop, and checkpoint cost against model size.

    python bench/training.py [--data TOKENISED_DIR] [--models gsamn,ggsa,ctrn,iarnn-gate,qa-lstm|all]
        [--steps 60] [--workers 1,2] [--json bench/training.json]

For each answer-selection model, in one run on this machine, over the same tokenised shards (default: WikiQA
from ../shared/data, tokenised into a temporary folder first), the same batch size and the model's paper
defaults at --dim:
- plain: one process, no Ray Train: the batches the training loop's single worker gets (its rows through Ray Data
  and the same seeded pools, `training.rows.epoch_batches`), its Batcher, then forward,
  loss, backward, clipping and an AdamW step; with 1 torch thread and with every core;
- ray-N: jobs/train.py's loop under Ray Train with N workers of one CPU each (DDP over Gloo), fed by Ray Data;
  the local Ray gets N + 1 logical CPUs, so that Ray Data keeps one (on a 2-core machine, 2 workers share the
  cores with it).
Throughput is examples per second over the steps after the first (start-up, the data pipeline's first batch
and the final evaluation excluded: the run's `examples_per_s`); `wall_s` is the whole run, start-up included.
Ratios are over the plain 1-thread loop.

Padding: the share of padded positions in an epoch of train batches, without length buckets and with 8 and 32.

Checkpoints: for GSAMN at several widths, the state a checkpoint holds (model and AdamW moments after one step)
saved with torch.save to a staging file, fsynced and renamed, then loaded back into a fresh model and optimiser:
size, seconds and MB/s each way.

The last line is one JSON object (also written to --json, default bench/training.json): `throughput` per model
and setting, `padding`, `checkpoints`.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # bench/tokenize.py would shadow the standard library's tokenize
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse
import json
import logging
import platform
import tempfile
import time

from bench.report import check_result_file, write_result

DEFAULT_MODELS = ("gsamn", "ggsa", "ctrn", "iarnn-gate", "qa-lstm")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("QA_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))


def _log(message: str) -> None:
    print(f"[bench-training] {message}", file=sys.stderr, flush=True)


def tokenised_wikiqa(folder: str) -> str:
    from pipelines.tokenize import TokenizeConfig, write

    source = os.path.join(SHARED_DATA, "wikiqa")
    if not os.path.isdir(source):
        raise SystemExit(f"{source} not found: pass --data, a folder written by jobs/tokenize_corpora.py")
    out = os.path.join(folder, "wikiqa")
    write(TokenizeConfig(dataset="wikiqa", input=source, output=out))
    return out


def plain_loop(cfg, manifest: dict, steps: int, threads: int) -> dict:
    """Examples per second of a single-process loop: the Batcher, forward, loss, backward, AdamW step."""
    import torch

    from pipelines.shards import shard_paths
    from training.config import data_fields
    from training.data import Batcher
    from training.models import build_model
    from training.rows import epoch_batches, row_groups, worker_rows

    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, manifest.get("vocab_size", 0), None, data_fields(manifest), None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.resolved_lr(), weight_decay=cfg.weight_decay)
    batcher = Batcher(cfg, model.inputs, getattr(model, "objective", None), getattr(model.config, "max_len", None))
    groups = row_groups(shard_paths(os.path.abspath(cfg.data), "train")[0])
    start, stop = worker_rows(sum(rows for *_, rows in groups), 1, 0)
    model.train()
    started, timed_from, done, epoch = time.time(), None, 0, 0
    while done <= steps:
        for _, batch in epoch_batches(
            groups, start, stop, cfg, epoch, 0, batcher.length_key, group="qid" if batcher.pairwise else None
        ):
            inputs, labels = batcher(batch, train=True)
            loss = model.loss(model(**inputs), labels)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == 1:
                timed_from = time.time()
            if done > steps:
                break
        epoch += 1
    elapsed = time.time() - timed_from
    return {"examples_per_s": round(steps * cfg.batch_size / elapsed, 1), "wall_s": round(time.time() - started, 2)}


def ray_run(cfg, workers: int, storage: str) -> dict:
    from dataclasses import replace

    from training.trainer import run

    started = time.time()
    summary = run(
        replace(cfg, num_workers=workers, cpus_per_worker=1, storage_path=storage, name=f"{cfg.model}-{workers}")
    )
    return {
        "examples_per_s": round(summary["examples_per_s"], 1),
        "wall_s": round(time.time() - started, 2),
        "steps": summary["steps"],
    }


def padding_shares(data: str, batch_size: int, windows: list[int]) -> list[dict]:
    """Share of padded positions in one epoch of a single worker's train batches, as GSAMN reads them (question
    <sep> answer, capped at 256) and as the siamese models read the longer of question and answer, without
    length buckets and with --length-buckets N: what bucketing saves before any model runs."""
    import numpy as np

    from pipelines.shards import shard_paths
    from training.config import TrainConfig
    from training.data import Batcher, row_lengths
    from training.rows import epoch_batches, row_groups

    groups = row_groups(shard_paths(data, "train")[0])
    total = sum(rows for *_, rows in groups)
    rows = []
    for window in windows:
        cfg = TrainConfig(model="gsamn", data=data, batch_size=batch_size, length_buckets=window)
        joint = Batcher(cfg, "joint")
        batches = (batch for _, batch in epoch_batches(groups, 0, total, cfg, 0, 0, joint.length_key))
        real = {"joint": 0, "separate": 0}
        padded = {"joint": 0, "separate": 0}
        for batch in batches:
            lengths = joint.length_key(batch) + 1  # the <sep>
            real["joint"] += int(lengths.sum())
            padded["joint"] += int(lengths.max()) * len(lengths)
            for column in ("question_ids", "answer_ids"):
                lengths = np.minimum(row_lengths(batch[column]), 256)
                real["separate"] += int(lengths.sum())
                padded["separate"] += int(lengths.max()) * len(lengths)
        rows.append(
            {"length_buckets": window, **{f"{k}_padding_share": round(1 - real[k] / padded[k], 3) for k in real}}
        )
        _log(f"padding: {json.dumps(rows[-1])}")
    return rows


def checkpoint_costs(dims: list[int], vocab_size: int, folder: str) -> list[dict]:
    import torch

    from training.config import TrainConfig
    from training.models import build_model

    rows = []
    for dim in dims:
        cfg = TrainConfig(model="gsamn", data="", dim=dim)
        model = build_model(cfg, vocab_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for parameter in model.parameters():  # one step, so that the optimiser holds its moments
            parameter.grad = torch.ones_like(parameter)
        optimizer.step()
        path = os.path.join(folder, f"state-{dim}.pt")
        started = time.perf_counter()
        staged = path + ".partial"
        with open(staged, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, path)
        saved = time.perf_counter() - started
        fresh = build_model(cfg, vocab_size)
        fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        started = time.perf_counter()
        state = torch.load(path, map_location="cpu", weights_only=True)
        fresh.load_state_dict(state["model"])
        fresh_optimizer.load_state_dict(state["optimizer"])
        restored = time.perf_counter() - started
        megabytes = os.path.getsize(path) / 1e6
        parameters = sum(p.numel() for p in model.parameters())
        rows.append(
            {
                "model": "gsamn",
                "dim": dim,
                "parameters": parameters,
                "mb": round(megabytes, 1),
                "save_s": round(saved, 3),
                "restore_s": round(restored, 3),
                "save_mb_per_s": round(megabytes / saved, 1),
                "restore_mb_per_s": round(megabytes / restored, 1),
            }
        )
        _log(f"checkpoint gsamn dim {dim}: {json.dumps(rows[-1])}")
        os.remove(path)
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="tokenised answer-selection folder (default: WikiQA, tokenised here)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated registry names, or all")
    p.add_argument("--dim", type=int, default=96, help="model width (a multiple of GGSA's 6 heads)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=60, help="timed steps per setting (after one warm-up step)")
    p.add_argument("--workers", default="1,2", help="Ray Train worker counts")
    p.add_argument("--checkpoint-dims", default="64,256,768", help="GSAMN widths for the checkpoint timings")
    p.add_argument("--json", default=os.path.join(REPO, "bench", "training.json"), help="where to write the figures")
    args = p.parse_args(argv)
    check_result_file(p, args.json, "throughput")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from pipelines.shards import read_manifest
    from qa_models import MODELS
    from runtime.ray_env import init_local_ray
    from training.config import TrainConfig

    models = [m for m in MODELS if MODELS[m].inputs != "passages"] if args.models == "all" else args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}")
    workers = [int(w) for w in args.workers.split(",")]
    cores = os.cpu_count() or 1
    folder = tempfile.mkdtemp(prefix="bench-training-")
    init_local_ray(
        num_cpus=max(workers) + 1, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
    )
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    data = args.data or tokenised_wikiqa(folder)
    manifest = read_manifest(data)
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": cores, "torch": torch.__version__},
        "data": data,
        "train_rows": manifest["splits"]["train"]["rows"],
        "dim": args.dim,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "throughput": {},
    }
    for model in models:
        cfg = TrainConfig(
            model=model, data=data, dim=args.dim, batch_size=args.batch_size, max_steps=args.steps + 1, seed=0
        )
        figures = {"plain-1-thread": plain_loop(cfg, manifest, args.steps, 1)}
        if cores > 1:
            figures[f"plain-{cores}-threads"] = plain_loop(cfg, manifest, args.steps, cores)
        for n in workers:
            figures[f"ray-{n}"] = ray_run(cfg, n, os.path.join(folder, "runs"))
        base = figures["plain-1-thread"]["examples_per_s"]
        for entry in figures.values():
            entry["vs_plain_1_thread"] = round(entry["examples_per_s"] / base, 2)
        result["throughput"][model] = figures
        _log(
            f"{model}: "
            + "  ".join(f"{k} {v['examples_per_s']} ex/s ({v['vs_plain_1_thread']}x)" for k, v in figures.items())
        )
    result["padding"] = padding_shares(data, args.batch_size, [0, 8, 32])
    dims = [int(d) for d in args.checkpoint_dims.split(",") if d]
    result["checkpoints"] = checkpoint_costs(dims, manifest.get("vocab_size", 0), folder)
    write_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

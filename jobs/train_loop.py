"""The Ray Train glue, in one place: the per-worker training loop, checkpoints, and the trainer.

Models stay plain PyTorch (`qa_models`); this module feeds them Parquet shards through Ray Data, runs AdamW
with linear warm-up over the first 10% of steps and linear decay (the GSAMN paper's schedule), reports dev
MAP/MRR/P@1, and checkpoints model, optimiser, scheduler, RNG states, step and data position. A run is
resumed by running again with the same storage path and name (Ray Train V2 finds the latest checkpoint).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

STATE_FILE = "state.pt"


@dataclass
class TrainConfig:
    model: str
    data: str
    storage_path: str = "runs"
    name: str = "run"
    max_steps: int | None = None  # total optimiser steps; None: `epochs` passes over train
    epochs: int = 1
    batch_size: int = 32
    lr: float | None = None  # None: 5e-5 with a pretrained encoder (the paper), 1e-3 for word embeddings
    weight_decay: float = 0.01
    warmup: float = 0.1
    grad_clip: float = 1.0
    checkpoint_every: int | None = None  # steps; epoch ends always checkpoint
    keep_checkpoints: int = 2
    num_workers: int = 1
    cpus_per_worker: float | None = None  # None: sized from the cluster so Ray Data keeps a CPU
    use_gpu: bool = False
    gpus_per_worker: float = 1.0
    max_failures: int = 0
    seed: int = 0
    # None: the model's own default (its config class, the paper's value)
    max_len: int | None = None
    dim: int | None = None
    hops: int | None = None
    dropout: float | None = None
    encoder_path: str | None = None
    eval_policy: str = "clean"
    log_every: int = 20
    embeddings: str = "auto"  # word vectors: "auto" (DATA/embeddings.npy if there), "none", or a .npy path
    model_overrides: dict = field(default_factory=dict)

    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else (5e-5 if self.encoder_path else 1e-3)


def read_manifest(data: str) -> dict:
    path = os.path.join(data, "manifest.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not found; --data must be a folder written by jobs/tokenize_corpora.py")
    with open(path) as f:
        return json.load(f)


# The config field that is the width of a model's word embeddings, in the order looked for (GGSA and GSAMN have
# one width for embeddings and model; CTRN, IARNN and DynSAN project from their own embedding width).
EMBEDDING_WIDTH_FIELDS = ("embed_dim", "word_dim", "dim")


def embeddings_path(cfg: TrainConfig) -> str | None:
    """The word-vector file the model starts from (jobs/word_vectors.py's embeddings.npy), or None."""
    if cfg.embeddings == "none" or cfg.encoder_path:
        if cfg.encoder_path and cfg.embeddings not in ("auto", "none"):
            raise ValueError(f"--embeddings {cfg.embeddings} and --encoder-path exclude each other: a pretrained "
                             "transformer brings its own token embeddings")
        return None
    if cfg.embeddings == "auto":
        path = os.path.join(cfg.data, "embeddings.npy")
        return path if os.path.exists(path) else None
    if not os.path.exists(cfg.embeddings):
        raise FileNotFoundError(f"--embeddings {cfg.embeddings}: no such file (write one with jobs/word_vectors.py)")
    return cfg.embeddings


def embeddings_shape(path: str, vocab_size: int | None) -> tuple[int, int]:
    """(rows, width) of a word-vector file, checked against the vocabulary without reading the matrix."""
    try:
        matrix = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a .npy matrix ({error})") from error
    if matrix.ndim != 2 or not np.issubdtype(matrix.dtype, np.floating):
        raise ValueError(f"{path}: expected a float (vocab, dim) matrix, got {matrix.dtype} {matrix.shape}")
    if vocab_size and matrix.shape[0] != vocab_size:
        raise ValueError(f"{path}: {matrix.shape[0]} rows for a vocabulary of {vocab_size} (vectors written for "
                         "another tokenisation? rerun jobs/word_vectors.py on this --data)")
    return matrix.shape


def model_config(cfg: TrainConfig, vocab_size: int | None = None, vectors_dim: int | None = None):
    """The model's config: its own defaults (the paper's), then the general flags that were given and that it
    has, then --model-option values. With word vectors of width `vectors_dim`, the embedding width is theirs;
    without, embeddings are trained (a frozen table of random vectors would carry nothing) unless
    --model-option freeze_embeddings says otherwise."""
    from qa_models import MODELS

    if cfg.model not in MODELS:
        raise ValueError(f"unknown model {cfg.model!r}; registered: {sorted(MODELS)}")
    cls = MODELS[cfg.model]
    given = {"vocab_size": vocab_size, "dim": cfg.dim, "hops": cfg.hops, "dropout": cfg.dropout,
             "max_len": cfg.max_len, "encoder_path": cfg.encoder_path}
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    if cfg.encoder_path and "encoder_path" not in fields:
        raise ValueError(f"--model {cfg.model} reads word ids; --encoder-path is for models with a transformer")
    values = {**{k: v for k, v in given.items() if k in fields and v is not None}, **cfg.model_overrides}
    if vectors_dim is not None:
        width = next(name for name in EMBEDDING_WIDTH_FIELDS if name in fields)
        if values.get(width, vectors_dim) != vectors_dim:
            flag = "--dim" if width == "dim" and cfg.dim is not None else f"--model-option {width}"
            raise ValueError(f"{flag} {values[width]} conflicts with the {vectors_dim}-d word vectors "
                             f"({embeddings_path(cfg)}); drop it, or train without them (--embeddings none)")
        values[width] = vectors_dim
    elif "freeze_embeddings" in fields and "freeze_embeddings" not in cfg.model_overrides:
        values["freeze_embeddings"] = False
    return cls.config_class(**values)


def build_model(cfg: TrainConfig, vocab_size: int, vectors: np.ndarray | None = None):
    from qa_models import MODELS

    config = model_config(cfg, vocab_size, None if vectors is None else vectors.shape[1])
    return MODELS[cfg.model](config, embeddings=None if vectors is None else torch.from_numpy(vectors).float())


def warmup_linear(total_steps: int, warmup: float):
    warm = max(1, int(total_steps * warmup))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total_steps - step) / max(1, total_steps - warm))

    return factor


class Batcher:
    """Numpy batches from Ray Data to model inputs (the keyword arguments of the model's forward) and labels,
    for the vocabulary or a transformer's tokenizer, in the layout the model reads (`Model.inputs`); training
    batches of a pairwise model (`Model.objective`) are triplets with a negative answer per positive."""

    def __init__(self, cfg: TrainConfig, inputs: str = "joint", objective: str | None = None,
                 max_len: int | None = None):
        from qa_models.batching import TransformerPairs

        self.max_len = max_len or cfg.max_len or 256
        self.inputs, self.seed = inputs, cfg.seed
        self.pairwise = objective == "pairwise"
        self.transformer = TransformerPairs(cfg.encoder_path, self.max_len) if cfg.encoder_path else None

    def __call__(self, batch: dict, train: bool = False) -> tuple[dict, torch.Tensor]:
        from qa_models.batching import pair_batch, separate_batch, triplet_batch

        if train and self.pairwise:
            encoded = triplet_batch(batch["qid"], batch["question_ids"], batch["answer_ids"], batch["label"],
                                    self.max_len, self.seed)
        elif self.transformer is not None:
            encoded = self.transformer(batch["question"], batch["answer"], batch["label"])
        elif self.inputs == "separate":
            encoded = separate_batch(batch["question_ids"], batch["answer_ids"], batch["label"], self.max_len)
        else:
            encoded = pair_batch(batch["question_ids"], batch["answer_ids"], batch["label"], self.max_len)
        labels = encoded.pop("labels")
        return encoded, labels


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # stdout is kept for the job's final JSON line


def evaluate(model, batcher: Batcher, dataset, cfg: TrainConfig, device) -> dict:
    from qa_models.metrics import ranking_metrics

    model.eval()
    qids, labels, scores = [], [], []
    with torch.no_grad():
        for batch in dataset.iter_batches(batch_size=max(64, cfg.batch_size), batch_format="numpy"):
            inputs, _ = batcher(batch)
            logits = model(**{k: v.to(device) for k, v in inputs.items()})
            scores.extend(model.score(logits).float().cpu().tolist())
            labels.extend(batch["label"].tolist())
            qids.extend(batch["qid"].tolist())
    model.train()
    return ranking_metrics(qids, labels, scores, policy=cfg.eval_policy)


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import ray.train.torch

    cfg = TrainConfig(**config["train"])
    total_steps, vocab_size = config["total_steps"], config["vocab_size"]
    context = ray.train.get_context()
    rank = context.get_world_rank()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)

    vectors = np.load(config["embeddings"]) if config["embeddings"] else None
    model = build_model(cfg, vocab_size, vectors)
    del vectors
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg.resolved_lr(), betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(total_steps, cfg.warmup))
    step, epoch, batch_in_epoch, resumed_from, curve = 0, 0, 0, 0, []

    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, batch_in_epoch, curve = state["step"], state["epoch"], state["batch_in_epoch"], state["curve"]
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        resumed_from = step
        if rank == 0:
            _log(f"[train] resumed from step {step} (epoch {epoch}, batch {batch_in_epoch})")

    model = ray.train.torch.prepare_model(model)
    core = model.module if hasattr(model, "module") else model
    device = ray.train.torch.get_device()
    batcher = Batcher(cfg, core.inputs, getattr(core, "objective", None), getattr(core.config, "max_len", None))
    train_shard = ray.train.get_dataset_shard("train")
    dev = ray.train.get_dataset_shard("dev")

    def save(metrics: dict) -> None:
        metrics = dict(metrics, step=step, epoch=epoch, resumed_from_step=resumed_from, curve=curve)
        if rank != 0:
            ray.train.report(metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory() as directory:
            state = {"model": core.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "step": step, "epoch": epoch,
                     "batch_in_epoch": batch_in_epoch, "curve": curve, "config": asdict(cfg),
                     "vocab_size": vocab_size,
                     "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                             "python": random.getstate()}}
            torch.save(state, os.path.join(directory, STATE_FILE))
            with open(os.path.join(directory, "config.json"), "w") as f:
                json.dump({"train": asdict(cfg), "vocab_size": vocab_size, "step": step}, f, indent=2)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    def dev_metrics() -> dict:
        return evaluate(core, batcher, dev, cfg, device) if rank == 0 and dev is not None else {}

    started, window, window_loss = time.time(), 0, 0.0
    first_step = step
    while step < total_steps:
        skip = batch_in_epoch  # batches of this epoch consumed before a resume
        for index, batch in enumerate(train_shard.iter_batches(
                batch_size=cfg.batch_size, batch_format="numpy", local_shuffle_buffer_size=cfg.batch_size * 8,
                local_shuffle_seed=cfg.seed * 1000 + epoch)):
            if index < skip:
                continue
            inputs, labels = batcher(batch, train=True)
            logits = model(**{k: v.to(device) for k, v in inputs.items()})
            loss = core.loss(logits, labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            step += 1
            batch_in_epoch = index + 1
            window += 1
            window_loss += float(loss.detach())
            if step % cfg.log_every == 0 or step == total_steps:
                curve.append([step, window_loss / window])
                if rank == 0:
                    rate = (step - first_step) / max(1e-9, time.time() - started)
                    eta = (total_steps - step) / max(rate, 1e-9)
                    _log(f"[train] step {step}/{total_steps} epoch {epoch} loss {window_loss / window:.4f} "
                         f"lr {scheduler.get_last_lr()[0]:.2e} {rate * cfg.batch_size * cfg.num_workers:.1f} ex/s "
                         f"ETA {eta:.0f}s")
                window, window_loss = 0, 0.0
            if step >= total_steps:
                break
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                save({"loss": float(loss.detach())})
        else:  # the epoch ran out
            epoch += 1
            batch_in_epoch = 0
            if step < total_steps:
                metrics = dev_metrics()
                if rank == 0:
                    _log(f"[train] epoch {epoch} dev {json.dumps({k: v for k, v in metrics.items() if k != 'skipped'})}")
                save({"dev": metrics})
            continue
        break
    metrics = dev_metrics()
    if rank == 0:
        _log(f"[train] done at step {step}: dev {json.dumps({k: v for k, v in metrics.items() if k != 'skipped'})}")
    save({"dev": metrics, "final": True})


def total_steps_for(cfg: TrainConfig, train_rows: int) -> int:
    """--max-steps, or --epochs passes of this worker's equal share of train (what the LR schedule spans)."""
    steps_per_epoch = max(1, math.ceil(train_rows // cfg.num_workers / cfg.batch_size))
    return cfg.max_steps or steps_per_epoch * cfg.epochs


def run(cfg: TrainConfig) -> dict:
    """Train (or resume) on the connected Ray cluster; return the job's summary."""
    import ray
    import ray.data
    import ray.train
    from ray.train.torch import TorchTrainer

    from pipelines.tokenize import read_shards

    from qa_models import MODELS

    if cfg.model in MODELS and MODELS[cfg.model].inputs == "passages":
        raise ValueError(f"--model {cfg.model} reads multi-passage shards (tokenised_passages); its training loop "
                         "(span and multiple-choice objectives, EM/F1) is not in jobs/train.py yet")
    manifest = read_manifest(cfg.data)
    if manifest.get("schema", "tokenised_pairs") != "tokenised_pairs":
        raise ValueError(f"{cfg.data}: {manifest['schema']} shards; --model {cfg.model} trains on answer-selection "
                         "pairs (tokenised_pairs)")
    datasets = {}
    for split in ("train", "dev"):
        if split not in manifest["splits"]:
            raise FileNotFoundError(f"{cfg.data}: manifest.json has no {split!r} split")
        datasets[split] = read_shards(cfg.data, split)
    total_steps = total_steps_for(cfg, manifest["splits"]["train"]["rows"])
    vectors = embeddings_path(cfg)
    if vectors:
        embeddings_shape(vectors, manifest.get("vocab_size"))
        vectors = os.path.abspath(vectors)

    cpus = float(ray.cluster_resources().get("CPU", 1))
    per_worker = cfg.cpus_per_worker or max(0.25, min(4.0, (cpus - 1) / cfg.num_workers))
    resources = {"CPU": per_worker}
    if cfg.use_gpu:
        resources["GPU"] = cfg.gpus_per_worker
    storage = os.path.abspath(cfg.storage_path) if "://" not in cfg.storage_path else cfg.storage_path
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": asdict(cfg), "total_steps": total_steps,
                           "vocab_size": manifest.get("vocab_size", 0), "embeddings": vectors},
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=cfg.name, storage_path=storage,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures)),
        datasets=datasets,
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"]),
    )
    result = trainer.fit()
    metrics = result.metrics or {}
    dev = metrics.get("dev", {})
    return {"model": cfg.model, "embeddings": vectors, "steps": metrics.get("step", 0),
            "resumed_from_step": metrics.get("resumed_from_step", 0),
            "metrics": {"map": dev.get("map"), "mrr": dev.get("mrr"), "p@1": dev.get("p@1"),
                        "questions": dev.get("questions")},
            "checkpoint": result.checkpoint.path if result.checkpoint else None,
            "loss_curve": metrics.get("curve", [])}

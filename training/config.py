"""A training run's configuration: `TrainConfig` (what jobs/train.py parses into), filled from the model's paper
recipe (qa_models/recipes.py) where a flag is not given, and what follows from it and the data (the task and
its dev metric, steps per epoch, the autocast dtype)."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.checks import UsageError, at_least, integer_at_least, one_of, seed_in_range, within

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# torch.compile's modes for the training forward (none: eager). reduce-overhead replays CUDA graphs: the host queues
# a step in a few calls instead of a kernel launch per operator.
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
# Compiled, a transformer's batches pad to a multiple of this many tokens: a few sequence lengths, so a few CUDA
# graphs (one is recorded per shape), instead of one per batch length.
PAD_MULTIPLE_COMPILED = 16


# The dev metrics of each kind of data set, the first the default for --select-metric.
TASK_METRICS = {"ranking": ("map", "mrr", "p@1"), "extractive": ("f1", "em"), "multiple_choice": ("accuracy",)}


SELECT_METRICS = ("auto",) + tuple(m for metrics in TASK_METRICS.values() for m in metrics)


MULTIPLE_CHOICE_SETS = ("wikihop",)  # reading-comprehension sets that pick among candidates


# The TrainConfig fields a recipe (qa_models/recipes.py) decides when they are not given (None).
RECIPE_FIELDS = (
    "optimizer",
    "lr",
    "betas",
    "momentum",
    "rho",
    "eps",
    "weight_decay",
    "l2",
    "schedule",
    "warmup",
    "warmup_steps",
    "batch_size",
    "grad_clip",
    "ema_decay",
    "epochs",
    "patience",
    "negatives",
)


# The default of a recipe field: None until `TrainConfig.__post_init__` fills it from the model's recipe, so that the
# field's type is what every reader after construction sees.
FROM_RECIPE: Any = None


@dataclass
class TrainConfig:
    model: str
    data: str
    storage_path: str = "runs"
    name: str = "run"
    max_steps: int | None = None  # total optimiser steps; None: `epochs` passes over train
    # How to train: `recipe` (the model's paper's, or "uniform"), then any of the fields below given instead of None
    # (FROM_RECIPE). After construction each holds its resolved value (qa_models/recipes.py documents them).
    recipe: str = "paper"
    epochs: int = FROM_RECIPE
    batch_size: int = FROM_RECIPE
    optimizer: str = FROM_RECIPE
    lr: float = FROM_RECIPE  # the recipe's (its encoder_lr when a pretrained encoder is fine-tuned)
    head_lr: float | None = None  # the rate outside a pretrained transformer (None: `lr` for all, as the papers)
    betas: tuple = FROM_RECIPE
    momentum: float = FROM_RECIPE
    rho: float = FROM_RECIPE
    eps: float = FROM_RECIPE
    weight_decay: float = FROM_RECIPE
    l2: float = FROM_RECIPE
    schedule: str = FROM_RECIPE
    warmup: float = FROM_RECIPE
    warmup_steps: int = FROM_RECIPE
    grad_clip: float = FROM_RECIPE
    ema_decay: float = FROM_RECIPE
    patience: int = FROM_RECIPE  # dev evaluations without a new best before the run stops; 0: never early
    negatives: str = FROM_RECIPE
    recipe_options: dict = FROM_RECIPE  # the recipe's model options (below the flags and --model-option)
    checkpoint_every: int | None = None  # steps; epoch ends always checkpoint
    # Minutes between checkpoints whatever the steps (0: off): what a crash or a preemption can cost at most.
    checkpoint_minutes: float = 10.0
    keep_checkpoints: int = 2
    num_workers: int = 1
    cpus_per_worker: float | None = None  # None: sized from the cluster so Ray Data keeps a CPU
    use_gpu: bool = False
    gpus_per_worker: float = 1.0
    backend: str = "auto"  # collectives: "nccl", "gloo", or auto (`collective_backend`)
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
    init_from: str | None = None  # a checkpoint (or a run's best) whose weights a new run starts from: fine-tuning
    grad_accumulation: int = 1  # micro-batches per optimiser step
    length_buckets: int = 0  # sort pools of this many batches (at least 8) by length, re-cut and shuffle (0: off)
    precision: str = "auto"  # "auto" (bf16 on GPUs that have it, else fp32), "fp32", "bf16", "fp16" (GPU)
    compile: str = "none"  # torch.compile's mode for the training forward (COMPILE_MODES; evaluation stays eager)
    eval_every: int | None = None  # steps between dev evaluations; epoch ends and the last step always evaluate
    select_metric: str = "auto"  # the dev metric that picks the best checkpoint; auto: MAP, F1 or accuracy
    test_split: str | None = None  # scored once at the end, with the best checkpoint's weights (a held-out split)
    model_overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.encoder_path and os.path.isdir(self.encoder_path):
            # the workers run in Ray's session folder, where a relative path names another place
            self.encoder_path = os.path.abspath(self.encoder_path)
        self._resolve_recipe()
        self._check_ranges()
        if self.precision == "fp16" and not self.use_gpu:
            raise UsageError("--precision fp16 needs --use-gpu (CPU autocast has bf16 only)")

    def collective_backend(self) -> str:
        """The backend the workers all-reduce with: --backend, or for auto NCCL where every worker has whole GPUs
        and Gloo otherwise (CPU workers; workers sharing a GPU, which NCCL refuses as two ranks on one device)."""
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.use_gpu and self.gpus_per_worker >= 1 else "gloo"

    def _check_ranges(self) -> None:
        """Every option range-checked, whichever way the config arrived (command line, experiments runner,
        Python), before Ray starts: nonsense never reaches a worker."""
        if not self.name or self.name in (".", "..") or "/" in self.name or os.sep in self.name:
            raise UsageError(f"--name {self.name!r}: a run name is one folder name under --storage-path (no '/')")
        integer_at_least("--max-steps", self.max_steps, 1, allow_none=True)
        integer_at_least("--epochs", self.epochs, 1)
        integer_at_least("--batch-size", self.batch_size, 1)
        at_least("--lr", self.lr, 0)
        at_least("--head-lr", self.head_lr, 0, allow_none=True)
        if len(self.betas) != 2:
            raise UsageError(f"betas must be two numbers, got {self.betas}")
        for beta in self.betas:
            within("betas", beta, 0, 1, high_open=True)
        within("--momentum", self.momentum, 0, 1, high_open=True)
        within("--rho", self.rho, 0, 1)
        at_least("eps", self.eps, 0)
        at_least("--weight-decay", self.weight_decay, 0)
        at_least("--l2", self.l2, 0)
        within("--warmup", self.warmup, 0, 1)
        integer_at_least("--warmup-steps", self.warmup_steps, 0)
        at_least("--grad-clip", self.grad_clip, 0)
        within("--ema-decay", self.ema_decay, 0, 1, high_open=True)
        integer_at_least("--patience", self.patience, 0)
        integer_at_least("--checkpoint-every", self.checkpoint_every, 1, allow_none=True)
        at_least("--checkpoint-minutes", self.checkpoint_minutes, 0)
        integer_at_least("--keep-checkpoints", self.keep_checkpoints, 1)
        integer_at_least("--num-workers", self.num_workers, 1)
        seed_in_range("--seed", self.seed)
        if self.cpus_per_worker is not None:
            at_least("--cpus-per-worker", self.cpus_per_worker, 0)
            if self.cpus_per_worker == 0:
                raise UsageError("--cpus-per-worker must be above 0")
        at_least("--gpus-per-worker", self.gpus_per_worker, 0)
        one_of("--backend", self.backend, ("auto", "nccl", "gloo"))
        if self.backend == "nccl" and not self.use_gpu:
            raise UsageError("--backend nccl needs --use-gpu (NCCL all-reduces GPU tensors; CPU workers use Gloo)")
        integer_at_least("--max-failures", self.max_failures, -1)  # -1: retry for ever, as Ray Train's
        integer_at_least("--max-len", self.max_len, 1, allow_none=True)
        integer_at_least("--dim", self.dim, 1, allow_none=True)
        integer_at_least("--hops", self.hops, 1, allow_none=True)
        within("--dropout", self.dropout, 0, 1, allow_none=True, high_open=True)
        one_of("--eval-policy", self.eval_policy, ("clean", "strict", "raw"))
        integer_at_least("--log-every", self.log_every, 1)
        integer_at_least("--grad-accumulation", self.grad_accumulation, 1)
        integer_at_least("--length-buckets", self.length_buckets, 0)
        one_of("--precision", self.precision, PRECISIONS)
        one_of("--compile", self.compile, COMPILE_MODES)
        integer_at_least("--eval-every", self.eval_every, 1, allow_none=True)
        one_of("--select-metric", self.select_metric, SELECT_METRICS)
        if self.test_split is not None and not self.test_split.strip():
            raise UsageError("--test-split must name a split (e.g. test)")

    def _resolve_recipe(self) -> None:
        """Fill every recipe field not given from the model's recipe, checked as the recipe checks its own."""
        from qa_models import MODELS
        from qa_models.recipes import recipe_of

        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; registered: {sorted(MODELS)}")
        base = recipe_of(MODELS[self.model], self.recipe)
        given = {name: getattr(self, name) for name in RECIPE_FIELDS}
        if given["lr"] is None and self.encoder_path and base.encoder_lr is not None:
            given["lr"] = base.encoder_lr
        resolved = base.with_overrides(**given)  # raises on an unknown optimizer, schedule or negatives
        for name in RECIPE_FIELDS:
            setattr(self, name, getattr(resolved, name))
        self.betas = tuple(self.betas)
        if self.recipe_options is None:
            self.recipe_options = dict(resolved.model_options)

    @classmethod
    def from_saved(cls, saved: dict) -> TrainConfig:
        """A TrainConfig recorded in a checkpoint; one written before recipes trained as `uniform` does."""
        saved = dict(saved)
        saved.setdefault("recipe", "uniform")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})

    def resolved_lr(self) -> float:
        return self.lr


def data_task(manifest: dict) -> str:
    """ "ranking" (answer-selection pairs), "extractive" or "multiple_choice" (reading comprehension)."""
    if manifest.get("schema", "tokenised_pairs") == "tokenised_pairs":
        return "ranking"
    return manifest.get("task") or (
        "multiple_choice" if manifest.get("dataset") in MULTIPLE_CHOICE_SETS else "extractive"
    )


def select_metric(cfg: TrainConfig, task: str) -> str:
    if cfg.select_metric == "auto":
        return TASK_METRICS[task][0]
    if cfg.select_metric not in TASK_METRICS[task]:
        raise UsageError(f"--select-metric {cfg.select_metric} is not a {task} metric; one of {TASK_METRICS[task]}")
    return cfg.select_metric


def data_fields(manifest: dict) -> dict:
    """Model config values that the data decides (reading comprehension: character vocabulary and task)."""
    if data_task(manifest) == "ranking":
        return {}
    return {"char_vocab_size": manifest.get("char_vocab_size"), "task": data_task(manifest)}


def batches_per_epoch_for(cfg: TrainConfig, train_rows: int) -> int:
    """Micro-batches in each worker's equal share of train (`training.rows.worker_rows`)."""
    return max(1, math.ceil(train_rows // cfg.num_workers / cfg.batch_size))


def total_steps_for(cfg: TrainConfig, train_rows: int) -> int:
    """--max-steps, or --epochs passes of this worker's equal share of train (what the LR schedule spans); an
    epoch's last step may take fewer than --grad-accumulation micro-batches."""
    steps_per_epoch = math.ceil(batches_per_epoch_for(cfg, train_rows) / cfg.grad_accumulation)
    return cfg.max_steps or steps_per_epoch * cfg.epochs


def precision_name(dtype: torch.dtype | None) -> str:
    """The precision an autocast dtype trains in: fp32 (no autocast), bf16 or fp16; never "auto"."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def resolve_device(name: str = "auto") -> torch.device:
    """A --device value as a torch device: "auto" is a GPU where this process sees one, the CPU otherwise."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(name)
    return torch.device(name)


def check_device(name: str, option: str = "--device") -> None:
    """A GPU named that this process cannot use is refused with one line naming the option (torch said "Torch not
    compiled with CUDA enabled" or "invalid device ordinal" once the model was loaded)."""
    if name in ("auto", "cpu"):
        return
    index = torch.device(name).index or 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index < count:
        return
    if not count:
        raise UsageError(f"{option} {name}: this process sees no GPU (torch {torch.__version__}); use auto or cpu")
    raise UsageError(
        f"{option} {name}: this process sees {count} GPU{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})"
    )


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of --precision on `device` (None: full fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]

"""The Ray Train glue, in one place: the per-worker training loop, checkpoints, and the trainer.

Models stay plain PyTorch (`qa_models`); this module feeds them Parquet shards through Ray Data and trains
them with their paper's recipe (qa_models/recipes.py, applied by training/optim.py: optimiser, learning-rate
schedule, coupled L2, a moving average of the weights), with gradient accumulation and autocast (bf16, or fp16
with a gradient scaler), reports dev MAP/MRR/P@1 (with the averaged weights where the recipe keeps them), stops
after --patience evaluations without a new best, and checkpoints model, optimiser, scheduler, scaler, weight
average, step, data position and the dev history. Each worker streams its own rows
of train from an exact position (jobs/train_rows.py), in batches fixed by the data and the seed, and every random
draw is seeded by position (`seed_micro_batch`), so a run restarted from a checkpoint, after a lost worker or
node, reads on from where it was, without re-reading what it had consumed, and ends with the weights of an
uninterrupted one. Ray Train keeps the best checkpoints by a dev metric and the latest. A run is resumed by
running again with the same storage path and name (Ray Train V2 finds the latest checkpoint). Scalars go to
TensorBoard event files and the curves to a PNG in the run folder.
"""
from __future__ import annotations

import contextlib
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

from jobs.train_rows import epoch_batches, row_groups, worker_rows

STATE_FILE = "state.pt"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# The dev metrics of each kind of data set, the first the default for --select-metric.
TASK_METRICS = {"ranking": ("map", "mrr", "p@1"), "extractive": ("f1", "em"), "multiple_choice": ("accuracy",)}
SELECT_METRICS = ("auto",) + tuple(m for metrics in TASK_METRICS.values() for m in metrics)
MULTIPLE_CHOICE_SETS = ("wikihop",)  # reading-comprehension sets that pick among candidates
SCORE = "select_score"  # the reported metric Ray Train ranks checkpoints by
# The score of a checkpoint with no dev evaluation: below every metric (all lie in [0, 1]), and finite, because
# Ray Train's saved run state is JSON, where -inf comes back as null (and a resumed run then fails to rank).
NO_SCORE = -1.0


def _scored_checkpoints(result) -> list:
    """(checkpoint, metrics) of a Ray Train result's kept checkpoints that were evaluated on dev."""
    return [(c, m) for c, m in result.best_checkpoints or [] if m.get(SCORE) is not None and m[SCORE] > NO_SCORE]


# The TrainConfig fields a recipe (qa_models/recipes.py) decides when they are not given (None).
RECIPE_FIELDS = ("optimizer", "lr", "betas", "momentum", "rho", "eps", "weight_decay", "l2", "schedule", "warmup",
                 "warmup_steps", "batch_size", "grad_clip", "ema_decay", "epochs", "patience", "negatives")


@dataclass
class TrainConfig:
    model: str
    data: str
    storage_path: str = "runs"
    name: str = "run"
    max_steps: int | None = None  # total optimiser steps; None: `epochs` passes over train
    # How to train: `recipe` (the model's paper's, or "uniform"), then any of the fields below given instead of None.
    # After construction each holds its resolved value (qa_models/recipes.py documents them).
    recipe: str = "paper"
    epochs: int | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    lr: float | None = None  # None: the recipe's (its encoder_lr when a pretrained encoder is fine-tuned)
    head_lr: float | None = None  # the rate outside a pretrained transformer (None: `lr` for all, as the papers)
    betas: tuple | None = None
    momentum: float | None = None
    rho: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    l2: float | None = None
    schedule: str | None = None
    warmup: float | None = None
    warmup_steps: int | None = None
    grad_clip: float | None = None
    ema_decay: float | None = None
    patience: int | None = None  # dev evaluations without a new best before the run stops; 0: never early
    negatives: str | None = None
    recipe_options: dict | None = None  # the recipe's model options (below the flags and --model-option)
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
    init_from: str | None = None  # a checkpoint (or a run's best) whose weights a new run starts from: fine-tuning
    grad_accumulation: int = 1  # micro-batches per optimiser step
    length_buckets: int = 0  # sort pools of this many batches (at least 8) by length, re-cut and shuffle (0: off)
    precision: str = "auto"  # "auto" (bf16 on GPUs that have it, else fp32), "fp32", "bf16", "fp16" (GPU)
    eval_every: int | None = None  # steps between dev evaluations; epoch ends and the last step always evaluate
    select_metric: str = "auto"  # the dev metric that picks the best checkpoint; auto: MAP, F1 or accuracy
    test_split: str | None = None  # scored once at the end, with the best checkpoint's weights (a held-out split)
    model_overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        self._resolve_recipe()
        if self.grad_accumulation < 1:
            raise ValueError(f"--grad-accumulation must be at least 1, got {self.grad_accumulation}")
        if self.length_buckets < 0:
            raise ValueError(f"--length-buckets must be 0 (off) or more, got {self.length_buckets}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "fp16" and not self.use_gpu:
            raise ValueError("--precision fp16 needs --use-gpu (CPU autocast has bf16 only)")
        if self.select_metric not in SELECT_METRICS:
            raise ValueError(f"--select-metric must be one of {SELECT_METRICS}, got {self.select_metric!r}")
        if self.patience < 0:
            raise ValueError(f"--patience must be 0 (never stop early) or more, got {self.patience}")

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
    def from_saved(cls, saved: dict) -> "TrainConfig":
        """A TrainConfig recorded in a checkpoint; one written before recipes trained as `uniform` does."""
        saved = dict(saved)
        saved.setdefault("recipe", "uniform")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})

    def resolved_lr(self) -> float:
        return self.lr


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
    if cfg.embeddings == "none" or cfg.encoder_path or cfg.init_from:
        if cfg.embeddings not in ("auto", "none"):
            other = "--encoder-path" if cfg.encoder_path else "--init-from"
            raise ValueError(f"--embeddings {cfg.embeddings} and {other} exclude each other: the pretrained "
                             "weights bring their own token embeddings")
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


def data_task(manifest: dict) -> str:
    """"ranking" (answer-selection pairs), "extractive" or "multiple_choice" (reading comprehension)."""
    if manifest.get("schema", "tokenised_pairs") == "tokenised_pairs":
        return "ranking"
    return manifest.get("task") or ("multiple_choice" if manifest.get("dataset") in MULTIPLE_CHOICE_SETS
                                    else "extractive")


def select_metric(cfg: TrainConfig, task: str) -> str:
    if cfg.select_metric == "auto":
        return TASK_METRICS[task][0]
    if cfg.select_metric not in TASK_METRICS[task]:
        raise ValueError(f"--select-metric {cfg.select_metric} is not a {task} metric; one of {TASK_METRICS[task]}")
    return cfg.select_metric


def data_fields(manifest: dict) -> dict:
    """Model config values that the data decides (reading comprehension: character vocabulary and task)."""
    if data_task(manifest) == "ranking":
        return {}
    return {"char_vocab_size": manifest.get("char_vocab_size"), "task": data_task(manifest)}


def model_config(cfg: TrainConfig, vocab_size: int | None = None, vectors_dim: int | None = None,
                 from_data: dict | None = None, pretrained: dict | None = None):
    """The model's config: its own defaults or, fine-tuning, the `pretrained` checkpoint's, then the recipe's
    model options (its paper's dropout, initialisation, ...), then the general flags that were given and that it
    has, then --model-option values. With word vectors of width
    `vectors_dim`, the embedding width is theirs; without, embeddings are trained (a frozen table of random
    vectors would carry nothing) unless --model-option freeze_embeddings says otherwise."""
    from qa_models import MODELS

    if cfg.model not in MODELS:
        raise ValueError(f"unknown model {cfg.model!r}; registered: {sorted(MODELS)}")
    cls = MODELS[cfg.model]
    given = {"vocab_size": vocab_size, "dim": cfg.dim, "hops": cfg.hops, "dropout": cfg.dropout,
             "max_len": cfg.max_len, "encoder_path": cfg.encoder_path}
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    if cfg.encoder_path and "encoder_path" not in fields:
        raise ValueError(f"--model {cfg.model} reads word ids; --encoder-path is for models with a transformer")
    given.update(from_data or {})
    values = {**(pretrained or {}), **{k: v for k, v in (cfg.recipe_options or {}).items() if k in fields},
              **{k: v for k, v in given.items() if k in fields and v is not None}, **cfg.model_overrides}
    if vectors_dim is not None:
        width = next(name for name in EMBEDDING_WIDTH_FIELDS if name in fields)
        if values.get(width, vectors_dim) != vectors_dim:
            flag = "--dim" if width == "dim" and cfg.dim is not None else f"--model-option {width}"
            raise ValueError(f"{flag} {values[width]} conflicts with the {vectors_dim}-d word vectors "
                             f"({embeddings_path(cfg)}); drop it, or train without them (--embeddings none)")
        values[width] = vectors_dim
    elif "freeze_embeddings" in fields and "freeze_embeddings" not in cfg.model_overrides and not pretrained:
        values["freeze_embeddings"] = False
    return cls.config_class(**values)


def build_model(cfg: TrainConfig, vocab_size: int, vectors: np.ndarray | None = None, from_data: dict | None = None,
                pretrained: dict | None = None):
    from qa_models import MODELS

    config = model_config(cfg, vocab_size, None if vectors is None else vectors.shape[1], from_data, pretrained)
    return MODELS[cfg.model](config, embeddings=None if vectors is None else torch.from_numpy(vectors).float())


def resolve_checkpoint(path: str, which: str = "best") -> str:
    """A checkpoint folder: `path` itself (it holds state.pt, or is a URI), or the best or latest checkpoint of
    the run folder `path` (STORAGE/NAME of jobs/train.py)."""
    if "://" not in path:  # Ray Train reads a run folder as a URI, and a relative path is not one
        path = os.path.abspath(path)
    if "://" in path or os.path.exists(os.path.join(path, STATE_FILE)):
        return path
    if not os.path.exists(os.path.join(path, "checkpoint_manager_snapshot.json")):
        raise FileNotFoundError(f"{path}: neither a checkpoint (no {STATE_FILE}) nor a run folder of jobs/train.py "
                                "(no checkpoint_manager_snapshot.json)")
    import ray.train

    result = ray.train.Result.from_path(path)
    scored = _scored_checkpoints(result)
    if which == "latest" or not scored:
        if result.checkpoint is None:
            raise FileNotFoundError(f"{path}: the run has no checkpoint yet")
        return result.checkpoint.path
    return max(scored, key=lambda pair: pair[1][SCORE])[0].path


def checkpoint_summary(path: str) -> dict:
    """A checkpoint's config.json (train config, model config, vocabulary size and checksum), local or remote."""
    import ray.train

    with ray.train.Checkpoint(path).as_directory() as directory:
        summary = os.path.join(directory, "config.json")
        if not os.path.exists(summary):
            raise FileNotFoundError(f"{path}: no config.json (not a checkpoint of jobs/train.py)")
        with open(summary) as f:
            return json.load(f)


def pretrained_config(cfg: TrainConfig, manifest: dict) -> tuple[str, dict]:
    """The checkpoint --init-from names and its model config, after checking it fits this run: the same model
    and, for word-id models, the same vocabulary (by checksum) as --data."""
    path = resolve_checkpoint(cfg.init_from, "best")
    summary = checkpoint_summary(path)
    trained = summary["train"]["model"]
    if trained != cfg.model:
        raise ValueError(f"--init-from {path}: a {trained} checkpoint, this run trains {cfg.model}")
    config = summary.get("model_config")
    if config is None:
        raise ValueError(f"--init-from {path}: a checkpoint without its model configuration (an older run)")
    ours, theirs = manifest.get("vocab_sha256"), summary.get("vocab_sha256")
    if not config.get("encoder_path") and ours and theirs and ours != theirs:
        raise ValueError(f"--init-from {path}: trained on another vocabulary than {cfg.data}/vocab.json; tokenise "
                         f"{cfg.data} with tokenize_corpora.py --vocab {summary['train']['data']}")
    if not config.get("encoder_path") and summary.get("vocab_size") != manifest.get("vocab_size"):
        raise ValueError(f"--init-from {path}: {summary.get('vocab_size')} word ids, {cfg.data} has "
                         f"{manifest.get('vocab_size')}; tokenise it with tokenize_corpora.py --vocab")
    return path, config


def read_state(path: str) -> dict:
    """The state.pt of a checkpoint folder, local or on a pyarrow filesystem URI, on the CPU."""
    import ray.train

    with ray.train.Checkpoint(path).as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)


def load_pretrained(model, path: str) -> None:
    from training.optim import evaluation_weights

    state = evaluation_weights(read_state(path))  # the weights its figures were scored with
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"--init-from {path}: its weights do not fit this model ({error})") from None


class Batcher:
    """Numpy batches from Ray Data to model inputs (the keyword arguments of the model's forward) and labels,
    for the vocabulary or a transformer's tokenizer, in the layout the model reads (`Model.inputs`); training
    batches of a pairwise model (`Model.objective`) are triplets with a negative answer per positive. Passage
    models get their inputs and targets (answer occurrences, candidate mentions) from `passage_batch`, the
    context cut at --max-len tokens (default: what the shards were capped at, 5,000 when not said)."""

    def __init__(self, cfg: TrainConfig, inputs: str = "joint", objective: str | None = None,
                 max_len: int | None = None, max_context: int | None = None):
        from qa_models.batching import TransformerPairs

        self.max_context = cfg.max_len or max_context or 5000
        self.max_len = max_len or cfg.max_len or 256
        self.inputs, self.seed, self.negatives = inputs, cfg.seed, cfg.negatives
        self.pairwise = objective == "pairwise"
        self.transformer = TransformerPairs(cfg.encoder_path, self.max_len) if cfg.encoder_path else None

    def length_key(self, batch: dict) -> np.ndarray:
        """What padding follows from, per row: the context (passages), or question and answer, capped as the
        model reads them. Pairwise models sort by question length, then question, so that a question's rows
        stay together (its negatives for the triplets come from its own rows)."""
        if self.inputs == "passages":
            return np.minimum(_lengths(batch["context_ids"]), self.max_context)
        questions = np.minimum(_lengths(batch["question_ids"]), self.max_len)
        if self.pairwise:
            _, question_rank = np.unique(batch["qid"], return_inverse=True)
            return questions * (len(batch["qid"]) + 1) + question_rank.reshape(-1)
        return np.minimum(questions + _lengths(batch["answer_ids"]), self.max_len)

    def __call__(self, batch: dict, train: bool = False) -> tuple[dict, torch.Tensor | dict]:
        from qa_models.batching import pair_batch, passage_batch, separate_batch, triplet_batch

        if self.inputs == "passages":
            encoded = passage_batch(batch, max_context=self.max_context)
            return encoded, encoded.pop("targets")
        if train and self.pairwise:
            encoded = triplet_batch(batch["qid"], batch["question_ids"], batch["answer_ids"], batch["label"],
                                    self.max_len, self.seed, self.negatives)
        elif self.transformer is not None:
            encoded = self.transformer(batch["question"], batch["answer"], batch["label"])
        elif self.inputs == "separate":
            encoded = separate_batch(batch["question_ids"], batch["answer_ids"], batch["label"], self.max_len)
        else:
            encoded = pair_batch(batch["question_ids"], batch["answer_ids"], batch["label"], self.max_len)
        labels = encoded.pop("labels")
        return encoded, labels


def _lengths(column) -> np.ndarray:
    return np.fromiter((len(x) for x in column), dtype=np.int64, count=len(column))


def _log(message: str) -> None:
    # Not print(): inside a Ray Train worker, print is patched to log through the root logger (whose console
    # handler writes the line) and, because Ray wraps sys.stderr, also to call the original print, so every
    # line reached the driver twice. A direct write goes out once. stdout is kept for the job's final JSON line.
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def score_batches(model, batcher: Batcher, batches, device, dtype: torch.dtype | None = None) -> dict:
    """The model's score for every row of `batches` (numpy dicts of tokenised pairs), with qid, aid, label."""
    model.eval()
    out, positions = {"qid": [], "aid": [], "label": [], "score": []}, []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        for batch in batches:
            inputs, _ = batcher(batch)
            logits = model(**{k: v.to(device) for k, v in inputs.items()})
            out["score"].extend(model.score(logits).float().cpu().tolist())
            out["label"].extend(batch["label"].tolist())
            out["qid"].extend(batch["qid"].tolist())
            out["aid"].extend(batch["aid"].tolist() if "aid" in batch else [None] * len(batch["label"]))
            positions.extend(batch[ROW].tolist() if ROW in batch else [])
    model.train()
    return {name: in_file_order(values, positions) for name, values in out.items()}


def to_device(value, device):
    """A tensor, or a dict of them (reading-comprehension targets), on `device`."""
    if isinstance(value, dict):
        return {k: v.to(device) for k, v in value.items()}
    return value.to(device)


def read_batches(model, batcher: Batcher, batches, device, dtype: torch.dtype | None = None) -> list[dict]:
    """One record per question of tokenised-passage `batches`. Extractive: `prediction` (the best span of at
    most max_answer_tokens, as text), `span`, `answers`, `em`, `f1`. Multiple choice: `prediction` (the
    candidate whose mentions hold the most probability, eq. 8), `answer`, `correct`."""
    from qa_models.metrics import exact_match, f1_score

    model.eval()
    records, positions = [], []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        for batch in batches:
            inputs, targets = batcher(batch)
            positions.extend(batch[ROW].tolist() if ROW in batch else [])
            output = model(**to_device(inputs, device))
            if model.config.task == "extractive":
                for i, (start, end) in enumerate(model.best_spans(output).cpu().tolist()):
                    prediction = " ".join(batch["context_tokens"][i][start:end + 1])
                    answers = list(batch["answers"][i])
                    records.append({"qid": batch["qid"][i], "prediction": prediction, "span": [start, end],
                                    "answers": answers, "em": exact_match(prediction, answers),
                                    "f1": f1_score(prediction, answers)})
            else:
                candidates = max(1, max(len(c) for c in batch["candidates"]))
                log_probs = model.candidate_log_probs(output, targets["mentions"].to(device), candidates)
                for i, choice in enumerate(log_probs.argmax(-1).cpu().tolist()):
                    names = list(batch["candidates"][i])
                    answer = int(batch["answer_index"][i])
                    records.append({"qid": batch["qid"][i], "prediction": names[choice] if choice < len(names) else "",
                                    "answer": names[answer] if 0 <= answer < len(names) else "",
                                    "correct": float(choice == answer)})
    model.train()
    return in_file_order(records, positions)


def summarise_reading(records: list[dict]) -> dict:
    """Mean EM and F1, or accuracy, over the records of `read_batches`."""
    if records and "correct" in records[0]:
        return {"accuracy": float(np.mean([r["correct"] for r in records])), "questions": len(records)}
    return {"em": float(np.mean([r["em"] for r in records])) if records else 0.0,
            "f1": float(np.mean([r["f1"] for r in records])) if records else 0.0, "questions": len(records)}


def eval_batch_size(cfg: TrainConfig, inputs: str) -> int:
    """Rows per dev batch: the training batch for passages (memory), at least 64 pairs otherwise. evaluate.py
    uses the same by default: a padded batch changes scores by rounding, and an undertrained model's near-tied
    spans flip on that."""
    return cfg.batch_size if inputs == "passages" else max(64, cfg.batch_size)


def parquet_batches(paths: list[str], batch_size: int, columns: list[str]):
    """Numpy batches of Parquet files in file order: `batch_size` rows each across file boundaries, the last one
    short."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def numpy_batch(table: pa.Table) -> dict:
        # copies: Arrow's zero-copy arrays are read-only, which torch.as_tensor warns about
        return {name: np.array(table.column(name).to_numpy()) for name in columns}

    pending, rows = [], 0
    for path in paths:
        for record_batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns):
            pending.append(record_batch)
            rows += record_batch.num_rows
            while rows >= batch_size:
                table = pa.Table.from_batches(pending)
                yield numpy_batch(table.slice(0, batch_size))
                rest = table.slice(batch_size)
                pending, rows = rest.to_batches(), rest.num_rows
    if rows:
        yield numpy_batch(pa.Table.from_batches(pending))


ROW = "_row"  # the position in the split's files of each row of an evaluation batch
EVAL_POOL_BATCHES = 32  # evaluation batches sorted by length together: memory stays bounded on large splits


def eval_batches(paths: list[str], batch_size: int, columns: list[str], length_key=None):
    """Numpy batches of a split for scoring, the same in training's dev evaluation and in jobs/evaluate.py (a
    padded batch changes scores by rounding, and an undertrained model's near-tied spans flip on that). Pools of
    EVAL_POOL_BATCHES batches are sorted by `length_key` (stably), so that a batch pads to rows of like length: a
    transformer's scoring costs about a third less than in file order. Each batch carries ROW, which
    score_batches and read_batches put their results back in file order by."""
    offset = 0
    for pool in parquet_batches(paths, batch_size * EVAL_POOL_BATCHES, columns):
        rows = len(next(iter(pool.values())))
        order = np.argsort(length_key(pool), kind="stable") if length_key is not None else np.arange(rows)
        pool = {name: values[order] for name, values in pool.items()}
        pool[ROW] = order + offset
        offset += rows
        for start in range(0, rows, batch_size):
            yield {name: values[start:start + batch_size] for name, values in pool.items()}


def score_split(model, batcher: Batcher, paths: list[str], columns: list[str], cfg: TrainConfig, device,
                dtype: torch.dtype | None = None, policy: str | None = None,
                batch_size: int | None = None) -> tuple[dict, list[dict]]:
    """`model` on a split's Parquet files: ({rows, metrics[, policy]}, one record per question), what
    jobs/evaluate.py writes and what training reports for --test-split. Answer selection: AP, RR, P@1 and the
    ranking of each question under `policy` (default: the run's); reading: the predicted span or candidate."""
    from qa_models.metrics import per_question_ranking, summarise_ranking

    batches = eval_batches(paths, batch_size or eval_batch_size(cfg, batcher.inputs), columns, batcher.length_key)
    if batcher.inputs == "passages":
        records = read_batches(model, batcher, batches, device, dtype)
        return {"rows": len(records), "metrics": summarise_reading(records)}, records
    scored = score_batches(model, batcher, batches, device, dtype)
    policy = policy or cfg.eval_policy
    rows = [{"aid": aid, "label": label, "score": score}
            for aid, label, score in zip(scored["aid"], scored["label"], scored["score"])]
    records = per_question_ranking(scored["qid"], scored["label"], scored["score"], policy=policy, ids=rows)
    return {"policy": policy, "rows": len(rows), "metrics": summarise_ranking(records)}, records


def in_file_order(values: list, positions: list) -> list:
    """`values` of length-sorted evaluation batches back in the order of the files (as they are without ROW)."""
    if not positions:
        return values
    return [values[i] for i in np.argsort(positions, kind="stable")]


def evaluate(model, batcher: Batcher, paths: list[str], columns: list[str], cfg: TrainConfig, device,
             dtype: torch.dtype | None = None) -> dict:
    """Dev figures of `model` on the Parquet files `paths` (rank 0 reads them whole, without Ray Data: a dev set
    is small, and a Ray Data execution costs seconds of start-up at every evaluation)."""
    from qa_models.metrics import ranking_metrics

    batches = eval_batches(paths, eval_batch_size(cfg, batcher.inputs), columns, batcher.length_key)
    if batcher.inputs == "passages":
        return summarise_reading(read_batches(model, batcher, batches, device, dtype))
    scored = score_batches(model, batcher, batches, device, dtype)
    return ranking_metrics(scored["qid"], scored["label"], scored["score"], policy=cfg.eval_policy)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of --precision on `device` (None: full fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def run_dir(cfg: TrainConfig) -> str:
    storage = os.path.abspath(cfg.storage_path) if "://" not in cfg.storage_path else cfg.storage_path
    return storage.rstrip("/") + "/" + cfg.name


def publish(local_path: str, destination: str) -> None:
    """Put a finished local file or folder at `destination` (a path or a pyarrow filesystem URI) so that it
    appears whole: a rename on local and shared file systems, one upload per file on object storage."""
    import shutil

    import pyarrow.fs

    if "://" in destination:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(destination)
        pyarrow.fs.copy_files(local_path, path, destination_filesystem=filesystem)
        return
    if os.path.isdir(local_path):
        from pipelines.atomic import staged_dir

        with staged_dir(destination) as staging:
            shutil.copytree(local_path, staging, dirs_exist_ok=True)
        return
    os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
    staged = f"{destination}.partial-{os.getpid()}"
    shutil.copyfile(local_path, staged)
    os.replace(staged, destination)


class Scalars:
    """Training and dev scalars as TensorBoard event files under RUN/tensorboard (rank 0 only). On local and
    shared storage the events are written in place; on object storage to a local folder uploaded at every
    checkpoint. A resumed run purges what a lost attempt wrote after the step it resumes from."""

    def __init__(self, cfg: TrainConfig, resume_step: int):
        from tensorboardX import SummaryWriter

        self.destination = run_dir(cfg) + "/tensorboard"
        self.remote = "://" in self.destination
        directory = tempfile.mkdtemp(prefix="tensorboard-") if self.remote else self.destination
        self.writer = SummaryWriter(directory, purge_step=resume_step or None, flush_secs=30)
        self.directory = directory

    def add(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()
        if self.remote:
            publish(self.directory, self.destination)

    def close(self) -> None:
        self.flush()
        self.writer.close()


def plot_curves(curve: list, dev_history: list, metric: str, path: str, title: str) -> None:
    """Training loss and the dev metric against the step, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, loss_axis = plt.subplots(figsize=(7, 4))
    if curve:
        steps, losses = zip(*curve)
        loss_axis.plot(steps, losses, color="tab:blue", label="train loss")
    loss_axis.set_xlabel("optimiser step")
    loss_axis.set_ylabel("train loss", color="tab:blue")
    if dev_history:
        dev_axis = loss_axis.twinx()
        steps = [step for step, _ in dev_history]
        dev_axis.plot(steps, [m.get(metric, float("nan")) for _, m in dev_history], "o-", color="tab:orange")
        dev_axis.set_ylabel(f"dev {metric}", color="tab:orange")
    loss_axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _all_reduce_gradients(model) -> None:
    """Average gradients over the workers by hand, for backward passes run under DDP's `no_sync`."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad.div_(dist.get_world_size())


def seed_micro_batch(seed: int, rank: int, epoch: int, index: int) -> None:
    """Seed torch, numpy and random from (seed, rank, epoch, micro-batch): dropout masks and any other draw are
    a function of where the run is, not of the draws before, so a run restarted from a checkpoint (on another
    node, with other ranks) makes exactly the draws the uninterrupted run made and no RNG state need be saved."""
    state = np.random.SeedSequence([seed, rank, epoch, index]).generate_state(2)
    torch.manual_seed(int(state[0]))
    np.random.seed(int(state[1]))
    random.seed(int(state[1]))


def _worker_log_level(level: str) -> None:
    """Ray Train's per-report line ("Reporting training result N: TrainingReport(...)") comes from a logger named
    by its file's path, outside the `ray.train` loggers that RunConfig's LoggingConfig sets: set it here too."""
    import logging

    with contextlib.suppress(ImportError):
        from ray.train.v2._internal.execution import context as train_context

        logging.getLogger(train_context.__file__).setLevel(level)


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import ray.train.torch

    from training.optim import WeightAverage, build_optimizer, l2_penalty, lr_factor

    _worker_log_level(config.get("log_level", "INFO"))
    cfg = TrainConfig(**config["train"])
    total_steps, vocab_size = config["total_steps"], config["vocab_size"]
    batches_per_epoch = config["batches_per_epoch"]  # this worker's, of an equal split
    metric, from_data = config["select_metric"], config["from_data"]
    context = ray.train.get_context()
    rank = context.get_world_rank()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)

    vectors = np.load(config["embeddings"]) if config["embeddings"] else None
    model = build_model(cfg, vocab_size, vectors, from_data, config["pretrained_config"])
    del vectors
    optimizer = build_optimizer(cfg, model, cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg.schedule, total_steps, cfg.warmup,
                                                                       cfg.warmup_steps))
    device = ray.train.torch.get_device()
    dtype = autocast_dtype(cfg.precision, device)
    # A gradient scaler only matters for fp16 (bf16 has fp32's range); disabled, it is a pass-through.
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    step, epoch, batch_in_epoch, resumed_from, curve, dev_history = 0, 0, 0, 0, [], []
    stopped_early, averaged_state = False, None
    trained_before = 0.0  # seconds this run trained before its latest resume, up to the checkpoint it resumed from

    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        averaged_state, stopped_early = state.get("weight_average"), state.get("stopped_early", False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step, epoch, batch_in_epoch, curve = state["step"], state["epoch"], state["batch_in_epoch"], state["curve"]
        dev_history = state.get("dev_history", [])
        trained_before = state.get("trained_seconds", 0.0)
        resumed_from = step
        if rank == 0:
            _log(f"[train] resumed from step {step} (epoch {epoch}, batch {batch_in_epoch})")
    else:
        if config["init_from"]:  # a fresh fine-tuning run; a resumed one continues from its own checkpoint
            load_pretrained(model, config["init_from"])
            if rank == 0:
                _log(f"[train] starting from the weights of {config['init_from']}")
        if getattr(model, "needs_word_statistics", False):  # from this run's train split, saved with the weights
            from training.word_statistics import word_statistics

            model.load_word_statistics(*word_statistics(list(dict.fromkeys(p for p, *_ in config["train_row_groups"])),
                                                        config["vocab_path"]))

    segment_started = time.time()
    model = ray.train.torch.prepare_model(model)
    core = model.module if hasattr(model, "module") else model
    average = WeightAverage(core, cfg.ema_decay) if cfg.ema_decay else None
    if average is not None and averaged_state is not None:
        average.load_state_dict(averaged_state)
    batcher = Batcher(cfg, core.inputs, getattr(core, "objective", None), getattr(core.config, "max_len", None),
                      config["max_context"])
    world_size = context.get_world_size()
    train_groups = config["train_row_groups"]
    first_row, end_row = worker_rows(config["train_rows"], world_size, rank)
    dev_paths, dev_columns = config["dev_paths"], config["dev_columns"]
    scalars = Scalars(cfg, resumed_from) if rank == 0 else None

    def save(metrics: dict, test: tuple[dict, list[dict]] | None = None) -> None:
        dev_metrics_now = metrics.get("dev") or {}
        score = dev_metrics_now.get(metric)
        trained = trained_before + time.time() - segment_started  # every invocation's, work lost to a crash aside
        metrics = dict(metrics, step=step, epoch=epoch, resumed_from_step=resumed_from, curve=curve,
                       dev_history=dev_history, trained_seconds=trained, resumed_trained_seconds=trained_before,
                       **{SCORE: float(score) if score is not None else NO_SCORE})
        if rank != 0:
            ray.train.report(metrics, checkpoint=None)
            return
        scalars.flush()
        with tempfile.TemporaryDirectory() as directory:
            state = {"model": core.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "step": step,
                     "epoch": epoch, "batch_in_epoch": batch_in_epoch, "curve": curve, "dev_history": dev_history,
                     "config": asdict(cfg), "model_config": asdict(core.config), "vocab_size": vocab_size,
                     "vocab_sha256": config["vocab_sha256"], "stopped_early": stopped_early,
                     "trained_seconds": trained,
                     "weight_average": average.state_dict() if average is not None else None}
            torch.save(state, os.path.join(directory, STATE_FILE))
            if test:  # the held-out split's figures travel with the weights that earned them
                from jobs.evaluate import write_jsonl

                figures, records = test
                write_jsonl(records, os.path.join(directory, predictions_name(cfg.test_split)))
                metrics["test"] = dict(figures, split=cfg.test_split, step=step)
            with open(os.path.join(directory, "config.json"), "w") as f:
                json.dump({"train": asdict(cfg), "model_config": asdict(core.config), "vocab_size": vocab_size,
                           "vocab_sha256": config["vocab_sha256"], "step": step, "dev": dev_metrics_now}, f,
                          indent=2)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    def dev_metrics() -> dict:
        if rank != 0:
            return {}
        with evaluation_weights_in(core):
            metrics = evaluate(core, batcher, dev_paths, dev_columns, cfg, device, dtype)
        dev_history.append([step, {k: v for k, v in metrics.items() if k != "skipped"}])
        for name, value in metrics.items():
            if name not in ("questions", "skipped"):
                scalars.add("dev/" + name.replace("@", "_at_"), value, step)
        shown = {k: v for k, v in metrics.items() if k != "skipped"}
        _log(f"[train] step {step} epoch {epoch} dev {json.dumps(shown)}")
        return metrics

    def evaluation_weights_in(module):
        """The weights the run is scored with: the moving average where the recipe keeps one."""
        return average.applied(module) if average is not None else contextlib.nullcontext(module)

    def optimiser_step(micro_batches: int) -> None:
        scaler.unscale_(optimizer)
        if micro_batches != cfg.grad_accumulation:  # an epoch's last, short accumulation: average what it has
            for parameter in model.parameters():
                if parameter.grad is not None:
                    parameter.grad.mul_(cfg.grad_accumulation / micro_batches)
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if average is not None:
            average.update(core)

    def stop_now() -> bool:
        """After a dev evaluation: whether --patience evaluations have passed without a new best (rank 0 decides,
        every worker follows)."""
        nonlocal stopped_early
        if not cfg.patience:
            return False
        waited = evaluations_since_best(dev_history, metric) if rank == 0 else 0
        stopped_early = _agree(waited >= cfg.patience, device)
        if stopped_early and rank == 0:
            _log(f"[train] step {step}: dev {metric} has not improved for {waited} evaluations (--patience "
                 f"{cfg.patience}); stopping early")
        return stopped_early

    examples_per_step = cfg.batch_size * cfg.grad_accumulation * cfg.num_workers
    started, window, window_loss = time.time(), 0, 0.0
    first_step, warm = step, None
    optimizer.zero_grad(set_to_none=True)
    evaluated_at, last_dev = None, {}
    while step < total_steps and not stopped_early:
        skip = batch_in_epoch  # micro-batches of this epoch consumed before a resume (a step boundary)
        micro, step_loss = 0, 0.0
        batches = epoch_batches(train_groups, first_row, end_row, cfg, epoch, rank, batcher.length_key, skip,
                                "qid" if batcher.pairwise else None, config["read_cpus"])
        for index, batch in batches:
            seed_micro_batch(cfg.seed, rank, epoch, index)
            inputs, labels = batcher(batch, train=True)
            micro += 1
            last_micro = micro == cfg.grad_accumulation or index + 1 == batches_per_epoch
            # DDP all-reduces gradients on every backward; between optimiser steps there is nothing to share.
            sync = contextlib.nullcontext() if last_micro or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    logits = model(**to_device(inputs, device))
                    loss = core.loss(logits, to_device(labels, device))
                objective = loss + l2_penalty(core, cfg.l2)  # the recipe's coupled L2, in fp32 outside autocast
                scaler.scale(objective / cfg.grad_accumulation).backward()
            step_loss += float(loss.detach())
            batch_in_epoch = index + 1
            if not last_micro:
                continue
            optimiser_step(micro)
            step += 1
            if warm is None:  # the first step of this run waits for the data pipeline and warms up
                warm = (step, time.time())
            window += 1
            window_loss += step_loss / micro
            micro, step_loss = 0, 0.0
            if step % cfg.log_every == 0 or step == total_steps:
                curve.append([step, window_loss / window])
                if rank == 0:
                    rate = (step - first_step) / max(1e-9, time.time() - started)
                    eta = (total_steps - step) / max(rate, 1e-9)
                    scalars.add("train/loss", window_loss / window, step)
                    scalars.add("train/lr", scheduler.get_last_lr()[0], step)
                    scalars.add("train/examples_per_s", rate * examples_per_step, step)
                    _log(f"[train] step {step}/{total_steps} epoch {epoch} loss {window_loss / window:.4f} "
                         f"lr {scheduler.get_last_lr()[0]:.2e} {rate * examples_per_step:.1f} ex/s ETA {eta:.0f}s")
                window, window_loss = 0, 0.0
            if step >= total_steps:
                break
            if cfg.eval_every and step % cfg.eval_every == 0:
                last_dev, evaluated_at = dev_metrics(), step
                if stop_now():  # the final checkpoint below is this step's
                    break
                save({"dev": last_dev})
            elif cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                save({"loss": float(loss.detach())})
        else:  # the epoch ran out
            if micro:  # the shard held more batches than expected: their gradients were never all-reduced
                _all_reduce_gradients(model)
                optimiser_step(micro)
                step += 1
                window += 1
                window_loss += step_loss / micro
            epoch += 1
            batch_in_epoch = 0
            if step < total_steps:
                if evaluated_at != step:
                    last_dev, evaluated_at = dev_metrics(), step
                if not stop_now():
                    save({"dev": last_dev})
            continue
        break
    # examples per second over this run's steps after its first, on every worker together: what a benchmark
    # compares, without start-up, the first batch's wait for the data pipeline, and the final evaluation
    timed = (step - warm[0], time.time() - warm[1]) if warm else (0, 0.0)
    examples_per_s = timed[0] * examples_per_step / timed[1] if timed[0] else None
    # the last step's dev figures: those of an evaluation at this very step (an early stop), else a new one
    metrics = last_dev if evaluated_at == step and dev_history and dev_history[-1][0] == step else dev_metrics()
    test = None
    if cfg.test_split and rank == 0 and best_so_far(metrics.get(metric), dev_history[:-1], metric):
        with evaluation_weights_in(core):
            figures, records = score_split(core, batcher, config["test_paths"], config["test_columns"], cfg, device,
                                           dtype)
        _log(f"[train] step {step} {cfg.test_split} {json.dumps(figures['metrics'])}")
        test = (figures, records)
    save({"dev": metrics, "final": True, "examples_per_s": examples_per_s, "stopped_early": stopped_early}, test)
    if rank == 0:
        _log(f"[train] done at step {step}")
        scalars.close()


def evaluations_since_best(dev_history: list, metric: str) -> int:
    """Dev evaluations since the best one (the first to reach the highest `metric`): a tie is no improvement."""
    scores = [figures[metric] for _, figures in dev_history if figures.get(metric) is not None]
    if not scores:
        return 0
    best = scores.index(max(scores))
    return len(scores) - 1 - best


def _agree(flag: bool, device) -> bool:
    """Rank 0's `flag` on every worker (a decision only rank 0 can take, such as stopping on its dev figures)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(value, src=0)
    return bool(value.item())


def best_so_far(score: float | None, earlier: list, metric: str) -> bool:
    """Whether the last step's dev `score` is at least every earlier evaluation's (`dev_history` entries): then
    the final weights are the run's best, and rank 0 scores --test-split with them in place. Otherwise the job
    scores the best checkpoint afterwards (`held_out_figures`). No score (a dev set without figures): the final
    weights, as the job would pick."""
    if score is None:
        return True
    return all(score >= figures[metric] for _, figures in earlier if figures.get(metric) is not None)


def predictions_name(split: str) -> str:
    return f"{split}_predictions.jsonl"


def batches_per_epoch_for(cfg: TrainConfig, train_rows: int) -> int:
    """Micro-batches in each worker's equal share of train (`train_rows.worker_rows`)."""
    return max(1, math.ceil(train_rows // cfg.num_workers / cfg.batch_size))


def total_steps_for(cfg: TrainConfig, train_rows: int) -> int:
    """--max-steps, or --epochs passes of this worker's equal share of train (what the LR schedule spans); an
    epoch's last step may take fewer than --grad-accumulation micro-batches."""
    steps_per_epoch = math.ceil(batches_per_epoch_for(cfg, train_rows) / cfg.grad_accumulation)
    return cfg.max_steps or steps_per_epoch * cfg.epochs


def check_data_fits_model(cfg: TrainConfig, manifest: dict) -> None:
    from qa_models import MODELS

    passages = MODELS[cfg.model].inputs == "passages"
    schema = manifest.get("schema", "tokenised_pairs")
    if passages and schema != "tokenised_passages":
        raise ValueError(f"{cfg.data}: {schema} shards; --model {cfg.model} reads reading-comprehension passages "
                         "(tokenize_corpora.py --dataset searchqa|quasart|wikihop|squad)")
    if not passages and schema != "tokenised_pairs":
        raise ValueError(f"{cfg.data}: {schema} shards; --model {cfg.model} trains on answer-selection pairs "
                         "(tokenised_pairs)")


def run(cfg: TrainConfig) -> dict:
    """Train (or resume) on the connected Ray cluster; return the job's summary."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from runtime.ray_env import train_log_level
    from pipelines.shards import shard_paths

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
    scored = _scored_checkpoints(result)
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


def dev_references(paths: list[str], policy: str, seed: int) -> dict:
    """A random and a word-overlap ranking of the dev questions (qa_models/references.py), scored as the model's
    dev figures are: what its MAP/MRR/P@1 mean."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qa_models.references import reference_rankings

    table = pa.concat_tables([pq.read_table(p, columns=["qid", "label", "question_ids", "answer_ids"]) for p in paths])
    return reference_rankings(table["qid"].to_pylist(), table["label"].to_pylist(), table["question_ids"].to_pylist(),
                              table["answer_ids"].to_pylist(), policy, seed)


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
    from jobs.evaluate import EvaluateConfig, evaluate_checkpoint, write_jsonl

    summary, records = evaluate_checkpoint(EvaluateConfig(checkpoint=chosen, data=cfg.data, split=cfg.test_split))
    _log(f"[train] best checkpoint (step {summary['step']}) {cfg.test_split} {json.dumps(summary['metrics'])}")
    destination = run_dir(cfg) + "/" + name
    with tempfile.TemporaryDirectory() as directory:
        write_jsonl(records, os.path.join(directory, name))
        publish(os.path.join(directory, name), destination)
    figures = {k: summary[k] for k in ("policy", "rows", "metrics") if k in summary}
    return dict(figures, split=cfg.test_split, step=summary["step"], checkpoint=chosen, predictions=destination)

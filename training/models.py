"""The model a run trains: its config from the model's defaults, a pretrained checkpoint's, the recipe's model
options, the flags and --model-option, in that order; word vectors decide the embedding width."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch

from training.data import EMBEDDING_WIDTH_FIELDS, embeddings_path

if TYPE_CHECKING:
    from training.config import TrainConfig


def model_config(
    cfg: TrainConfig,
    vocab_size: int | None = None,
    vectors_dim: int | None = None,
    from_data: dict | None = None,
    pretrained: dict | None = None,
):
    """The model's config: its own defaults or, fine-tuning, the `pretrained` checkpoint's, then the recipe's
    model options (its paper's dropout, initialisation, ...), then the general flags that were given and that it
    has, then --model-option values. With word vectors of width
    `vectors_dim`, the embedding width is theirs; without, embeddings are trained (a frozen table of random
    vectors would carry nothing) unless --model-option freeze_embeddings says otherwise."""
    from qa_models import MODELS

    if cfg.model not in MODELS:
        raise ValueError(f"unknown model {cfg.model!r}; registered: {sorted(MODELS)}")
    cls = MODELS[cfg.model]
    given = {
        "vocab_size": vocab_size,
        "dim": cfg.dim,
        "hops": cfg.hops,
        "dropout": cfg.dropout,
        "max_len": cfg.max_len,
        "encoder_path": cfg.encoder_path,
    }
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    if cfg.encoder_path and "encoder_path" not in fields:
        raise ValueError(f"--model {cfg.model} reads word ids; --encoder-path is for models with a transformer")
    given.update(from_data or {})
    values = {
        **(pretrained or {}),
        **{k: v for k, v in (cfg.recipe_options or {}).items() if k in fields},
        **{k: v for k, v in given.items() if k in fields and v is not None},
        **cfg.model_overrides,
    }
    if vectors_dim is not None:
        width = next(name for name in EMBEDDING_WIDTH_FIELDS if name in fields)
        if values.get(width, vectors_dim) != vectors_dim:
            flag = "--dim" if width == "dim" and cfg.dim is not None else f"--model-option {width}"
            raise ValueError(
                f"{flag} {values[width]} conflicts with the {vectors_dim}-d word vectors "
                f"({embeddings_path(cfg)}); drop it, or train without them (--embeddings none)"
            )
        values[width] = vectors_dim
    elif "freeze_embeddings" in fields and "freeze_embeddings" not in cfg.model_overrides and not pretrained:
        values["freeze_embeddings"] = False
    return cls.config_class(**values)


def build_model(
    cfg: TrainConfig,
    vocab_size: int,
    vectors: np.ndarray | None = None,
    from_data: dict | None = None,
    pretrained: dict | None = None,
):
    from qa_models import MODELS

    config = model_config(cfg, vocab_size, None if vectors is None else vectors.shape[1], from_data, pretrained)
    return MODELS[cfg.model](config, embeddings=None if vectors is None else torch.from_numpy(vectors).float())


def training_forward(model: torch.nn.Module, mode: str):
    """The module the training step calls: `model` itself (mode "none"), or `model` under torch.compile in `mode`
    (config.COMPILE_MODES) with dynamic shapes, one graph for every batch length (reduce-overhead records a CUDA
    graph per length). A wrapper of its own: checkpoints and evaluation keep reading `model`, eager."""
    if mode == "none":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=True)

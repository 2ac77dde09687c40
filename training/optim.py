"""A recipe's optimisation, applied: the optimiser, the learning-rate schedule, the coupled L2 term and the
exponential moving average of the weights (qa_models/recipes.py states them, per paper).

Plain PyTorch; the per-worker loop (training/loop.py) calls these with its resolved TrainConfig, whose fields
carry the recipe's names (optimizer, lr, momentum, rho, betas, eps, weight_decay, l2, schedule, warmup,
warmup_steps, ema_decay).
"""

from __future__ import annotations

import contextlib

import torch


def build_optimizer(cfg, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """The recipe's optimiser over the trainable parameters. AdamW decays matrices only (BERT's convention: biases
    and LayerNorm gains are left alone); the others take no decay of their own (their L2 is `l2_penalty`).

    `cfg.head_lr` (None unless given): the rate of every parameter outside a pretrained transformer, which keeps
    `lr`; the papers fine-tune all at one rate, and a short run learns its new layers faster with their own."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        groups = [
            {"params": [p for _, p in named if p.ndim >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for _, p in named if p.ndim < 2], "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": [p for _, p in named]}]
    groups = _head_rate(groups, model, getattr(cfg, "head_lr", None))
    # On a GPU one fused kernel updates every parameter of a group (PyTorch's for-each path launches several per
    # tensor list); the arithmetic is Adam's either way.
    fused = bool(named) and all(p.is_cuda for _, p in named)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(groups, lr=lr, momentum=cfg.momentum, eps=cfg.eps)
    if cfg.optimizer == "adadelta":
        return torch.optim.Adadelta(groups, lr=lr, rho=cfg.rho, eps=cfg.eps)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def _head_rate(groups: list[dict], model: torch.nn.Module, head_lr: float | None) -> list[dict]:
    """`groups` unchanged without `head_lr` (so optimiser states saved before load as they were); with it, each
    split in two: the parameters inside a pretrained transformer (at the optimiser's rate), then the rest at
    `head_lr`, empty halves dropped."""
    if not head_lr:
        return groups
    pretrained = _pretrained_parameters(model)
    split = []
    for group in groups:
        inside = [p for p in group["params"] if id(p) in pretrained]
        outside = [p for p in group["params"] if id(p) not in pretrained]
        split += [dict(group, params=inside), dict(group, params=outside, lr=head_lr)]
    return [g for g in split if g["params"]]


def _pretrained_parameters(model: torch.nn.Module) -> set[int]:
    """ids of the parameters inside a pretrained transformer (qa_models.encoders.PretrainedTransformer)."""
    from qa_models.encoders import PretrainedTransformer

    return {
        id(p) for module in model.modules() if isinstance(module, PretrainedTransformer) for p in module.parameters()
    }


def lr_factor(schedule: str, total_steps: int, warmup: float = 0.0, warmup_steps: int = 0):
    """The multiplier of the peak rate at each step (for LambdaLR). warmup_linear: up linearly over the warm-up,
    then linearly down to 0 at the last step (GSAMN); warmup_constant: up linearly over the warm-up, then flat
    (DynSAN); constant: flat. The warm-up is `warmup_steps` steps when given, else a `warmup` share of the run."""
    warm = warmup_steps if warmup_steps else int(total_steps * warmup)
    warm = max(1, warm) if schedule != "constant" else 0

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if schedule == "warmup_linear":
            return max(0.0, (total_steps - step) / max(1, total_steps - warm))
        return 1.0

    return factor


def l2_penalty(model: torch.nn.Module, l2: float) -> torch.Tensor | float:
    """lambda * sum of squared trainable parameters: the L2 term of a loss (CTRN eq. 3, IARNN section 5.2)."""
    if not l2:
        return 0.0
    return l2 * sum(p.pow(2).sum() for p in model.parameters() if p.requires_grad)


class WeightAverage:
    """An exponential moving average of a model's floating-point parameters and buffers, updated after every
    optimiser step with decay min(decay, (1 + n) / (10 + n)) at update n (TensorFlow's ExponentialMovingAverage
    with num_updates), so that the average follows the weights early on rather than the initialisation.
    Evaluation swaps it in (`applied`); checkpoints carry it (`state_dict`) beside the raw weights."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay, self.updates = decay, 0
        self.shadow = {
            name: value.detach().clone() for name, value in model.state_dict().items() if value.is_floating_point()
        }

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for name, value in model.state_dict().items():
            if name in self.shadow:
                self.shadow[name].lerp_(value.detach(), 1.0 - decay)

    def averaged_state(self, model: torch.nn.Module) -> dict:
        """The model's state dict with the averaged values in place of the live ones."""
        return {name: self.shadow.get(name, value) for name, value in model.state_dict().items()}

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module):
        """The averaged weights in `model` for the duration (evaluation), the live ones back afterwards."""
        live = {name: value.detach().clone() for name, value in model.state_dict().items() if name in self.shadow}
        model.load_state_dict(self.averaged_state(model))
        try:
            yield model
        finally:
            model.load_state_dict({**model.state_dict(), **live})

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        """A saved average (read on the CPU), onto the devices of this one's tensors (the model's)."""
        self.decay, self.updates = state["decay"], state["updates"]
        self.shadow = {
            name: value.to(self.shadow[name].device if name in self.shadow else value.device, copy=True)
            for name, value in state["shadow"].items()
        }


def evaluation_weights(state: dict) -> dict:
    """The weights a checkpoint's figures were scored with (a state.pt of jobs/train.py): the moving average where
    the run kept one (`weight_average`), else the live weights."""
    average = state.get("weight_average")
    return {**state["model"], **average["shadow"]} if average else state["model"]

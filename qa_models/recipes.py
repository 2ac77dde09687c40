"""How a paper trains its model, as data: the optimiser and its settings, the learning-rate schedule, the batch,
regularisation, dropout, initialisation and when to stop.

Each model module states its paper's recipe beside its config (`PAPER_RECIPE`, with the paper's words quoted in
`source`) and sets it on its model classes (`Model.recipe`); jobs/train.py trains with it by default (`--recipe
paper`), and every flag it has overrides the field of the same name. `UNIFORM` is the one recipe every model
trained with before the papers' own were written down (GSAMN's: AdamW, warm-up and linear decay, batch 32), kept
for comparisons (`--recipe uniform`). Plain data, no torch: the training glue applies it (training/optim.py).

Where a paper is silent, a field holds our choice and `ours` says which fields those are and why; where this
machine cannot follow the paper (word2vec or GloVe vectors are not available offline), `deviations` says so, and
the results report prints both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

OPTIMIZERS = ("adamw", "adam", "rmsprop", "adadelta")
SCHEDULES = ("warmup_linear", "warmup_constant", "constant")
NEGATIVES = ("question", "random")


@dataclass(frozen=True)
class TrainingRecipe:
    optimizer: str = "adamw"  # adamw | adam | rmsprop | adadelta
    lr: float = 1e-3  # the peak rate (Adadelta's is a scale on its own step, 1.0 in Zeiler 2012)
    encoder_lr: float | None = None  # the rate instead when a pretrained transformer is fine-tuned (--encoder-path)
    betas: tuple[float, float] = (0.9, 0.999)  # Adam(W)
    momentum: float = 0.0  # RMSProp
    rho: float = 0.9  # Adadelta's decay (RMSProp's is `alpha` in torch; kept at its 0.99 default)
    eps: float = 1e-8
    weight_decay: float = 0.0  # decoupled (AdamW), on matrices only
    l2: float = 0.0  # lambda * sum of squared trainable parameters, added to the loss (coupled L2)
    schedule: str = "constant"  # warmup_linear | warmup_constant | constant
    warmup: float = 0.0  # share of the run's steps of linear warm-up (warmup_linear)
    warmup_steps: int = 0  # steps of linear warm-up (warmup_constant); overrides `warmup` when set
    batch_size: int = 32  # rows per worker per step
    grad_clip: float = 0.0  # global gradient-norm clip; 0: none
    ema_decay: float = 0.0  # exponential moving average of the weights, used to evaluate and saved; 0: off
    epochs: int = 1  # passes over train when no --max-steps is given
    patience: int = 0  # stop after this many dev evaluations without a new best; 0: never early
    negatives: str = "question"  # pairwise models: a positive's negative from its own question, or at random
    model_options: dict = field(default_factory=dict)  # fields of the model's config (dropout, init, ...)
    source: str = ""  # the paper's section and words
    ours: str = ""  # the fields the paper does not give, and what we chose
    deviations: str = ""  # what this machine cannot follow

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {NEGATIVES}, got {self.negatives!r}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must lie in [0, 1), got {self.ema_decay}")

    def with_overrides(self, **given) -> TrainingRecipe:
        """This recipe with every field of `given` that is not None replaced (the flags a user gave)."""
        return replace(self, **{k: v for k, v in given.items() if v is not None})

    def as_dict(self) -> dict:
        return asdict(self)


# What every model trained with before the papers' recipes were written down: GSAMN's optimiser and schedule at
# the word-embedding rate. `--recipe uniform` trains any model this way.
UNIFORM = TrainingRecipe(
    optimizer="adamw",
    lr=1e-3,
    encoder_lr=5e-5,
    weight_decay=0.01,
    schedule="warmup_linear",
    warmup=0.1,
    batch_size=32,
    grad_clip=1.0,
    epochs=1,
    source="the project's single recipe before the papers' own (GSAMN's optimiser and schedule)",
    ours="lr 1e-3 for word embeddings (5e-5 with a pretrained encoder); gradient clip 1.0",
)

RECIPE_NAMES = ("paper", "uniform")


def recipe_of(model_class, name: str = "paper") -> TrainingRecipe:
    """The recipe `name` of a model class: its paper's (`Model.recipe`) or the uniform one."""
    if name not in RECIPE_NAMES:
        raise ValueError(f"recipe must be one of {RECIPE_NAMES}, got {name!r}")
    if name == "uniform":
        return UNIFORM
    return getattr(model_class, "recipe", UNIFORM)

"""The models that mine hard negatives (`--hard-negatives MINER` of jobs/build_stackexchangeqa.py): a sentence
encoder that ranks a question's candidates, and optionally a trained checkpoint that re-ranks the encoder's
shortlist (`Ranker`). The mining itself, which candidates a question takes and why, is a pipeline stage
(`pipelines.hard_negatives`), handed the `ModelMiner` that `miner_of` makes here.

    miner = miner_of(cfg)        # None where cfg.hard_negatives is unset: random negatives
    check_miner(miner.spec)      # before any work: a miner that cannot be loaded is refused in a line
    write(cfg, miner)            # pipelines.stackexchangeqa.write
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipelines.hard_negatives import MinerSpec
from pipelines.stackexchangeqa.config import BuildConfig

if TYPE_CHECKING:
    from inference.ranker import Ranker

ENCODER_NAMES = ("minilm", "mpnet-base")


def is_checkpoint(path: str) -> bool:
    """A checkpoint folder of jobs/train.py, or a run folder holding them (rather than a sentence encoder)."""
    from training.checkpoints import STATE_FILE

    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name)) for name in (STATE_FILE, "checkpoint_manager_snapshot.json")
    )


def miner_spec(miner: str, retriever: str = "minilm", **options) -> MinerSpec:
    """`--hard-negatives MINER` as a MinerSpec: an encoder name or folder mines alone; a checkpoint or run folder
    re-ranks what `retriever` finds. Paths are made absolute: tasks may run anywhere on the cluster's shared file
    system."""
    if miner in ENCODER_NAMES or not is_checkpoint(miner):
        return MinerSpec(retriever=_absolute(miner), **options)
    return MinerSpec(retriever=_absolute(retriever), checkpoint=os.path.abspath(miner), **options)


def _absolute(encoder: str) -> str:
    return encoder if encoder in ENCODER_NAMES else os.path.abspath(encoder)


def check_miner(spec: MinerSpec) -> None:
    """Refuses, before any work, a miner that cannot be loaded: a missing encoder or checkpoint, a
    reading-comprehension checkpoint (`Ranker`'s refusals). Raises UsageError naming the option."""
    from qa_models.encoders import require_encoder, resolve_encoder
    from runtime.checks import UsageError

    option = "--mine-retriever" if spec.checkpoint else "--hard-negatives"  # the option that named the encoder
    try:
        path = resolve_encoder(spec.retriever)
    except (ImportError, FileNotFoundError, ValueError) as error:
        raise UsageError(f"{option} {spec.retriever}: {error}") from None
    if not os.path.isfile(os.path.join(path, "config.json")):
        encoder = "'minilm', 'mpnet-base', a sentence encoder folder (config.json and tokenizer)"
        if spec.checkpoint:
            raise UsageError(f"--mine-retriever {spec.retriever}: neither {encoder.replace(', a', ' nor a')}")
        raise UsageError(
            f"--hard-negatives {spec.retriever}: neither {encoder} nor a checkpoint or run folder of jobs/train.py"
        )
    try:
        require_encoder(path, spec.max_len, "--mine-max-len")
    except ValueError as error:
        raise UsageError(f"{option} {spec.retriever}: {error}") from None
    if spec.checkpoint:
        from inference.ranker import Ranker

        try:
            Ranker.from_checkpoint(spec.checkpoint, device="cpu")
        except (OSError, ValueError) as error:
            raise UsageError(f"--hard-negatives {spec.checkpoint}: {error}") from None


def miner_of(cfg: BuildConfig) -> ModelMiner | None:
    """The miner of a build's --hard-negatives and --mine-* options (None: random negatives)."""
    if not cfg.hard_negatives:
        return None
    spec = miner_spec(
        cfg.hard_negatives,
        cfg.mine_retriever,
        candidates=cfg.mine_candidates,
        max_similarity=cfg.mine_max_similarity,
        batch_size=cfg.mine_batch_size,
        max_len=cfg.mine_max_len,
    )
    return ModelMiner(spec)


class Embedder:
    """The retriever of a MinerSpec: normalised sentence vectors of texts, on the task's GPU where it has one."""

    def __init__(self, spec: MinerSpec):
        from qa_models.encoders import SentenceEmbedder, resolve_encoder
        from training.config import resolve_device

        self.spec = spec
        self.device = resolve_device("auto")
        self.model = SentenceEmbedder(resolve_encoder(spec.retriever), spec.max_len).eval().to(self.device)

    def __call__(self, texts: list[str]) -> np.ndarray:
        """(len(texts), d) float32, each distinct text embedded once, in batches of similar lengths in a fixed
        order."""
        distinct = sorted(set(texts), key=lambda t: (len(t), t))
        size = self.spec.batch_size
        parts = [self.model(distinct[i : i + size]).float().cpu().numpy() for i in range(0, len(distinct), size)]
        if not parts:
            return np.zeros((0, 1), np.float32)
        vectors = np.concatenate(parts)
        where = {text: i for i, text in enumerate(distinct)}
        return vectors[[where[t] for t in texts]]


# Loaded once per worker process: Ray pickles the ModelMiner (its spec) into every task, not the models.
_EMBEDDERS: dict[MinerSpec, Embedder] = {}
_RANKERS: dict[str, Ranker] = {}


@dataclass(frozen=True)
class ModelMiner:
    """A MinerSpec's models at work (`pipelines.hard_negatives.Miner`): `embed` with the retriever, `score` with
    the re-ranking checkpoint, each loaded on first use in the process that runs the task."""

    spec: MinerSpec

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.spec not in _EMBEDDERS:
            _EMBEDDERS[self.spec] = Embedder(self.spec)
        return _EMBEDDERS[self.spec](texts)

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """The checkpoint's score of each (question, answer) pair, in the order given."""
        checkpoint = self.spec.checkpoint
        if checkpoint is None:
            raise ValueError("this miner has no checkpoint to score pairs with (MinerSpec.checkpoint is None)")
        if checkpoint not in _RANKERS:
            from inference.ranker import Ranker

            _RANKERS[checkpoint] = Ranker.from_checkpoint(checkpoint, device="auto")
        scores = _RANKERS[checkpoint].score(pairs, batch_size=self.spec.batch_size) if pairs else []
        return np.asarray(scores, dtype=np.float64)

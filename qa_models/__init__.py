"""Answer-selection and reading-comprehension encoders in plain PyTorch (no Ray), and their metrics.

`MODELS` maps each `--model` name of jobs/train.py to its class; each class has a `config_class` dataclass
with a `tiny()` preset.
"""

from typing import Any, Protocol

from torch import nn

from qa_models.ctrn import CTRN, QRNN
from qa_models.dynsan import DynSAN
from qa_models.ggsa import (
    GGSA,
    IGGSA,
    QALSTM,
    GlobalSelfAttention,
    GroupSelfAttention,
    LocalSelfAttention,
    LocalSelfAttentionGate,
    QALSTMAttention,
)
from qa_models.gsamn import GSAMN, EncoderOnly, TransformersOnTop
from qa_models.iarnn import IARNN, OARNN, GRUBaseline, IARNNContext, IARNNGate, IARNNOccamContext, IARNNOccamWord
from qa_models.recipes import TrainingRecipe


class ModelClass(Protocol):
    """What training reads of a registered model class: its config dataclass (with `tiny()`), its paper's recipe,
    the shape of batch it takes ("joint", "separate" or "passages"), and its constructor."""

    config_class: Any
    recipe: TrainingRecipe
    inputs: str

    def __call__(self, config: Any, *args: Any, **kwargs: Any) -> nn.Module: ...


MODELS: dict[str, ModelClass] = {
    "gsamn": GSAMN,
    "bert-transformer": TransformersOnTop,
    "bert": EncoderOnly,
    "ctrn": CTRN,
    "qrnn": QRNN,
    "ggsa": GGSA,
    "iggsa": IGGSA,
    "global-sa": GlobalSelfAttention,
    "group-sa": GroupSelfAttention,
    "local-sa": LocalSelfAttention,
    "local-sa-gate": LocalSelfAttentionGate,
    "qa-lstm": QALSTM,
    "qa-lstm-attention": QALSTMAttention,
    "iarnn-word": IARNN,
    "iarnn-context": IARNNContext,
    "iarnn-gate": IARNNGate,
    "iarnn-occam-word": IARNNOccamWord,
    "iarnn-occam-context": IARNNOccamContext,
    "oarnn": OARNN,
    "gru": GRUBaseline,
    "dynsan": DynSAN,
}

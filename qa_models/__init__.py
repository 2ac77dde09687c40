"""Answer-selection and reading-comprehension encoders in plain PyTorch (no Ray), and their metrics.

`MODELS` maps each `--model` name of jobs/train.py to its class; each class has a `config_class` dataclass
with a `tiny()` preset.
"""
from qa_models.ctrn import CTRN, QRNN
from qa_models.gsamn import GSAMN

MODELS = {"gsamn": GSAMN, "ctrn": CTRN, "qrnn": QRNN}

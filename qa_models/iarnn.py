"""IARNN, Inner Attention based Recurrent Neural Networks for answer selection, and the OARNN and GRU baselines.

Wang, Liu, Zhao. "Inner Attention based Recurrent Neural Networks for Answer Selection", ACL 2016. A bidirectional
GRU, shared by question and answer, reads the question; r_q is the average of its states. The answer is read by the
same GRU with the question's attention put *before* the representation:

    IARNN-WORD     alpha_t = sigmoid(r_q^T M_qi x_t),  x~_t = alpha_t x_t                              (4)
    IARNN-CONTEXT  w_C(t) = M_hc h_{t-1} + M_qc r_q,  alpha_t = sigmoid(w_C(t)^T x_t),  x~_t = alpha_t x_t (6)
    IARNN-GATE     z_t = sigmoid(W_xz x_t + W_hz h_{t-1} + M_qz r_q),
                   f_t = sigmoid(W_xf x_t + W_hf h_{t-1} + M_qf r_q)                                    (7)

with the paper's GRU (eq. 5): h~_t = tanh(W_xh x~_t + W_hh (f_t * h_{t-1})), h_t = (1 - z_t) h_{t-1} + z_t h~_t
(the reset gate f acts before W_hh, as in Cho et al., unlike torch.nn.GRU), and r_a the average of the answer's
states. IARNN-OCCAM adds n_p = max(w_qp^T r_q, lambda_q) * sum_t alpha_t to each pair's loss (eq. 8), a sparsity
penalty whose strength the question sets. OARNN (eq. 2-3) reads the answer plainly and pools it with attention
weighted by r_q; GRU averages both. Training minimises the hinge max(0, M - sim(r_q, r_a+) + sim(r_q, r_a-))
(eq. 9) with cosine or GESD (eq. 10) similarity.

In the backward direction of the bidirectional GRU, "h_{t-1}" of eq. 6 is the state after reading the words
right of t. The paper's WikiQA setting is the default: hidden size 165, margin 0.15, fixed word embeddings;
InsuranceQA used 145, margin 0.12, GESD and trained embeddings; TrecQA 80, margin 0.1, 50-d embeddings. Its
common setup (section 5.2) initialises "all weights and attention matrices by fixing their largest singular
values to 1" (`init="unit_spectral"`: each matrix, and each gate's block of a stacked one, divided by its
spectral norm) and sets lambda_q = 0.05; the rest of it (Adadelta, L2, dropout) is `PAPER_RECIPE`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qa_models.encoders import word_embedding_table
from qa_models.matching import AttentivePooling, masked_mean, pairwise_hinge, similarity, with_negatives
from qa_models.recipes import TrainingRecipe

ATTENTIONS = ("none", "outer", "word", "context", "gate")
INITS = ("default", "unit_spectral")


@dataclass
class IARNNConfig:
    vocab_size: int = 30_000
    embed_dim: int = 300
    hidden: int = 165  # per direction
    attention: str = "word"  # none (GRU) | outer (OARNN) | word | context | gate
    occam: bool = False
    occam_floor: float = 0.05  # lambda_q: "IARNN-OCCAM base regulation hyper-parameter lambda_q is set to 0.05"
    similarity: str = "cosine"  # or gesd
    margin: float = 0.15
    freeze_embeddings: bool = True
    embed_dropout: float = 0.0
    init: str = "default"  # "unit_spectral": every matrix's largest singular value 1 (section 5.2)
    max_len: int = 100
    pad_id: int = 0

    @classmethod
    def tiny(cls) -> IARNNConfig:
        return cls(vocab_size=64, embed_dim=12, hidden=8, freeze_embeddings=False, max_len=32)


PAPER_RECIPE = TrainingRecipe(
    optimizer="adadelta",
    lr=1.0,
    rho=0.9,
    eps=1e-6,
    l2=1e-5,
    schedule="constant",
    batch_size=16,
    epochs=5,
    model_options={"embed_dropout": 0.3, "init": "unit_spectral", "occam_floor": 0.05},
    source='Wang et al. 2016, section 5.2, Common Setup: "initiate all weights and attention matrices by fixing '
    "their largest singular values to 1 ... IARNN-OCCAM base regulation hyper-parameter lambda_q is set to "
    "0.05, we add L2 penalty with a coefficient of 10^-5. Dropout is further applied to every parameters with "
    'probability 30%. We use Adadelta with rho = 0.90 to update parameters." WikiQA: "batch size is set to '
    '1"; InsuranceQA: "we set the batch size to 16"',
    ours="batch 16, the paper's InsuranceQA batch: its WikiQA batch of one triplet leaves no in-batch negative to "
    "pair with a positive here; Adadelta's scale 1.0 and eps 1e-6 (Zeiler 2012); dropout 0.3 on the word "
    'vectors the GRU reads ("every parameter" read as every input); up to 5 epochs, best dev checkpoint '
    "kept (the paper gives no count); no gradient clip",
    deviations="100-d word2vec vectors are not available offline: fastText vectors trained on the data set itself "
    "(jobs/word_vectors.py), fixed as the paper's",
)


class AttentiveGRUCell(nn.Module):
    """One direction of the paper's GRU (eq. 5), with the question's attention on its input (eq. 4, 6) or
    gates (eq. 7)."""

    def __init__(self, input_dim: int, hidden: int, question_dim: int, attention: str):
        super().__init__()
        self.hidden, self.attention = hidden, attention
        self.x_proj = nn.Linear(input_dim, 3 * hidden, bias=False)  # W_xz, W_xf, W_xh
        self.bias = nn.Parameter(torch.zeros(3 * hidden))
        self.h_gates = nn.Linear(hidden, 2 * hidden, bias=False)  # W_hz, W_hf
        self.h_candidate = nn.Linear(hidden, hidden, bias=False)  # W_hh
        if attention == "context":
            self.context_h = nn.Linear(hidden, input_dim, bias=False)  # M_hc
            self.context_q = nn.Linear(question_dim, input_dim, bias=False)  # M_qc
        if attention == "gate":
            self.q_gates = nn.Linear(question_dim, 2 * hidden, bias=False)  # M_qz, M_qf

    def forward(self, x, mask, r_q=None, alpha=None, reverse: bool = False):
        """States (B, L, h) and, for context attention, the weights alpha (B, L). x: (B, L, n); `alpha` (B, L)
        scales the input (word attention); without `r_q` the cell reads plainly (the question side)."""
        batch, length, _ = x.shape
        projected = self.x_proj(x)  # (B, L, 3h); W (alpha x) = alpha (W x), so it is computed once
        if alpha is not None:
            projected = projected * alpha[..., None]
        q_gates = self.q_gates(r_q) if self.attention == "gate" and r_q is not None else 0.0  # (B, 2h)
        context_q = self.context_q(r_q) if self.attention == "context" and r_q is not None else None  # (B, n)
        h = x.new_zeros(batch, self.hidden)
        states: dict[int, torch.Tensor] = {}
        alphas: dict[int, torch.Tensor] = {}
        steps = range(length - 1, -1, -1) if reverse else range(length)
        for t in steps:
            p_t = projected[:, t]  # (B, 3h)
            if context_q is not None:
                w_c = self.context_h(h) + context_q  # (B, n): eq. 6
                a_t = torch.sigmoid((w_c * x[:, t]).sum(-1, keepdim=True))  # (B, 1)
                alphas[t] = a_t.squeeze(-1)
                p_t = p_t * a_t
            p_t = p_t + self.bias
            z, f = torch.sigmoid(p_t[:, : 2 * self.hidden] + self.h_gates(h) + q_gates).chunk(2, dim=-1)
            candidate = torch.tanh(p_t[:, 2 * self.hidden :] + self.h_candidate(f * h))  # (B, h)
            h = torch.where(mask[:, t, None], (1 - z) * h + z * candidate, h)  # padding leaves h as it was
            states[t] = h
        out = torch.stack([states[t] for t in range(length)], 1) * mask[..., None].to(x.dtype)  # (B, L, h)
        if context_q is None:
            return out, None
        return out, torch.stack([alphas[t] for t in range(length)], 1) * mask.to(x.dtype)


class IARNN(nn.Module):
    config_class = IARNNConfig
    recipe = PAPER_RECIPE
    inputs = "separate"
    objective = "pairwise"

    def __init__(self, config: IARNNConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        if config.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {config.attention!r}")
        self.config = config
        self.embed = word_embedding_table(
            config.vocab_size, config.embed_dim, config.pad_id, embeddings, config.freeze_embeddings
        )
        self.embed_dropout = nn.Dropout(config.embed_dropout)
        width = 2 * config.hidden
        self.forward_cell = AttentiveGRUCell(config.embed_dim, config.hidden, width, config.attention)
        self.backward_cell = AttentiveGRUCell(config.embed_dim, config.hidden, width, config.attention)
        if config.attention == "word":
            self.word_attention = nn.Linear(width, config.embed_dim, bias=False)  # M_qi
        if config.attention == "outer":
            self.outer = AttentivePooling(width)  # W_hm, W_qm, w_ms
        if config.occam:
            if config.attention not in ("word", "context"):
                raise ValueError("the Occam penalty regulates word or context attention (the paper: not the gate)")
            self.occam = nn.Linear(width, 1, bias=False)  # w_qp
        if config.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {config.init!r}")
        if config.init == "unit_spectral":
            unit_spectral_(self)

    def _read(self, ids, mask, r_q=None):
        """States (B, L, 2h) and the attention weights (B, L) of the answer side (None elsewhere)."""
        x = self.embed_dropout(self.embed(ids))  # (B, L, n)
        alpha = None
        if r_q is not None and self.config.attention == "word":
            alpha = torch.sigmoid((self.word_attention(r_q)[:, None, :] * x).sum(-1)) * mask  # (B, L): eq. 4
        attend = r_q if self.config.attention in ("context", "gate") else None
        forward, a_fwd = self.forward_cell(x, mask, attend, alpha)
        backward, a_bwd = self.backward_cell(x, mask, attend, alpha, reverse=True)
        if a_fwd is not None:
            alpha = (a_fwd + a_bwd) / 2  # each direction weighs the word in its own context
        return torch.cat([forward, backward], -1), alpha

    def match(self, question_ids, question_mask, answer_ids, answer_mask):
        """Similarities (B,) and the Occam penalties n_p * sum_t alpha_t (B,) (zeros without Occam)."""
        q_mask, a_mask = question_mask.bool(), answer_mask.bool()
        h_q, _ = self._read(question_ids, q_mask)
        r_q = masked_mean(h_q, q_mask)  # (B, 2h)
        inner = self.config.attention in ("word", "context", "gate")
        h_a, alpha = self._read(answer_ids, a_mask, r_q if inner else None)
        r_a = self.outer(h_a, a_mask, r_q) if self.config.attention == "outer" else masked_mean(h_a, a_mask)
        penalty = torch.zeros_like(r_q[:, 0])
        if self.config.occam:
            n_p = self.occam(r_q).squeeze(-1).clamp_min(self.config.occam_floor)  # (B,): eq. 8
            penalty = n_p * alpha.sum(1)
        return similarity(r_q, r_a, self.config.similarity), penalty

    def forward(self, question_ids, question_mask, answer_ids, answer_mask, negative_ids=None, negative_mask=None):
        """Similarities (B,); with a negative answer per row (training), (sim+, sim-, Occam penalties)."""
        if negative_ids is None:
            return self.match(question_ids, question_mask, answer_ids, answer_mask)[0]
        sims, penalty = self.match(
            *with_negatives(question_ids, question_mask, answer_ids, answer_mask, negative_ids, negative_mask)
        )
        positive, negative = sims.chunk(2)
        return positive, negative, sum(penalty.chunk(2))

    def loss(self, output, labels: torch.Tensor) -> torch.Tensor:
        """Eq. 9 (plus eq. 8's penalty for both answers of a triplet); `labels` weight the rows."""
        positive, negative, penalty = output
        weight = labels.to(positive.dtype)
        return pairwise_hinge(positive, negative, weight, self.config.margin) + (
            penalty * weight
        ).sum() / weight.sum().clamp_min(1.0)

    @staticmethod
    def score(output: torch.Tensor) -> torch.Tensor:
        return output


def unit_spectral_(model: nn.Module) -> None:
    """Divide every weight matrix but the word embeddings by its largest singular value (Pascanu et al. 2013, as
    section 5.2 initialises); a cell's stacked gate matrices (W_xz; W_xf; W_xh and the like) block by block."""
    blocks = {"x_proj": 3, "h_gates": 2, "q_gates": 2}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim != 2 or name.startswith("embed"):
                continue
            parts = blocks.get(name.split(".")[-2], 1)
            for block in parameter.chunk(parts, dim=0):
                block.div_(torch.linalg.matrix_norm(block, ord=2).clamp_min(1e-12))


# ------------------------------------------------------------------------------------ variants and baselines
@dataclass
class IARNNContextConfig(IARNNConfig):
    attention: str = "context"


@dataclass
class IARNNGateConfig(IARNNConfig):
    attention: str = "gate"


@dataclass
class IARNNOccamWordConfig(IARNNConfig):
    occam: bool = True


@dataclass
class IARNNOccamContextConfig(IARNNConfig):
    attention: str = "context"
    occam: bool = True


@dataclass
class OARNNConfig(IARNNConfig):
    attention: str = "outer"


@dataclass
class GRUConfig(IARNNConfig):
    attention: str = "none"


class IARNNContext(IARNN):
    config_class = IARNNContextConfig


class IARNNGate(IARNN):
    config_class = IARNNGateConfig


class IARNNOccamWord(IARNN):
    config_class = IARNNOccamWordConfig


class IARNNOccamContext(IARNN):
    config_class = IARNNOccamContextConfig


class OARNN(IARNN):
    """The outer-attention baseline (eq. 2-3)."""

    config_class = OARNNConfig


class GRUBaseline(IARNN):
    """The plain bidirectional GRU, both sides averaged."""

    config_class = GRUConfig

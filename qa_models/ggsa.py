"""GGSA and iGGSA, Gated Group Self-Attention for answer selection, and the baselines of their tables.

Xu, Ji, Huang, Deng, Li. "Gated Group Self-Attention for Answer Selection", arXiv preprint, 2019. Words are embedded
(dropout on the embeddings, keep 0.7, before the sinusoidal positions are added, section 4.2), and a GGSA block
(section 3.1.3) reads them:

    x_bar = mean_i x_i                                                                  (1)
    g_i   = sigmoid(W (x_i * x_bar) + b)                     the global information gate
    C     = GroupMultiHeadAttention(X * G)                   groups of l words, per-head offsets
    Y     = LayerNorm(X + C)                                                            (2)
    R     = FeedForward(Y)                                                              (3)
    H     = Y + R                                            no last layer norm         (4)

iGGSA (section 3.2) adds a question-aware residual in the answer's block, c^q = mean_i h_i^q (5),
R~ = FeedForward(Y^a * c^q), Y~^a = LayerNorm(Y^a + R~), R = FeedForward(Y~^a) (6), H^a = Y~^a + R (7).
Question and answer share the encoder by default (as QA-LSTM does); `shared_encoder=False` gives each its own
blocks, as Figure 7 draws "two GGSA encoders" (the word embeddings stay shared). The composition module
(max-pooling, attention, multihop sequential attention) and the pairwise (cosine hinge, margin 0.1) or pointwise
(MLP + softmax) objective are `qa_models.matching`. The paper's training (RMSProp with momentum, batch 128,
random negatives, dropout on the embeddings) is `PAPER_RECIPE`.

The baselines of Tables 2-4 are the same network with one part changed: global self-attention (the
Transformer block of section 2.1, last layer norm kept, no gate), group self-attention without offsets or
gate, local (sliding-window) self-attention with and without the gate, and QA-LSTM (a shared BiLSTM encoder,
with max-pooling or attention composition).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from qa_models.attention import GroupMultiHeadAttention, MultiHeadAttention, sinusoidal_positions
from qa_models.encoders import word_embedding_table
from qa_models.matching import (
    BiRNN,
    Composition,
    PointwiseHead,
    masked_mean,
    pairwise_hinge,
    similarity,
    with_negatives,
)
from qa_models.recipes import TrainingRecipe

ATTENTIONS = ("group", "global", "local")


@dataclass
class GGSAConfig:
    vocab_size: int = 30_000
    dim: int = 300  # D: the word embeddings, and the self-attention width ("consistent with" them)
    project: bool = False  # yahooQA: fixed pretrained embeddings read through a learned projection
    freeze_embeddings: bool = False
    encoder: str = "ggsa"  # "ggsa" (self-attention blocks) or "lstm" (QA-LSTM)
    shared_encoder: bool = True  # False: the answer has encoder blocks of its own (Figure 7's two encoders)
    attention: str = "group"  # group | global | local
    heads: int = 6
    group: int = 10  # l, the group size (and the local window)
    offset: int | None = None  # the offset of the second half of the heads; None: l // 2 (the paper: 0 and 5)
    gate: bool = True  # the global information gate
    interaction: bool = False  # iGGSA's question-answer interaction residual
    layers: int = 1
    ffn_dim: int = 1200  # "the same as [26]": four times the width
    final_norm: bool = False  # the Transformer block's last LayerNorm, which GGSA removes
    sdpa: bool = False  # global/local attention through torch's fused scaled_dot_product_attention
    lstm_hidden: int = 141  # QA-LSTM per direction (141 for insuranceQA, 256 for yahooQA)
    composition: str = "max"  # max | attention | multihop
    hops: int = 2  # multihop sequential attention
    objective: str = "pairwise"  # pairwise (insuranceQA) | pointwise (yahooQA)
    similarity: str = "cosine"
    margin: float = 0.1
    mlp_hidden: int = 256  # the pointwise head's two-layer MLP
    embed_dropout: float = 0.3  # keep probability 0.7
    dropout: float = 0.0  # inside the blocks; the paper regularises the embeddings only
    max_len: int = 200  # tokens per question and per answer (insuranceQA 200, yahooQA 50)
    pad_id: int = 0

    @classmethod
    def tiny(cls) -> GGSAConfig:
        return cls(
            vocab_size=64,
            dim=12,
            heads=2,
            group=4,
            ffn_dim=24,
            lstm_hidden=6,
            mlp_hidden=8,
            embed_dropout=0.0,
            max_len=32,
        )

    def offsets(self) -> list[int]:
        offset = self.group // 2 if self.offset is None else self.offset
        return [0] * (self.heads - self.heads // 2) + [offset] * (self.heads // 2)


PAPER_RECIPE = TrainingRecipe(
    optimizer="rmsprop",
    lr=1e-4,
    momentum=0.9,
    schedule="constant",
    batch_size=128,
    epochs=5,
    negatives="random",
    model_options={"embed_dropout": 0.3},
    source='Xu et al., section 4.2: "All models are optimized using RMSProp with momentum. Initial learning rate '
    "is tuned among {1e-4, 5e-5, 2e-5, 1e-5}. Dropout is the main regularization way, which is performed on the "
    "word embeddings with keep probability being 0.7 ... The training epochs are chosen to achieve the best "
    'results on the validation set." insuranceQA: "Batch size is fixed to 128" (yahooQA: 256). Section 3.3: '
    '"a_i^- is a randomly selected answer irrelevant to q_i"',
    ours="momentum 0.9 and RMSProp's decay 0.99 (the paper gives neither value); lr 1e-4, the top of the paper's "
    "grid; up to 5 epochs, the best dev checkpoint kept (the paper picks the epoch on validation); no clip",
    deviations="300-d vectors pre-trained on the data set (insuranceQA) or GloVe (yahooQA): here fastText trained on "
    "the data set itself (jobs/word_vectors.py), fine-tuned as the insuranceQA setting",
)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class GGSABlock(nn.Module):
    """Eq. 1-4 (and, given the question vector, iGGSA's eq. 5-7); the other attentions for the baselines."""

    def __init__(self, config: GGSAConfig, interaction: bool = False):
        super().__init__()
        dim = config.dim
        if config.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {config.attention!r}")
        self.attention: nn.Module
        if config.attention == "group":
            self.attention = GroupMultiHeadAttention(dim, config.heads, config.group, config.offsets(), config.dropout)
        else:
            window = config.group if config.attention == "local" else None
            self.attention = MultiHeadAttention(dim, config.heads, window, config.dropout, config.sdpa)
        self.gate = nn.Linear(dim, dim) if config.gate else None  # W, b
        self.norm = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, config.ffn_dim, config.dropout)
        self.final_norm = nn.LayerNorm(dim) if config.final_norm else None
        if interaction:
            self.interaction = FeedForward(dim, config.ffn_dim, config.dropout)
            self.interaction_norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, question: torch.Tensor | None = None) -> torch.Tensor:
        # x: (B, L, D), mask: (B, L), question: (B, D) c^q for iGGSA's answer side
        attended = x
        if self.gate is not None:
            x_bar = masked_mean(x, mask)  # (B, D), eq. 1
            attended = x * torch.sigmoid(self.gate(x * x_bar[:, None, :]))  # X * G: (B, L, D)
        y = self.norm(x + self.dropout(self.attention(attended, mask)))  # eq. 2
        if question is not None:
            y = self.interaction_norm(y + self.dropout(self.interaction(y * question[:, None, :])))  # eq. 6: Y~^a
        h = y + self.dropout(self.ffn(y))  # eq. 3-4 (eq. 7 on the answer side)
        if self.final_norm is not None:
            h = self.final_norm(h)
        return h * mask[..., None].to(h.dtype)  # (B, L, D)


class GGSA(nn.Module):
    config_class = GGSAConfig
    recipe = PAPER_RECIPE
    inputs = "separate"  # question and answer apart; pairwise training adds a negative answer per row

    def __init__(self, config: GGSAConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.objective = config.objective
        if config.objective not in ("pairwise", "pointwise"):
            raise ValueError(f"objective must be pairwise or pointwise, got {config.objective!r}")
        self.embed = word_embedding_table(
            config.vocab_size, config.dim, config.pad_id, embeddings, config.freeze_embeddings
        )
        self.embed_dropout = nn.Dropout(config.embed_dropout)
        self.projection = nn.Linear(config.dim, config.dim) if config.project else None
        if config.encoder == "lstm":
            self.lstm = BiRNN(config.dim, config.lstm_hidden, "lstm")
            # a shared encoder is not registered twice: old checkpoints' keys stay as they were
            self.answer_lstm = None if config.shared_encoder else BiRNN(config.dim, config.lstm_hidden, "lstm")
            width = self.lstm.dim
        elif config.encoder == "ggsa":

            def blocks(interaction: bool) -> nn.ModuleList:
                return nn.ModuleList(
                    GGSABlock(config, interaction=interaction and i == config.layers - 1) for i in range(config.layers)
                )

            # shared: one encoder, its last block iGGSA's on the answer side; apart: the question's has none
            self.blocks = blocks(config.interaction and config.shared_encoder)
            self.answer_blocks = None if config.shared_encoder else blocks(config.interaction)
            width = config.dim
        else:
            raise ValueError(f"encoder must be ggsa or lstm, got {config.encoder!r}")
        self.composition = Composition(config.composition, width, config.hops)
        if config.objective == "pointwise":
            pairs = config.hops + 1 if config.composition == "multihop" else 1
            self.head = PointwiseHead(2 * width * pairs, config.mlp_hidden, layers=2)

    def encode(
        self, ids: torch.Tensor, mask: torch.Tensor, question: torch.Tensor | None = None, answer: bool = False
    ) -> torch.Tensor:
        """Token states (B, L, width), by the answer's encoder when `answer`; `question` (B, D) turns on iGGSA's
        interaction in the last block."""
        x = self.embed_dropout(self.embed(ids))  # (B, L, D): dropout before the positions (section 4.2)
        if self.projection is not None:
            x = self.projection(x)
        if self.config.encoder == "lstm":
            return (self.answer_lstm if answer and self.answer_lstm is not None else self.lstm)(x, mask)
        x = x + sinusoidal_positions(ids.size(1), self.config.dim, ids.device)
        blocks = self.answer_blocks if answer and self.answer_blocks is not None else self.blocks
        for i, block in enumerate(blocks):
            x = block(x, mask, question if i == len(blocks) - 1 else None)
        return x

    def match(self, question_ids, question_mask, answer_ids, answer_mask) -> torch.Tensor:
        """Similarities (B,) for the pairwise objective, logits (B, 2) for the pointwise one."""
        q_mask, a_mask = question_mask.bool(), answer_mask.bool()
        h_q = self.encode(question_ids, q_mask)  # (B, Lq, w)
        c_q = masked_mean(h_q, q_mask) if self.config.interaction else None  # eq. 5
        h_a = self.encode(answer_ids, a_mask, c_q, answer=True)  # (B, La, w)
        pairs = self.composition(h_q, q_mask, h_a, a_mask)
        if self.objective == "pointwise":
            return self.head(pairs)
        scores = [similarity(v_q, v_a, self.config.similarity) for v_q, v_a in pairs]
        return functools.reduce(operator.add, scores)  # multihop: the sum of the hops' similarities

    def forward(self, question_ids, question_mask, answer_ids, answer_mask, negative_ids=None, negative_mask=None):
        """`match`; with a negative answer per row (pairwise training), the pair (sim(q, a+), sim(q, a-))."""
        if negative_ids is None:
            return self.match(question_ids, question_mask, answer_ids, answer_mask)
        return self.match(
            *with_negatives(question_ids, question_mask, answer_ids, answer_mask, negative_ids, negative_mask)
        ).chunk(2)

    def loss(self, output, labels: torch.Tensor) -> torch.Tensor:
        """Pointwise: cross-entropy on the labels. Pairwise: the hinge over (positive, negative) similarities,
        `labels` then weighting the rows (`qa_models.batching.triplet_batch`)."""
        if self.objective == "pointwise":
            return F.cross_entropy(output, labels.long())
        positive, negative = output
        return pairwise_hinge(positive, negative, labels.to(positive.dtype), self.config.margin)

    def score(self, output: torch.Tensor) -> torch.Tensor:
        """The ranking score: the similarity, or the probability of the positive class."""
        return output.softmax(-1)[:, 1] if self.objective == "pointwise" else output


# ------------------------------------------------------------------------------------ variants and baselines
@dataclass
class IGGSAConfig(GGSAConfig):
    interaction: bool = True


@dataclass
class GlobalSAConfig(GGSAConfig):
    attention: str = "global"
    gate: bool = False
    final_norm: bool = True


@dataclass
class GroupSAConfig(GGSAConfig):
    offset: int | None = 0
    gate: bool = False


@dataclass
class LocalSAConfig(GGSAConfig):
    attention: str = "local"
    gate: bool = False


@dataclass
class LocalSAGateConfig(GGSAConfig):
    attention: str = "local"


@dataclass
class QALSTMConfig(GGSAConfig):
    encoder: str = "lstm"


@dataclass
class QALSTMAttentionConfig(GGSAConfig):
    encoder: str = "lstm"
    composition: str = "attention"


class IGGSA(GGSA):
    config_class = IGGSAConfig


class GlobalSelfAttention(GGSA):
    config_class = GlobalSAConfig


class GroupSelfAttention(GGSA):
    config_class = GroupSAConfig


class LocalSelfAttention(GGSA):
    config_class = LocalSAConfig


class LocalSelfAttentionGate(GGSA):
    config_class = LocalSAGateConfig


class QALSTM(GGSA):
    config_class = QALSTMConfig


class QALSTMAttention(GGSA):
    config_class = QALSTMAttentionConfig

"""GSAMN: the Gated Self-Attention Memory Network for answer selection.

Lai, Tran, Bui, Kim. "A Gated Self-Attention Memory Network for Answer Selection", EMNLP 2019.

The question and the candidate answer are one sequence X^0 (question, separator, answer), the memory. A
learnable controller c^0 reads it over T hops. At each hop the gated self-attention f(c, X) (eq. 3) gives
every memory cell a gate that is a softmax-weighted vote of all cells and the controller:

    v_j = W x_j + b,  v_c = W c + b,  s_i^j = x_i . v_j,  s_i^c = x_i . v_c
    (alpha_i^1..n, alpha_i^c) = softmax(s_i^1..n, s_i^c)
    g_i = sigmoid(sum_j alpha_i^j x_j + alpha_i^c c)                                   (3)

then the memory and the controller are updated

    x_i^{k+1} = g_i * x_i^k                                                            (4)
    c^{k+1}   = f_c(c^k, X^k) * c^k + mean_i x_i^{k+1}                                 (5)

where f_c is the same gate computed for the controller in the place of x_i. The match probability is
P(A | Q) = sigmoid(W_c c^T + b_c) (6). The paper uses T = 2 hops and initialises the memory from BERT-base
token states; here memory comes from word embeddings or any local transformer (`qa_models/encoders.py`).
Each hop has its own W, b (the paper does not say whether hops share them). Padding is masked out of every
softmax and of the mean, so a sequence scores the same whatever padding follows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from qa_models.encoders import PretrainedTransformer, WordEmbeddings
from qa_models.matching import masked_mean
from qa_models.recipes import TrainingRecipe


@dataclass
class GSAMNConfig:
    vocab_size: int = 30_000  # ignored with a pretrained encoder
    dim: int = 300  # memory width; a pretrained encoder's hidden size replaces it
    hops: int = 2  # the paper's best
    dropout: float = 0.1
    max_len: int = 256  # question + separator + answer tokens
    encoder_path: str | None = None  # a local transformer directory; None: trainable word embeddings
    pad_id: int = 0

    @classmethod
    def tiny(cls) -> GSAMNConfig:
        return cls(vocab_size=64, dim=16, hops=2, dropout=0.0, max_len=32)


PAPER_RECIPE = TrainingRecipe(
    optimizer="adamw",
    lr=1e-3,
    encoder_lr=5e-5,
    betas=(0.9, 0.999),
    weight_decay=0.01,
    schedule="warmup_linear",
    warmup=0.1,
    batch_size=32,
    grad_clip=1.0,
    epochs=3,
    source='Lai et al. 2019, section 4: "We use the Adam optimizer with a learning rate of 5e-5, beta1 = 0.9, '
    "beta2 = 0.999, L2 weight decay of 0.01, learning rate warmup over the first 10 percent of the total "
    "number of training steps, and linear decay of the learning rate.\" (BERT's AdamW: decoupled decay)",
    ours="batch 32, 3 epochs and a gradient-norm clip of 1.0, BERT's fine-tuning defaults (the paper gives none); "
    "lr 1e-3 where memory starts from word embeddings instead of BERT",
    deviations="BERT-base memory: MiniLM-L6 (--encoder-path minilm, 22M parameters) or MPNet-base (--encoder-path "
    "mpnet-base, 110M) stands in",
)


class GatedSelfAttention(nn.Module):
    """Eq. 3 for every memory cell and for the controller, with one shared affine map W, b."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: (B, n, d) memory, c: (B, d) controller, mask: (B, n) True on real tokens
        v = self.proj(x)  # (B, n, d)
        v_c = self.proj(c)  # (B, d)
        blocked = ~mask[:, None, :]  # (B, 1, n)
        # Gates of the memory cells: x_i votes over all x_j and c.
        s = torch.bmm(x, v.transpose(1, 2)).masked_fill(blocked, float("-inf"))  # (B, n, n): s[i, j] = x_i . v_j
        s_c = torch.einsum("bid,bd->bi", x, v_c)[..., None]  # (B, n, 1): x_i . v_c
        alpha = torch.softmax(torch.cat([s, s_c], dim=-1), dim=-1)  # (B, n, n + 1)
        gates = torch.sigmoid(torch.bmm(alpha[..., :-1], x) + alpha[..., -1:] * c[:, None, :])  # (B, n, d)
        # Gate of the controller: c in the place of x_i.
        t = torch.einsum("bd,bjd->bj", c, v).masked_fill(~mask, float("-inf"))  # (B, n): c . v_j
        t_c = (c * v_c).sum(-1, keepdim=True)  # (B, 1)
        beta = torch.softmax(torch.cat([t, t_c], dim=-1), dim=-1)  # (B, n + 1)
        gate_c = torch.sigmoid(torch.einsum("bj,bjd->bd", beta[:, :-1], x) + beta[:, -1:] * c)  # (B, d)
        return gates, gate_c


class GSAMN(nn.Module):
    config_class = GSAMNConfig
    recipe = PAPER_RECIPE
    inputs = "joint"  # one `question <sep> answer` sequence (qa_models.batching.pair_batch)

    def __init__(self, config: GSAMNConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.encoder = _memory_encoder(config, embeddings)
        dim = self.encoder.dim
        self.controller = nn.Parameter(torch.randn(dim) * dim**-0.5)  # c^0, learnable
        self.hops = nn.ModuleList(GatedSelfAttention(dim) for _ in range(config.hops))
        self.dropout = nn.Dropout(config.dropout)
        self.out = nn.Linear(dim, 1)  # W_c, b_c of eq. 6

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Match logits (B,) for (B, L) token ids of `question <sep> answer`; sigmoid gives P(A | Q)."""
        mask = attention_mask.bool()  # (B, L)
        x = self.encoder(input_ids, mask)  # (B, L, d)
        c = self.controller.expand(x.size(0), -1)  # (B, d)
        keep = mask[..., None].to(x.dtype)  # (B, L, 1)
        lengths = keep.sum(1).clamp_min(1.0)  # (B, 1)
        for hop in self.hops:
            gates, gate_c = hop(x, c, mask)
            x = gates * x  # eq. 4
            c = gate_c * c + (x * keep).sum(1) / lengths  # eq. 5
        return self.out(self.dropout(c)).squeeze(-1)  # eq. 6, before the sigmoid

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy: answer selection as classification of each pair (section 2.3)."""
        return F.binary_cross_entropy_with_logits(logits, labels.float())

    @staticmethod
    def score(logits: torch.Tensor) -> torch.Tensor:
        """The ranking score (the sigmoid is monotonic, so the logit ranks the same)."""
        return logits


# ------------------------------------------------------------------------------- the ablations of Table 2
@dataclass
class TransformersOnTopConfig(GSAMNConfig):
    layers: int = 2  # "two Transformer layers on top of BERT instead of our GSAMN architecture"
    heads: int = 12

    @classmethod
    def tiny(cls) -> TransformersOnTopConfig:
        return cls(vocab_size=64, dim=16, dropout=0.0, max_len=32, layers=2, heads=4)


class TransformersOnTop(nn.Module):
    """[BERT + Transformers]: the same memory initialisation, then standard Transformer encoder layers
    (post-LN, GELU, 4x feed-forward) in place of GSAMN's hops; the first token's state ([CLS]) with a
    transformer, the mean of the real tokens with word embeddings, through a linear layer and a sigmoid."""

    config_class = TransformersOnTopConfig
    recipe = PAPER_RECIPE  # the paper's own ablation, trained alike
    inputs = "joint"
    loss, score = staticmethod(GSAMN.loss), staticmethod(GSAMN.score)

    def __init__(self, config: TransformersOnTopConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.encoder = _memory_encoder(config, embeddings)
        dim = self.encoder.dim
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, config.heads, 4 * dim, config.dropout, activation="gelu", batch_first=True)
            for _ in range(config.layers)
        )
        self.dropout = nn.Dropout(config.dropout)
        self.out = nn.Linear(dim, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.bool()
        x = self.encoder(input_ids, mask)  # (B, L, d)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=~mask)
        return self.out(self.dropout(_pool(x, mask, self.config.encoder_path))).squeeze(-1)  # (B,)


@dataclass
class EncoderOnlyConfig(TransformersOnTopConfig):
    layers: int = 0

    @classmethod
    def tiny(cls) -> EncoderOnlyConfig:
        return cls(vocab_size=64, dim=16, dropout=0.0, max_len=32, layers=0, heads=4)


class EncoderOnly(TransformersOnTop):
    """[BERT]: the fine-tuned encoder alone, its pooled state through a linear layer and a sigmoid."""

    config_class = EncoderOnlyConfig


def _memory_encoder(
    config: GSAMNConfig, embeddings: torch.Tensor | None = None
) -> PretrainedTransformer | WordEmbeddings:
    if config.encoder_path:
        if embeddings is not None:
            raise ValueError("word vectors and a pretrained transformer (encoder_path) exclude each other")
        return PretrainedTransformer(config.encoder_path)
    return WordEmbeddings(config.vocab_size, config.dim, config.pad_id, config.dropout, embeddings)


def _pool(x: torch.Tensor, mask: torch.Tensor, transformer: str | None) -> torch.Tensor:
    return x[:, 0] if transformer else masked_mean(x, mask)  # [CLS], or the mean of the real tokens: (B, d)

"""What sits on top of a siamese answer-selection encoder: composition of token states into vectors, similarity,
and the pairwise and pointwise objectives. Shared by GGSA/iGGSA, QA-LSTM and IARNN.

Composition modules (Xu, Ji, Huang, Deng, Li, "Gated Group Self-Attention for Answer Selection", 2019, section 3.3):
- max-pooling over real tokens (QA-LSTM, Tan et al. 2016);
- attention: the answer's states weighted by their match with the question vector,
  m(t) = tanh(W_a h_a(t) + W_q o_q), s(t) = softmax_t(w^T m(t)) (Tan et al.'s eq. 9-11), and summed,
  o_a = sum_t s(t) h_a(t), as the MLP attention of the multihop paper; Tan et al. max-pool the re-weighted
  states instead, which leaves vectors of scale 1/L that a pointwise MLP then has to undo;
- multihop sequential attention (Tran & Niederee 2018): question vectors o_q^k over K hops, attention on the
  question guided by a memory m^k = m^{k-1} + o_q^k (m^0 = o_q^0 = the question's mean), each hop's question
  vector attending over the answer through a BiLSTM over h_a(t) * o_q^k ("sequential" attention: a word's
  weight depends on its neighbours); the match is the sum of the K + 1 hops' similarities.

Pairwise objective: max(0, margin - sim(q, a+) + sim(q, a-)) with cosine (margin 0.1 in GGSA) or GESD (Feng
et al. 2015, the IARNN paper's option); the negative a- of each positive comes from `batching.triplet_batch`.
Pointwise objective: an MLP over [v_q, v_a] and a 2-class softmax, cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

COMPOSITIONS = ("max", "attention", "multihop")
SIMILARITIES = ("cosine", "gesd")


def masked_max(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # h: (B, L, d), mask: (B, L) -> (B, d); an all-padding row gives zeros
    filled = h.masked_fill(~mask[..., None], float("-inf")).amax(1)
    return torch.where(mask.any(1, keepdim=True), filled, torch.zeros_like(filled))


def masked_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    keep = mask[..., None].to(h.dtype)  # (B, L, 1)
    return (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)  # (B, d)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # scores, mask: (B, L) -> weights over real tokens (B, L)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)


class BiRNN(nn.Module):
    """A bidirectional LSTM or GRU over padded sequences, packed so that padding never reaches a real step."""

    def __init__(self, input_dim: int, hidden: int, cell: str = "lstm"):
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = rnn(input_dim, hidden, batch_first=True, bidirectional=True)
        self.dim = 2 * hidden

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, L, n), mask: (B, L) -> (B, L, 2h), zeros at padding
        lengths = mask.sum(1).clamp_min(1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return out * mask[..., None].to(out.dtype)


class AttentivePooling(nn.Module):
    """The answer's states weighted by their match with the question vector (Tan et al. 2016, eq. 9-11)."""

    def __init__(self, dim: int):
        super().__init__()
        self.answer = nn.Linear(dim, dim, bias=False)  # W_am
        self.question = nn.Linear(dim, dim, bias=False)  # W_qm
        self.score = nn.Linear(dim, 1, bias=False)  # w_ms

    def forward(self, h_a: torch.Tensor, a_mask: torch.Tensor, o_q: torch.Tensor) -> torch.Tensor:
        m = torch.tanh(self.answer(h_a) + self.question(o_q)[:, None, :])  # (B, La, d)
        weights = masked_softmax(self.score(m).squeeze(-1), a_mask)  # (B, La)
        return torch.einsum("bl,bld->bd", weights, h_a)  # (B, d)


class MultihopSequentialAttention(nn.Module):
    """K hops of memory-guided attention over the question, each hop's vector attending over the answer through
    a BiLSTM (sequential attention); returns the K + 1 (question, answer) vector pairs, hop 0 the means."""

    def __init__(self, dim: int, hops: int = 2):
        super().__init__()
        self.hops = hops
        self.states = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(hops))  # W_k on h_q(i)
        self.memory = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(hops))  # W_m,k on m^{k-1}
        self.score = nn.ModuleList(nn.Linear(dim, 1, bias=False) for _ in range(hops))
        self.sequential = BiRNN(dim, max(1, dim // 2), "lstm")

    def _attend_answer(self, h_a: torch.Tensor, a_mask: torch.Tensor, o_q: torch.Tensor) -> torch.Tensor:
        gamma = self.sequential(h_a * o_q[:, None, :], a_mask)  # (B, La, 2 * (d // 2))
        weights = masked_softmax(gamma.sum(-1), a_mask)  # (B, La)
        return torch.einsum("bl,bld->bd", weights, h_a)  # (B, d)

    def forward(self, h_q, q_mask, h_a, a_mask) -> list[tuple[torch.Tensor, torch.Tensor]]:
        o_q = masked_mean(h_q, q_mask)  # (B, d): hop 0
        pairs = [(o_q, self._attend_answer(h_a, a_mask, o_q))]
        memory = o_q
        for states, mem, score in zip(self.states, self.memory, self.score):
            m = torch.tanh(states(h_q)) * torch.tanh(mem(memory))[:, None, :]  # (B, Lq, d)
            weights = masked_softmax(score(m).squeeze(-1), q_mask)  # (B, Lq)
            o_q = torch.einsum("bl,bld->bd", weights, h_q)  # (B, d)
            memory = memory + o_q
            pairs.append((o_q, self._attend_answer(h_a, a_mask, o_q)))
        return pairs


class Composition(nn.Module):
    """Token states of question and answer to (v_q, v_a) vector pairs: one pair, or K + 1 for multihop."""

    def __init__(self, kind: str, dim: int, hops: int = 2):
        super().__init__()
        if kind not in COMPOSITIONS:
            raise ValueError(f"composition must be one of {COMPOSITIONS}, got {kind!r}")
        self.kind = kind
        if kind == "attention":
            self.attention = AttentivePooling(dim)
        elif kind == "multihop":
            self.multihop = MultihopSequentialAttention(dim, hops)

    def forward(self, h_q, q_mask, h_a, a_mask) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.kind == "multihop":
            return self.multihop(h_q, q_mask, h_a, a_mask)
        o_q = masked_max(h_q, q_mask)  # (B, d)
        if self.kind == "attention":
            return [(o_q, self.attention(h_a, a_mask, o_q))]
        return [(o_q, masked_max(h_a, a_mask))]


def similarity(q: torch.Tensor, a: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """(B, d), (B, d) -> (B,). GESD = 1 / (1 + ||q - a||) * 1 / (1 + exp(-(q . a + 1))) (gamma = c = 1)."""
    if kind == "cosine":
        return F.cosine_similarity(q, a, dim=-1, eps=1e-8)
    if kind == "gesd":
        return 1.0 / (1.0 + (q - a).norm(dim=-1)) * torch.sigmoid((q * a).sum(-1) + 1.0)
    raise ValueError(f"similarity must be one of {SIMILARITIES}, got {kind!r}")


def with_negatives(question_ids, question_mask, answer_ids, answer_mask, negative_ids, negative_mask):
    """The question twice, over its answer and then its negative (both padded alike by
    `batching.triplet_batch`): one pass scores both; `.chunk(2)` on the result splits them again."""
    return (
        question_ids.repeat(2, 1),
        question_mask.repeat(2, 1),
        torch.cat([answer_ids, negative_ids]),
        torch.cat([answer_mask, negative_mask]),
    )


def pairwise_hinge(positive: torch.Tensor, negative: torch.Tensor, weight: torch.Tensor, margin: float) -> torch.Tensor:
    """Mean over weighted triplets of max(0, margin - sim(q, a+) + sim(q, a-)); weight 0 marks filler rows
    (a batch with no positive still runs the forward pass, so data-parallel replicas stay in step)."""
    losses = (margin - positive + negative).clamp_min(0.0)  # (B,)
    return (losses * weight).sum() / weight.sum().clamp_min(1.0)


class PointwiseHead(nn.Module):
    """p = softmax(MLP([v_q, v_a])) with a 2-class output; s = p_1 ranks (GGSA section 3.3)."""

    def __init__(self, dim: int, hidden: int, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        blocks, width = [], dim
        for _ in range(layers - 1):
            blocks += [nn.Linear(width, hidden), nn.Tanh(), nn.Dropout(dropout)]
            width = hidden
        self.mlp = nn.Sequential(*blocks, nn.Linear(width, 2))

    def forward(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        return self.mlp(torch.cat([t for pair in pairs for t in pair], dim=-1))  # (B, 2)

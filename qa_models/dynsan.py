"""DynSAN, the Token-level Dynamic Self-Attention Network for multi-passage reading comprehension.

Zhuang & Wang, "Token-level Dynamic Self-Attention Network for Multi-Passage Reading Comprehension", ACL 2019.

The DynSA block (section 2): a local encoder of two depthwise-separable convolutions, each Conv(LN(X)) + X;
then, from its output U,

    G   = sigmoid(F^G(F^U(U)))              (H, L): a gate per head and token                        (1)
    pick per head the K tokens of largest g_h (all of them when the sequence is shorter than K)
    A_h = softmax(Q_h K_h^T / sqrt(D/H)) V_h over the chosen tokens only, Q, K, V projections of U_h  (2)
    Z_h = (F_h + Pad(A_h)) * g_h / max(g_h) zeros at unchosen positions                            (3)
    F_h = F^H_h(F^U(U))                     a non-linear transformation, so the gate always gets a gradient (4)
    Y   = F^Y([Z_1; ...; Z_H]) + U                                                                  (5)

and the regulariser beta * ||G||_1 (6, beta = 1e-5). Attention costs O(K^2) per head, everything else O(L):
memory grows linearly in L. Here F^U is one ReLU layer shared by the gate and F (the paper writes F^U and F^U_h),
and F^H maps it to all heads at once (a stack of the per-head affine maps F^H_h).

The network (section 3): fixed word embeddings and a character CNN (15-d characters, convolution and
max-pooling), a 2-layer highway network, a projection to D with sinusoidal positions (in a passage, counted from its
own first token, so that its encoding does not depend on the passages ranked above it); one DynSA layer, shared,
over the question and each passage apart; trilinear co-attention alignment (context-to-query and
query-to-context as in QANet, [c; a; c*a; c*b]) projected to D and another DynSA layer per passage; the
passages concatenated end to end with a rank embedding added to each passage's tokens and N DynSA blocks over
the whole; then either the extractive head (start and end distributions over all tokens; the loss sums the
probability of every occurrence of the answer, as HAS does) or the multiple-choice head (eq. 7-8: a softmax
over all tokens, a candidate's probability the sum over its mentions).

Table 3's (g) and (h) put Bi-BloSA in place of every DynSA block (Shen, Zhou, Long, Jiang and Zhang, "Bi-Directional
Block Self-Attention for Fast and Memory-Efficient Sequence Modeling", ICLR 2018; the paper used the authors' code,
which this follows: `bi_directional_simple_block_attention`). In each direction (forward: a position reads only
positions before it; backward: after), over the sequence cut into blocks of r = ceil((2L)^(1/3)) tokens:

    H   = ELU(W^m X + b^m)                                            the tokens, mapped
    f(h_i, h_j) = 5 tanh((W^1 h_j + W^2 h_i + b) / 5)                  a score per feature (multi-dimensional)
    S_i = sum_j softmax_j(f(h_i, h_j)) * h_j over j of i's block in the direction      intra-block attention
    v_b = sum_i softmax_i(W^s S_i + b^s) * S_i over block b's tokens            each block summarised
    E_b = DiSA(v_1 ... v_M)_b: the same masked attention over the blocks, fused with its input by a gate
    G, N = W^c [H_i; S_i; E_b(i)] + b^c;  out_i = sigmoid(G) * ELU(N) + (1 - sigmoid(G)) * H_i

and the block is Y = F^Y([out^fw; out^bw]) + U, as the DynSA block's eq. 5, with U the input, (h) after the local
encoder's two convolutions, (g) without them. Each direction works in D/2 features (the authors' `hn`), so that
[out^fw; out^bw] is D wide and the block holds about the DynSA block's parameters (149k, 184k with the convolutions
of (h), against 135k at D = 128), as Table 4's sizes imply (DynSAN and Bi-BloSAN 1.9M each). Here a block of padding
only is left out of the attention between blocks (the authors' code lets every block be read, so a row's output
would depend on its batch's padding), and r follows the batch's longest row, as the authors' padded length does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from qa_models.attention import sinusoidal_positions
from qa_models.encoders import word_embedding_table
from qa_models.matching import masked_softmax
from qa_models.recipes import TrainingRecipe


@dataclass
class DynSANConfig:
    vocab_size: int = 30_000
    char_vocab_size: int = 300
    word_dim: int = 300  # fastText, fixed
    char_dim: int = 15
    char_filters: int = 100
    char_kernel: int = 5
    dim: int = 128  # D
    heads: int = 8  # H
    top_k: int = 256  # K
    kernel: int = 7  # the local encoder's convolutions
    cross_blocks: int = 4  # N
    max_passages: int = 100  # rank embeddings (Quasar-T gives 100 passages)
    task: str = "extractive"  # or "multiple_choice"
    max_answer_tokens: int = 30  # the longest span predicted
    dropout: float = 0.1
    gate_l1: float = 1e-5  # beta
    select: bool = True  # False: attention over every token (the reference DynSA is tested against)
    sdpa: bool = False  # eq. 2 through torch's fused scaled_dot_product_attention
    # Table 3's ablations, all on by default: (b) self_attention=False drops eq. 2 (A_h = 0, context from the
    # convolutions only); (c) convolutions=False drops the local encoder; (d) selection="random" picks the K
    # tokens at random instead of by the gate; (e) with gate=False as well, Z_h = F_h + Pad(A_h) ungated; (f) is
    # gate_l1=0; (a) is cross_blocks=0. Random picks are drawn from torch's generator (seeded per batch in training)
    self_attention: bool = True
    convolutions: bool = True
    selection: str = "gate"  # "gate" (the paper) or "random"
    gate: bool = True
    # (g), (h): block="biblosa" puts Bi-BloSA in place of every DynSA block, (g) with convolutions=False
    block: str = "dynsa"
    freeze_embeddings: bool = True
    pad_id: int = 0

    @classmethod
    def tiny(cls) -> DynSANConfig:
        return cls(
            vocab_size=64,
            char_vocab_size=32,
            word_dim=12,
            char_dim=4,
            char_filters=6,
            char_kernel=3,
            dim=16,
            heads=2,
            top_k=4,
            kernel=3,
            cross_blocks=1,
            max_passages=4,
            dropout=0.0,
            freeze_embeddings=False,
        )


PAPER_RECIPE = TrainingRecipe(
    optimizer="adam",
    lr=1e-3,
    betas=(0.9, 0.999),
    schedule="warmup_constant",
    warmup_steps=500,
    batch_size=32,
    ema_decay=0.9999,
    epochs=10,
    model_options={"dropout": 0.1},
    source='Zhuang & Wang 2019, section 4.2: "The mini-batch size is set to 32. For regularization, we adopt '
    "dropout between every two layers and the dropout rate is 0.1. Adam with learning rate 0.001 is used ... "
    "the learning rate increases linearly from 0 to 0.001 in the first 500 steps. ... Exponential moving "
    'average is adopted with a decay rate 0.9999."',
    ours="Adam's betas (0.9, 0.999) and eps 1e-8 (Kingma & Ba's; the paper names none); no gradient clip; 10 epochs "
    "(the paper gives no count); the average's decay ramps as min(0.9999, (1 + n) / (10 + n)) over the first "
    "n steps (TensorFlow's num_updates form), so a run of thousands of steps is not its initial weights",
    deviations="300-d fastText vectors trained on Common Crawl are not available offline: fastText trained on the "
    "data set's own text (jobs/word_vectors.py), fixed as the paper's",
)


class DepthwiseSeparableConv(nn.Module):
    """Conv(LN(X)) + X with a depthwise convolution of width k and a pointwise one (Chollet 2017). The pointwise
    convolution is applied as the matrix product it is, on (B, L, D) (its Conv1d weights, so checkpoints keep their
    names): on the CPU a sixth faster through backward than a 1x1 Conv1d and its transposes."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.depthwise = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim, bias=False)
        self.pointwise = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, L, D); padding is zeroed first so a real token's window sees zeros past the end, however long
        h = (self.norm(x) * mask[..., None].to(x.dtype)).transpose(1, 2)  # (B, D, L)
        mixed = self.depthwise(h).transpose(1, 2)  # (B, L, D)
        return x + torch.relu(F.linear(mixed, self.pointwise.weight[:, :, 0], self.pointwise.bias))


class DynSABlock(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int,
        top_k: int,
        kernel: int,
        dropout: float = 0.0,
        select: bool = True,
        sdpa: bool = False,
        self_attention: bool = True,
        convolutions: bool = True,
        selection: str = "gate",
        gate: bool = True,
    ):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        if selection not in ("gate", "random"):
            raise ValueError(f"selection must be 'gate' or 'random', got {selection!r}")
        self.dim, self.heads, self.top_k, self.select = dim, heads, top_k, select
        self.sdpa = sdpa  # torch's fused scaled_dot_product_attention for eq. 2
        self.selection, self.gated = selection, gate
        self.local = nn.ModuleList(DepthwiseSeparableConv(dim, kernel) for _ in range(2 if convolutions else 0))
        self.hidden = nn.Linear(dim, dim)  # F^U (with a ReLU)
        self.gate = nn.Linear(dim, heads)  # F^G
        self.transform = nn.Linear(dim, dim)  # F^H for all heads
        self.qkv = nn.Linear(dim, 3 * dim) if self_attention else None  # none: no unused parameters under DDP
        self.out = nn.Linear(dim, dim)  # F^Y
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Y (B, L, D) and the gate's L1 norm over real tokens per sequence (B,). x: (B, L, D), mask (B, L)."""
        for conv in self.local:
            x = conv(x, mask)
        u = x  # U: (B, L, D)
        batch, length, _ = u.shape
        d = self.dim // self.heads
        hidden = torch.relu(self.hidden(u))  # (B, L, D)
        gates = torch.sigmoid(self.gate(hidden)).transpose(1, 2) * mask[:, None, :].to(u.dtype)  # G: (B, H, L)
        f = self.transform(hidden).view(batch, length, self.heads, d).transpose(1, 2)  # F_h: (B, H, L, d)
        if self.qkv is None:  # (b): A_h = 0, the context comes from the convolutions alone
            z = f * self._scale(gates)[..., None] if self.gated else f  # (B, H, L, d)
            y = self.out(self.dropout(z.transpose(1, 2).reshape(batch, length, self.dim))) + u
            return y * mask[..., None].to(y.dtype), gates.sum((1, 2))
        qkv = self.qkv(u).view(batch, length, 3, self.heads, d).permute(2, 0, 3, 1, 4)  # (3, B, H, L, d)
        if self.select and self.top_k < length:
            # (d): by a random score instead of the gate, real tokens still before padding
            score = gates if self.selection == "gate" else torch.rand_like(gates) * mask[:, None, :].to(u.dtype)
            chosen = score.masked_fill(~mask[:, None, :], -1.0).topk(self.top_k, dim=-1).indices  # (B, H, K)
            index = chosen[..., None].expand(-1, -1, -1, d)  # (B, H, K, d)
            q, k, v = (t.gather(2, index) for t in qkv)  # each (B, H, K, d): U_h's projections
            keys = mask[:, None, :].expand(-1, self.heads, -1).gather(2, chosen)  # (B, H, K)
        else:  # every token chosen
            q, k, v = qkv
            keys = mask[:, None, :].expand(-1, self.heads, -1)  # (B, H, L)
        if self.sdpa:
            attended = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keys[:, :, None, :], dropout_p=self.dropout.p if self.training else 0.0
            ).nan_to_num(0.0)
        else:
            scores = (q @ k.transpose(-1, -2)) / d**0.5  # (B, H, K, K)
            weights = torch.softmax(scores.masked_fill(~keys[:, :, None, :], float("-inf")), -1).nan_to_num(0.0)
            attended = self.dropout(weights) @ v  # A_h: (B, H, K, d)
        if self.select and self.top_k < length:
            attended = torch.zeros_like(f).scatter(2, index, attended)  # Pad(A_h): (B, H, L, d)
        z = (f + attended) * self._scale(gates)[..., None] if self.gated else f + attended  # eq. 3: (B, H, L, d)
        y = self.out(self.dropout(z.transpose(1, 2).reshape(batch, length, self.dim))) + u  # eq. 5
        return y * mask[..., None].to(y.dtype), gates.sum((1, 2))

    @staticmethod
    def _scale(gates: torch.Tensor) -> torch.Tensor:
        return gates / gates.amax(-1, keepdim=True).clamp_min(1e-9)  # g_h / max(g_h): (B, H, L)


def block_length(length: int) -> int:
    """Bi-BloSA's block length for a sequence of `length` tokens: the smallest r with r^3 >= 2L, the authors'
    ceil((2L)^(1/3)), which minimises the attention's memory (L r within blocks against (L / r)^2 between them)."""
    r = 1
    while r**3 < 2 * length:
        r += 1
    return r


def _directional(length: int, direction: str, device: torch.device) -> torch.Tensor:
    """(L, L) True where position i (row) may read position j (column): j < i forward, j > i backward."""
    i = torch.arange(length, device=device)
    return i[:, None] > i[None, :] if direction == "forward" else i[:, None] < i[None, :]


def _feature_attention(logits: torch.Tensor, allowed: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Multi-dimensional attention: `logits` (..., I, J, D) softmaxed over J feature by feature where `allowed`
    (..., I, J) holds, `values` (..., J, D) so weighted; a position allowed nothing reads zeros. -> (..., I, D)"""
    logits = logits.masked_fill(~allowed[..., None], torch.finfo(logits.dtype).min)
    weights = torch.softmax(logits, -2) * allowed[..., None].to(logits.dtype)  # (..., I, J, D)
    return (weights * values.unsqueeze(-3)).sum(-2)


class DirectionalAttention(nn.Module):
    """DiSA (Shen et al., "DiSAN: Directional Self-Attention Network for RNN/CNN-Free Language Understanding",
    AAAI 2018), as Bi-BloSA applies it between blocks: the masked multi-dimensional attention over positions, then
    a gate fusing each position's mapping with what it read."""

    def __init__(self, dim: int, direction: str, dropout: float = 0.0):
        super().__init__()
        self.direction = direction
        self.map = nn.Linear(dim, dim)
        self.dependent = nn.Linear(dim, dim, bias=False)  # W^1, of the position read
        self.head = nn.Linear(dim, dim, bias=False)  # W^2, of the position reading
        self.bias = nn.Parameter(torch.zeros(dim))
        self.fuse_mapped = nn.Linear(dim, dim)
        self.fuse_read = nn.Linear(dim, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, N, D), mask (B, N)
        h = F.elu(self.map(self.dropout(x)))  # (B, N, D)
        dropped = self.dropout(h)
        pairs = self.dependent(dropped)[:, None, :, :] + self.head(dropped)[:, :, None, :] + self.bias  # (B, N, N, D)
        allowed = _directional(x.size(1), self.direction, x.device) & mask[:, None, :]  # (B, N, N)
        read = _feature_attention(5 * torch.tanh(pairs / 5), allowed, h)  # (B, N, D)
        gate = torch.sigmoid(self.fuse_mapped(h) + self.fuse_read(read))
        return (gate * h + (1 - gate) * read) * mask[..., None].to(h.dtype)


class MaskedBlockSelfAttention(nn.Module):
    """One direction of Bi-BloSA (module docstring): attention within blocks, between their summaries (DiSA), and
    the gated fusion of a token's mapping, its block's reading and the blocks' context."""

    def __init__(self, dim: int, hidden: int, direction: str, dropout: float = 0.0):
        super().__init__()
        self.direction = direction
        self.map = nn.Linear(dim, hidden)  # to the direction's n features
        self.dependent_head = nn.Linear(hidden, 2 * hidden, bias=False)  # W^1 and W^2
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.summary = nn.Linear(hidden, hidden)  # W^s: a block's source-to-token attention, feature by feature
        self.between = DirectionalAttention(hidden, direction, dropout)
        self.combine = nn.Linear(3 * hidden, 2 * hidden)  # W^c: the new context and its gate
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, block: int) -> torch.Tensor:
        # x: (B, L, D), mask (B, L); the sequence in M blocks of `block` (r) tokens, the last padded -> (B, L, n)
        batch, length, dim = x.shape
        blocks = -(-length // block)
        x = F.pad(x, (0, 0, 0, blocks * block - length)).view(batch, blocks, block, dim)  # (B, M, r, D)
        m = F.pad(mask, (0, blocks * block - length)).view(batch, blocks, block)  # (B, M, r)
        h = F.elu(self.map(self.dropout(x)))  # H: (B, M, r, n)
        dependent, head = self.dependent_head(self.dropout(h)).chunk(2, -1)  # each (B, M, r, n)
        pairs = dependent[:, :, None] + head[:, :, :, None] + self.bias  # (B, M, r, r, n)
        allowed = _directional(block, self.direction, x.device) & m[:, :, None, :] & m[:, :, :, None]  # (B, M, r, r)
        within = _feature_attention(5 * torch.tanh(pairs / 5), allowed, h)  # S: (B, M, r, n)
        # each block's source-to-token summary: the same masked feature-wise attention, read by one position
        summary = _feature_attention(self.summary(within)[:, :, None], m[:, :, None, :], within)[
            :, :, 0
        ]  # v: (B, M, n)
        context = self.between(summary, m.any(-1))  # E: (B, M, n), blocks of padding only left out
        fused = torch.cat([h, within, context[:, :, None].expand(-1, -1, block, -1)], -1)  # (B, M, r, 3n)
        new, gate = self.combine(self.dropout(fused)).chunk(2, -1)  # each (B, M, r, n)
        gate = torch.sigmoid(gate)
        out = gate * F.elu(new) + (1 - gate) * h  # (B, M, r, n)
        return out.reshape(batch, blocks * block, -1)[:, :length]


class BiBloSABlock(nn.Module):
    """Table 3 (g) and (h): Bi-BloSA in place of the DynSA block, Y = F^Y([out^fw; out^bw]) + U, U the input after
    the local encoder's convolutions ((h)) or the input itself ((g)). Its gate L1 is zero: Bi-BloSA has no gate to
    regularise, so eq. 6 adds nothing."""

    def __init__(self, dim: int, kernel: int, dropout: float = 0.0, convolutions: bool = False):
        super().__init__()
        self.local = nn.ModuleList(DepthwiseSeparableConv(dim, kernel) for _ in range(2 if convolutions else 0))
        hidden = max(1, dim // 2)  # each direction's features: [fw; bw] is D wide
        self.forward_attention = MaskedBlockSelfAttention(dim, hidden, "forward", dropout)
        self.backward_attention = MaskedBlockSelfAttention(dim, hidden, "backward", dropout)
        self.out = nn.Linear(2 * hidden, dim)  # F^Y
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Y (B, L, D) and zeros (B,) for the gate's L1 norm. x: (B, L, D), mask (B, L)."""
        for conv in self.local:
            x = conv(x, mask)
        u = x  # U: (B, L, D)
        block = block_length(int(mask.sum(1).max()) if mask.any() else 1)  # the batch's longest row
        both = torch.cat([self.forward_attention(u, mask, block), self.backward_attention(u, mask, block)], -1)
        y = self.out(self.dropout(both)) + u  # (B, L, D)
        return y * mask[..., None].to(y.dtype), u.new_zeros(u.size(0))


class CharCNN(nn.Module):
    """Kim (2014): character embeddings, one convolution, max-pooling over each word's characters.

    The convolution is one matrix product over every character's window (with the Conv1d's own weights, so
    checkpoints keep their names), masked in place, and the ReLU comes after the max (they commute: ReLU is
    monotone): the (words, characters, filters) activations are made once, not rectified, transposed and masked in
    copies. On the CPU the Conv1d way took an eighth of a SQuAD training step, mostly in its backward."""

    def __init__(self, chars: int, dim: int, filters: int, kernel: int):
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"the character convolution's width must be odd, got {kernel}")
        self.embed = nn.Embedding(chars, dim, padding_idx=0)
        self.conv = nn.Conv1d(dim, filters, kernel, padding=kernel // 2)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        # char_ids: (B, L, C) -> (B, L, filters)
        batch, length, width = char_ids.shape
        kernel = self.conv.kernel_size[0]
        x = F.pad(self.embed(char_ids.reshape(-1, width)), (0, 0, kernel // 2, kernel // 2))  # (B*L, C + k - 1, c)
        windows = x.unfold(1, kernel, 1).reshape(-1, x.size(2) * kernel)  # (B*L*C, c*k): the weight's (channel, tap)
        h = F.linear(windows, self.conv.weight.flatten(1), self.conv.bias).view(-1, width, self.conv.out_channels)
        # max(), not amax(): its backward scatters to the one maximum instead of comparing every activation with it
        h = h.masked_fill_(char_ids.reshape(-1, width, 1) == 0, float("-inf")).max(1).values  # (B*L, filters)
        return h.clamp_min(0.0).view(batch, length, -1)  # the ReLU; a word of no characters (padding) gives 0


class Highway(nn.Module):
    def __init__(self, dim: int, layers: int = 2):
        super().__init__()
        self.transforms = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.gates = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for transform, gate in zip(self.transforms, self.gates):
            t = torch.sigmoid(gate(x))
            x = t * torch.relu(transform(x)) + (1 - t) * x
        return x


class TrilinearAlignment(nn.Module):
    """S_ij = w^T [c_i; q_j; c_i * q_j]; A = softmax_j(S) Q, B = softmax_j(S) softmax_i(S)^T C (QANet), and
    [c; a; c * a; c * b] projected back to D."""

    def __init__(self, dim: int):
        super().__init__()
        self.w_c, self.w_q, self.w_cq = nn.Linear(dim, 1), nn.Linear(dim, 1, bias=False), nn.Parameter(torch.zeros(dim))
        nn.init.normal_(self.w_cq, std=dim**-0.5)
        self.project = nn.Linear(4 * dim, dim)

    def forward(self, c, c_mask, q, q_mask) -> torch.Tensor:
        # c: (P, Lc, D) passages, q: (P, Lq, D) their question
        s = self.w_c(c) + self.w_q(q).transpose(1, 2) + (c * self.w_cq) @ q.transpose(1, 2)  # (P, Lc, Lq)
        to_query = masked_softmax(s, q_mask[:, None, :].expand_as(s))  # over question words
        to_context = masked_softmax(s.transpose(1, 2), c_mask[:, None, :].expand(-1, s.size(2), -1))  # (P, Lq, Lc)
        a = to_query @ q  # (P, Lc, D)
        b = to_query @ (to_context @ c)  # (P, Lc, D)
        return self.project(torch.cat([c, a, c * a, c * b], -1))


def within_passage(passage: torch.Tensor, mask: torch.Tensor, passages: int) -> torch.Tensor:
    """(B, L) each token's position counted from its own passage's first token (0 on padding). `passage` (B, L) is
    each token's passage number, passages past `passages` counted as the last."""
    batch, length = passage.shape
    position = torch.arange(length, device=passage.device).expand(batch, -1)
    passage = passage.clamp(0, passages - 1).masked_fill(~mask, 0)
    first = torch.full((batch, passages), length, device=passage.device, dtype=torch.long).scatter_reduce(
        1, passage, position.masked_fill(~mask, length), reduce="amin"
    )  # (B, M): each passage's first token
    return (position - first.gather(1, passage)).masked_fill(~mask, 0)  # (B, L)


def split_passages(x: torch.Tensor, passage: torch.Tensor, mask: torch.Tensor, passages: int):
    """(B, L, D) tokens of concatenated passages to (P, Lp, D), one row for each of the P passages that has tokens
    (in order of question, then rank), with their mask, the index that puts them back (`join_passages`) and each
    row's question (P,). `passage` (B, L) is each token's passage number. Only the passages there get a row: a
    batch of one-paragraph questions is B rows, not B * passages of zeros to fill and carry through backward."""
    batch = passage.shape[0]
    within = within_passage(passage, mask, passages)  # (B, L)
    passage = passage.clamp(0, passages - 1).masked_fill(~mask, 0)
    width = int(within.max()) + 1 if mask.any() else 1
    rows = torch.arange(batch, device=x.device)[:, None] * passages + passage  # (B, L): question-major numbering
    present, slot = torch.unique(rows[mask], return_inverse=True)  # the passages with tokens, sorted; (N,) each
    row = torch.zeros_like(rows).masked_scatter(mask, slot)  # (B, L): each token's row in `flat`
    flat = x.new_zeros(present.numel(), width, x.size(-1))
    flat_mask = torch.zeros(present.numel(), width, dtype=torch.bool, device=x.device)
    flat[slot, within[mask]] = x[mask]
    flat_mask[slot, within[mask]] = True
    return flat, flat_mask, (row, within), present // passages


def join_passages(flat: torch.Tensor, where, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, D) the passages' rows of `flat` back in their questions' order, zero on padding."""
    row, within = where
    if flat.size(0) == 0:  # no passage has a token
        return flat.new_zeros(*mask.shape, flat.size(-1))
    return flat[row, within] * mask[..., None].to(flat.dtype)  # (B, L, D)


class DynSAN(nn.Module):
    config_class = DynSANConfig
    recipe = PAPER_RECIPE
    inputs = "passages"

    def __init__(self, config: DynSANConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        if config.task not in ("extractive", "multiple_choice"):
            raise ValueError(f"task must be extractive or multiple_choice, got {config.task!r}")
        self.config = config
        self.embed = word_embedding_table(
            config.vocab_size, config.word_dim, config.pad_id, embeddings, config.freeze_embeddings
        )
        self.chars = CharCNN(config.char_vocab_size, config.char_dim, config.char_filters, config.char_kernel)
        width = config.word_dim + config.char_filters
        self.highway = Highway(width, 2)
        self.project = nn.Linear(width, config.dim)

        if config.block not in ("dynsa", "biblosa"):
            raise ValueError(f"block must be 'dynsa' or 'biblosa', got {config.block!r}")
        if config.block == "biblosa" and (not config.self_attention or config.selection != "gate" or not config.gate):
            raise ValueError(
                "block='biblosa' replaces the DynSA block: self_attention, selection and gate are the DynSA "
                "block's switches (ablations (b), (d), (e)) and do not combine with it"
            )

        def block() -> nn.Module:
            if config.block == "biblosa":
                return BiBloSABlock(config.dim, config.kernel, config.dropout, config.convolutions)
            return DynSABlock(
                config.dim,
                config.heads,
                config.top_k,
                config.kernel,
                config.dropout,
                config.select,
                config.sdpa,
                config.self_attention,
                config.convolutions,
                config.selection,
                config.gate,
            )

        self.encode_block = block()  # question and passages, shared
        self.alignment = TrilinearAlignment(config.dim)
        self.model_block = block()  # each aligned passage
        self.rank = nn.Embedding(config.max_passages, config.dim)
        self.cross = nn.ModuleList(block() for _ in range(config.cross_blocks))
        self.dropout = nn.Dropout(config.dropout)
        self.heads = nn.Linear(config.dim, 2 if config.task == "extractive" else 1)  # F^S (start, end)

    def _embed(self, ids, chars, mask, positions: torch.Tensor | None = None):
        """(B, L, D) inputs with sinusoidal positions: 0, 1, ... along the row, or `positions` (B, L) given (each
        passage's tokens counted from its own start, so a passage reads the same whatever precedes it)."""
        x = torch.cat([self.embed(ids), self.chars(chars)], -1)  # (B, L, word + char)
        x = self.project(self.highway(self.dropout(x)))  # (B, L, D)
        if positions is None:
            table = sinusoidal_positions(ids.size(1), self.config.dim, ids.device)  # (L, D)
        else:
            table = sinusoidal_positions(int(positions.max()) + 1, self.config.dim, ids.device)[positions]  # (B, L, D)
        return (x + table) * mask[..., None].to(x.dtype)

    def forward(
        self, question_ids, question_chars, question_mask, context_ids, context_chars, context_mask, passage
    ) -> dict:
        """Logits over all context tokens: {"start", "end"} (extractive) or {"tokens"} (eq. 7, multiple
        choice), each (B, L), and "gate_l1" (B,). `passage` (B, L) numbers each token's passage in rank order."""
        q_mask, c_mask = question_mask.bool(), context_mask.bool()
        passages = self.config.max_passages
        q, gate_q = self.encode_block(self._embed(question_ids, question_chars, q_mask), q_mask)  # (B, Lq, D)
        c = self._embed(context_ids, context_chars, c_mask, within_passage(passage, c_mask, passages))  # (B, L, D)
        flat, flat_mask, where, owner = split_passages(c, passage, c_mask, passages)  # (P, Lp, D); owner (P,)
        gates = [gate_q]
        h, g = self.encode_block(flat, flat_mask)
        gates.append(torch.zeros_like(gate_q).index_add(0, owner, g))
        h = self.alignment(h, flat_mask, q[owner], q_mask[owner])
        h, g = self.model_block(self.dropout(h), flat_mask)
        gates.append(torch.zeros_like(gate_q).index_add(0, owner, g))
        s = join_passages(h, where, c_mask)  # (B, L, D), concatenated end to end
        s = s + self.rank(passage.clamp(0, passages - 1)) * c_mask[..., None].to(s.dtype)
        for block in self.cross:
            s, g = block(self.dropout(s), c_mask)
            gates.append(g)
        logits = self.heads(s).masked_fill(~c_mask[..., None], float("-inf"))  # (B, L, 2 or 1)
        gate_l1 = sum(gates)
        if self.config.task == "extractive":
            return {"start": logits[..., 0], "end": logits[..., 1], "gate_l1": gate_l1}
        return {"tokens": logits[..., 0], "gate_l1": gate_l1}

    def loss(self, output: dict, targets: dict) -> torch.Tensor:
        """Negative log-likelihood plus beta * ||G||_1. Extractive: targets "starts", "ends" (B, A) token
        positions of every occurrence of the answer, -1 padded; the probability of all of them is summed.
        Multiple choice: "mentions" (B, L) the candidate index of each token (-1: none) and "answer" (B,)."""
        gate = self.config.gate_l1 * output["gate_l1"].mean()
        if self.config.task == "extractive":
            return (
                _occurrence_nll(output["start"], targets["starts"])
                + _occurrence_nll(output["end"], targets["ends"])
                + gate
            )
        log_r = output["tokens"].log_softmax(-1)  # (B, L): eq. 7
        correct = targets["mentions"] == targets["answer"][:, None]  # (B, L): T_c of the right candidate
        found = correct.any(1)  # rows whose right candidate is mentioned within the (truncated) context
        if not found.any():
            return log_r.masked_fill(~torch.isfinite(log_r), 0).sum() * 0.0 + gate
        return -torch.logsumexp(log_r[found].masked_fill(~correct[found], float("-inf")), -1).mean() + gate  # eq. 8

    def candidate_log_probs(self, output: dict, mentions: torch.Tensor, candidates: int) -> torch.Tensor:
        """log P(c | q, P) (B, candidates) (eq. 8): the token distribution summed over each candidate's mentions."""
        r = output["tokens"].softmax(-1)  # (B, L)
        sums = r.new_zeros(r.size(0), candidates + 1).scatter_add(1, (mentions + 1).clamp_min(0), r)[:, 1:]
        return sums.clamp_min(1e-30).log()

    def best_spans(self, output: dict) -> torch.Tensor:
        """(B, 2) start and end of the most probable span with end >= start and at most max_answer_tokens."""
        start, end = output["start"].log_softmax(-1), output["end"].log_softmax(-1)  # (B, L)
        width = self.config.max_answer_tokens
        ends = F.pad(end, (0, width - 1), value=float("-inf")).unfold(1, width, 1)  # (B, L, W): end[s + w]
        best = (start[:, :, None] + ends).flatten(1).argmax(-1)  # linear in L, not (L, L)
        return torch.stack([best // width, best // width + best % width], -1)


def _occurrence_nll(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Mean over the rows that have an occurrence (a truncated context may have lost them all)."""
    log_p = logits.log_softmax(-1)  # (B, L)
    picked = log_p.gather(1, positions.clamp_min(0)).masked_fill(positions < 0, float("-inf"))  # (B, A)
    found = (positions >= 0).any(1)  # (B,)
    if not found.any():
        return logits.sum() * 0.0  # no answer in reach: no signal, but the graph stays whole for DDP
    return -torch.logsumexp(picked[found], -1).mean()

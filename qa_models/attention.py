"""Multi-head self-attention over groups: GGSA's GroupMultiHeadAttention with its per-head offsets.

Xu, Ji, Huang, Deng, Li, "Gated Group Self-Attention for Answer Selection", arXiv preprint, 2019,
sections 3.1.1-3.1.2: Q, K, V are split into n heads, each head's sequence into groups of l consecutive words,
and attention runs inside each group only, O(L l D) work instead of O(L^2 D). A head with offset o shifts its
group boundaries by o words (the paper: 6 heads, l = 10, offset 0 for three heads and 5 for the others), so
that a word at a boundary in one head sees its neighbours in another. Position p falls in group
floor((p + l - o) / l) of its head; groups are counted from the sequence start, so padding at the end never
moves a real word's group, and padded keys are masked.

Shared by GGSA and iGGSA (and the "group self-attention" ablation of their Table 4). `MultiHeadAttention` is
the global self-attention baseline of the same tables, and with a window the local (sliding-window)
self-attention of their Table 3; `sinusoidal_positions` is the positional encoding of their section 2.2.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def group_ids(length: int, group: int, offset: int, device=None) -> torch.Tensor:
    """The group of each position (L,) for one head."""
    return torch.div(
        torch.arange(length, device=device) + (group - offset % group) % group, group, rounding_mode="floor"
    )


def sinusoidal_positions(length: int, dim: int, device=None) -> torch.Tensor:
    """(L, D): sin(i / 10000^(2k/D)) in dimension 2k and cos(i / 10000^(2k/D)) in 2k + 1 (Vaswani et al.; the
    GGSA paper's formula writes 2j/D with j the dimension itself, the usual misprint of this one)."""
    position = torch.arange(length, dtype=torch.float32, device=device)[:, None]  # (L, 1)
    rates = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(position * rates)
    table[:, 1::2] = torch.cos(position * rates[: dim // 2])
    return table


class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head self-attention over all real tokens (global self-attention), or with
    `window` over the `window` words centred on each word (local self-attention: O(L^2) work, as the paper's
    Table 3 timings show, since the band is a mask over the full score matrix)."""

    def __init__(self, dim: int, heads: int, window: int | None = None, dropout: float = 0.0, sdpa: bool = False):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.dim, self.heads, self.window, self.dropout = dim, heads, window, dropout
        self.sdpa = sdpa  # torch's fused scaled_dot_product_attention instead of the textbook softmax(QK^T)V
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def allowed(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, 1, L, L) True where query i may attend to key j."""
        allowed = mask[:, None, None, :]  # (B, 1, 1, L)
        if self.window:
            i = torch.arange(mask.size(1), device=mask.device)
            offset = i[None, :] - i[:, None]  # (L, L): j - i
            band = (offset >= -((self.window - 1) // 2)) & (offset <= self.window // 2)
            allowed = allowed & band
        return allowed

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, L, D), mask: (B, L) True on real tokens
        batch, length, _ = x.shape
        d = self.dim // self.heads
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, d).permute(2, 0, 3, 1, 4)  # each (B, h, L, d)
        if self.sdpa:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.allowed(mask), dropout_p=self.dropout if self.training else 0.0
            ).nan_to_num(0.0)
            return self.out(out.transpose(1, 2).reshape(batch, length, self.dim))  # (B, L, D)
        scores = (q @ k.transpose(-1, -2) / d**0.5).masked_fill(~self.allowed(mask), float("-inf"))  # (B,h,L,L)
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        if self.training and self.dropout:
            weights = F.dropout(weights, self.dropout)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, length, self.dim))  # (B, L, D)


class GroupMultiHeadAttention(nn.Module):
    def __init__(self, dim: int, heads: int, group: int, offsets: list[int] | None = None, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.dim, self.heads, self.group = dim, heads, group
        self.offsets = list(offsets) if offsets is not None else [0] * heads
        if len(self.offsets) != heads:
            raise ValueError(f"{len(self.offsets)} offsets for {heads} heads")
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def _grouped(self, x: torch.Tensor, shift: int, width: int) -> torch.Tensor:
        # x: (B, h, L, d) -> (B, h, m, l, d): left-pad `shift` positions so groups start at multiples of l
        x = F.pad(x, (0, 0, shift, width - shift - x.size(2)))
        return x.view(x.size(0), x.size(1), width // self.group, self.group, x.size(-1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, L, D), mask: (B, L) True on real tokens
        batch, length, _ = x.shape
        d = self.dim // self.heads
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, d).permute(2, 0, 3, 1, 4)  # each (B, h, L, d)
        out = torch.zeros_like(q)  # (B, h, L, d)
        for offset in sorted(set(self.offsets)):
            heads = [i for i, o in enumerate(self.offsets) if o == offset]
            shift = (self.group - offset % self.group) % self.group
            width = -(-(length + shift) // self.group) * self.group  # padded length, a multiple of l
            qg, kg, vg = (self._grouped(t[:, heads], shift, width) for t in (q, k, v))  # (B, h', m, l, d)
            keys = self._grouped(mask[:, None, :, None].to(x.dtype), shift, width)[..., 0].bool()  # (B,1,m,l)
            scores = qg @ kg.transpose(-1, -2) / d**0.5  # (B, h', m, l, l)
            scores = scores.masked_fill(~keys[..., None, :], float("-inf"))
            weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a group of padding only attends to nothing
            if self.training and self.dropout:
                weights = F.dropout(weights, self.dropout)
            grouped = (weights @ vg).view(batch, len(heads), width, d)  # (B, h', m * l, d)
            out[:, heads] = grouped[:, :, shift : shift + length]
        return self.out(out.transpose(1, 2).reshape(batch, length, self.dim))  # (B, L, D)

    def block_mask(self, length: int, device=None) -> torch.Tensor:
        """(h, L, L) True where position i may attend to j: the same group in that head. The reference the
        grouped computation is tested against (full attention under this mask)."""
        rows = [group_ids(length, self.group, o, device) for o in self.offsets]
        return torch.stack([g[:, None] == g[None, :] for g in rows])

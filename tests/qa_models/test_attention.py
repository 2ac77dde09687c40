"""Group multi-head attention (GGSA): equal to full attention under the equivalent block mask, offsets moving
the group boundaries per head, and padding invariance."""

import torch

from qa_models.attention import GroupMultiHeadAttention, group_ids


def _full_attention_under(block: GroupMultiHeadAttention, x, mask):
    batch, length, dim = x.shape
    heads, d = block.heads, dim // block.heads
    q, k, v = block.qkv(x).view(batch, length, 3, heads, d).permute(2, 0, 3, 1, 4)
    allowed = block.block_mask(length)[None] & mask[:, None, None, :]  # (B, h, L, L)
    scores = (q @ k.transpose(-1, -2) / d**0.5).masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, -1).nan_to_num(0.0) @ v
    return block.out(out.transpose(1, 2).reshape(batch, length, dim))


def test_group_ids_with_offsets():
    assert group_ids(12, 4, 0).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert group_ids(12, 4, 2).tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3]  # boundaries shifted by 2


def test_grouped_attention_equals_full_attention_under_the_block_mask():
    torch.manual_seed(0)
    block = GroupMultiHeadAttention(dim=24, heads=6, group=10, offsets=[0, 0, 0, 5, 5, 5]).eval()  # the paper's
    x = torch.randn(3, 27, 24)
    mask = torch.ones(3, 27, dtype=torch.bool)
    mask[1, 20:] = False
    mask[2, 9:] = False
    torch.testing.assert_close(block(x, mask)[mask], _full_attention_under(block, x, mask)[mask])
    grid = block.block_mask(27)
    assert grid[0, 4, 9] and not grid[0, 9, 10] and grid[3, 9, 10] and not grid[3, 4, 5]


def test_padding_after_the_sequence_changes_nothing():
    torch.manual_seed(1)
    block = GroupMultiHeadAttention(dim=16, heads=4, group=3, offsets=[0, 1, 2, 0]).eval()
    x = torch.randn(2, 7, 16)
    mask = torch.ones(2, 7, dtype=torch.bool)
    longer = torch.cat([x, torch.randn(2, 5, 16)], 1)
    longer_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], 1)
    torch.testing.assert_close(block(x, mask), block(longer, longer_mask)[:, :7])


def test_gradients_are_finite_with_a_group_of_padding_only():
    torch.manual_seed(2)
    block = GroupMultiHeadAttention(dim=8, heads=2, group=4, offsets=[0, 2])
    x = torch.randn(2, 12, 8, requires_grad=True)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 3:] = False  # whole groups of padding in both heads
    (block(x, mask)[mask]).sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in block.parameters())

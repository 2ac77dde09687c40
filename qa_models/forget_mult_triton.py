"""The forget-mult recurrence of QRNN and CTRN on a GPU as one Triton kernel per direction.

    c_t = f_t * c_{t-1} + (1 - f_t) * z_t        (forward, left to right)
    dc_t = g_t + f_{t+1} dc_{t+1},  df_t = dc_t (c_{t-1} - z_t),  dz_t = dc_t (1 - f_t)    (backward, right to left)

As in Bradbury et al.'s QRNN kernel, the recurrence is parallel over the batch and the channels and sequential
over time only: each program owns BLOCK channels of one batch row and walks the L steps with its state in
registers, so a pass over a (B, L, d) sequence is one launch reading and writing each element once, where the
torch loop launches two kernels per step. Arithmetic is in float32 whatever the tensors' dtype (bf16 under
autocast), results are stored in the tensors' dtype. Imported only where CUDA and Triton are present
(qa_models/scan.py decides).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 128  # channels per program: d = 256 gives 2 programs per batch row


@triton.jit
def _forward_kernel(f_ptr, z_ptr, c0_ptr, c_ptr, length, dim, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2**31 elements stay exact
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < dim
    state = tl.load(c0_ptr + row * dim + cols, mask=keep, other=0.0).to(tl.float32)
    base = row * length * dim + cols
    for t in range(length):
        f = tl.load(f_ptr + base + t * dim, mask=keep, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + base + t * dim, mask=keep, other=0.0).to(tl.float32)
        state = z + f * (state - z)
        tl.store(c_ptr + base + t * dim, state.to(c_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _backward_kernel(
    f_ptr, z_ptr, c0_ptr, c_ptr, grad_c_ptr, grad_f_ptr, grad_z_ptr, grad_c0_ptr, length, dim, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2**31 elements stay exact
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < dim
    c0 = tl.load(c0_ptr + row * dim + cols, mask=keep, other=0.0).to(tl.float32)
    base = row * length * dim + cols
    carry = tl.zeros([BLOCK], dtype=tl.float32)  # f_{t+1} dc_{t+1}
    for step in range(length):
        t = length - 1 - step
        f = tl.load(f_ptr + base + t * dim, mask=keep, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + base + t * dim, mask=keep, other=0.0).to(tl.float32)
        g = tl.load(grad_c_ptr + base + t * dim, mask=keep, other=0.0).to(tl.float32)
        earlier = tl.load(c_ptr + base + (t - 1) * dim, mask=keep & (t > 0), other=0.0).to(tl.float32)
        previous = tl.where(t > 0, earlier, c0)
        dc = g + carry
        tl.store(grad_f_ptr + base + t * dim, (dc * (previous - z)).to(grad_f_ptr.dtype.element_ty), mask=keep)
        carry = dc * f
        tl.store(grad_z_ptr + base + t * dim, (dc - carry).to(grad_z_ptr.dtype.element_ty), mask=keep)
    tl.store(grad_c0_ptr + row * dim + cols, carry.to(grad_c0_ptr.dtype.element_ty), mask=keep)


def _grid(f: torch.Tensor) -> tuple[int, int]:
    return (f.size(0), triton.cdiv(f.size(2), BLOCK))


def forward(f: torch.Tensor, z: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """All states c (B, L, d) from contiguous f, z (B, L, d) and c0 (B, d) on one CUDA device."""
    c = torch.empty_like(z)  # (B, L, d)
    _forward_kernel[_grid(f)](f, z, c0, c, f.size(1), f.size(2), BLOCK=BLOCK)
    return c


def backward(
    f: torch.Tensor, z: torch.Tensor, c0: torch.Tensor, c: torch.Tensor, grad_c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(df, dz, dc0) of the recurrence, given the saved f, z, c0, c and the incoming gradient of c."""
    grad_f, grad_z = torch.empty_like(f), torch.empty_like(z)  # (B, L, d)
    grad_c0 = torch.empty_like(c0)  # (B, d)
    _backward_kernel[_grid(f)](
        f, z, c0, c, grad_c.contiguous(), grad_f, grad_z, grad_c0, f.size(1), f.size(2), BLOCK=BLOCK
    )
    return grad_f, grad_z, grad_c0

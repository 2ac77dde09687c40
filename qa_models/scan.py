"""The quasi-recurrent "forget-mult" recurrence of QRNN and CTRN, with a hand-written backward pass.

    c_t = f_t * c_{t-1} + (1 - f_t) * z_t,    t = 1..L, c_0 given (zeros by default)

Bradbury et al. 2016 (QRNN, "fo-pooling"); Tay et al. 2018 (CTRN, eqs. for the CTRN-Q/CTRN-A cells, whose cross
cells run the same recurrence over gates gathered at the aligned steps t*).

Written as autograd sees it, a loop over time records ~3L tiny operations, each allocating a fresh (B, d)
tensor, and backward walks that graph; log-space parallel scans do O(L log L) work and lose on CPU. Here
forward runs the loop in place into preallocated memory without recording anything, and backward runs the
adjoint recurrence once, right to left:

    dc_t  = g_t + f_{t+1} * dc_{t+1}         (g_t: the incoming gradient of c_t; dc_{L+1} = 0)
    df_t  = dc_t * (c_{t-1} - z_t)
    dz_t  = dc_t * (1 - f_t)
    dc_0  = f_1 * dc_1

Steps where a sequence is padding should carry f = 1 (then c and its gradient pass through unchanged and the
padded z gets no gradient): `masked_forget` does that.

On CPU the same two loops run as a small C kernel (`forget_mult.c`: one pass over memory per direction, rows of
the batch split over threads), compiled once per machine with the system's C compiler into a cache folder
(`QA_MODELS_CACHE`, default ~/.cache/qa_models): one pass over nine (B, L, d) arrays, bound by memory bandwidth;
`python bench/encoders.py` times it against the torch loop and the definition under autograd. Where no
compiler is found, or with `QA_MODELS_NATIVE=0`, the torch loop runs instead, with a warning. On a CUDA device
with Triton, the same two passes run as one Triton kernel each (`forget_mult_triton.py`: parallel over batch rows
and channels, sequential over time, as the QRNN paper's CUDA kernel); without Triton, or with
`QA_MODELS_NATIVE=0`, the torch loop runs there (two elementwise kernels a step).

`ctrn_cells` goes one step further for CTRN on CPU: the activations of its gates, both texts' own and crossed
cells (two recurrences each), their Hadamard merge and the mean pooling run as one C kernel each way
(`ctrn_cells.c`, compiled into the same library), instead of some thirty torch operations over (B, L, d) arrays,
each a pass over memory and a fresh allocation; CTRN composes the cells from `forget_mult` where the kernel does
not apply (GPU, half precision, no compiler).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = [os.path.join(_HERE, "forget_mult.c"), os.path.join(_HERE, "ctrn_cells.c")]  # one library
_FLAGS = ["-O3", "-std=c99", "-shared", "-fPIC"]
_UNSET = object()
_library = _UNSET
_library_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own
_triton: Any = None  # the Triton module once looked for; False where it is not there


def _compile(compiler: str) -> str:
    """The kernels' shared library path, compiled on first use. Named by a hash of the sources, compiler, flags
    and machine, and written whole (temporary file, rename), so concurrent workers on a node, or nodes sharing a
    home folder, never load a half-written or foreign library."""
    sources = []
    for path in _SOURCES:
        with open(path, "rb") as f:
            sources.append(f.read())
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        b"\0".join([*sources, version.encode(), " ".join(_FLAGS).encode(), platform.machine().encode()])
    ).hexdigest()[:16]
    cache = os.environ.get("QA_MODELS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "qa_models")
    target = os.path.join(cache, f"forget_mult-{key}.so")
    if not os.path.exists(target):
        os.makedirs(cache, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=cache, prefix=".forget_mult-", suffix=".so")
        os.close(fd)
        try:
            done = subprocess.run([compiler, *_FLAGS, *_SOURCES, "-o", partial], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} failed on {' '.join(_SOURCES)}: {done.stderr.strip()[-2000:]}")
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return target


def native_library():
    """The compiled kernel (ctypes), or None where it cannot be built (the torch loop is used then)."""
    global _library
    with _library_lock:
        if _library is _UNSET:
            _library = _load_library()
        return _library


def _load_library():
    if os.environ.get("QA_MODELS_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        warnings.warn("forget_mult: no C compiler found (set CC); QRNN/CTRN use the slower torch loop", stacklevel=2)
        return None
    try:
        library = ctypes.CDLL(_compile(compiler))
    except (OSError, RuntimeError) as error:
        warnings.warn(f"forget_mult: the C kernel could not be built ({error}); using the torch loop", stacklevel=2)
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    for name in ("forget_mult_f32", "forget_mult_f64"):
        getattr(library, f"{name}_forward").argtypes = [pointer] * 4 + [size] * 4
        getattr(library, f"{name}_backward").argtypes = [pointer] * 8 + [size] * 4
        getattr(library, f"{name}_forward").restype = getattr(library, f"{name}_backward").restype = None
    for name in ("ctrn_cells_f32", "ctrn_cells_f64"):  # both return nonzero where their scratch is not allocated
        getattr(library, f"{name}_forward").argtypes = [pointer] * 12 + [size] * 6
        getattr(library, f"{name}_backward").argtypes = [pointer] * 14 + [size] * 6
    return library


def _triton_kernel():
    """qa_models.forget_mult_triton where Triton imports and native kernels are not turned off, else None."""
    global _triton
    if _triton is None:
        _triton = False
        if os.environ.get("QA_MODELS_NATIVE", "1") != "0":
            try:
                from qa_models import forget_mult_triton

                _triton = forget_mult_triton
            except ImportError:
                pass
    return _triton or None


def _native_for(*tensors: torch.Tensor):
    """The kernel's function-name prefix when these tensors can go through it ("triton" on a CUDA device), else
    None."""
    if all(t.is_cuda for t in tensors):  # float32 arithmetic inside: float64 keeps the torch loop's precision
        half_or_single = tensors[0].dtype in (torch.float32, torch.bfloat16, torch.float16)
        return "triton" if half_or_single and _triton_kernel() is not None else None
    dtype = tensors[0].dtype
    if dtype not in (torch.float32, torch.float64) or any(t.device.type != "cpu" for t in tensors):
        return None
    if native_library() is None:
        return None
    return "forget_mult_f32" if dtype == torch.float32 else "forget_mult_f64"


def _over_rows(function: Callable[..., int | None], rows: int, elements: int, *arguments: Any) -> None:
    """`function(*arguments, row_begin, row_end)` over the batch rows, split across torch's intra-op thread
    count (ctypes releases the GIL during each call). Small inputs stay on one thread."""
    global _pool
    threads = max(1, min(torch.get_num_threads(), rows, elements >> 16))
    if threads == 1:
        if function(*arguments, 0, rows):
            raise MemoryError(f"{function.__name__}: out of memory for its scratch rows")
        return
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="forget_mult"))
    bounds = [rows * i // threads for i in range(threads + 1)]
    pool = _pool[1]
    futures = [pool.submit(function, *arguments, bounds[i], bounds[i + 1]) for i in range(threads)]
    codes = [future.result() for future in futures]  # every part finished before anything is raised
    if any(codes):
        raise MemoryError(f"{function.__name__}: out of memory for its scratch rows")


class _ForgetMult(torch.autograd.Function):
    """No temporaries per step: a fresh (B, d) tensor per step costs a page-faulting allocation (glibc maps
    blocks over 128 KB anew each time), which is what makes the autograd loop slow, more than its arithmetic.
    Each step reads B rows of d contiguous values in place (no time-major copies, which would be allocations
    of the whole sequence again)."""

    @staticmethod
    def forward(ctx, f: torch.Tensor, z: torch.Tensor, c0: torch.Tensor, kernel: str) -> torch.Tensor:
        # f, z: (B, L, d) contiguous; c0: (B, d)
        c = torch.empty_like(z)  # (B, L, d)
        native = _native_for(f, z, c0) if kernel != "torch" else None
        ctx.native = native
        if native == "triton":
            c = _triton_kernel().forward(f, z, c0)
            ctx.save_for_backward(f, z, c0, c)
            return c
        if native is not None:
            _over_rows(
                getattr(native_library(), f"{native}_forward"),
                f.size(0),
                f.numel(),
                f.data_ptr(),
                z.data_ptr(),
                c0.data_ptr(),
                c.data_ptr(),
                f.size(1),
                f.size(2),
            )
            ctx.save_for_backward(f, z, c0, c)
            return c
        scratch = torch.empty_like(c0)  # (B, d)
        prev = c0
        for t in range(f.size(1)):
            torch.sub(prev, z[:, t], out=scratch)
            torch.addcmul(z[:, t], f[:, t], scratch, out=c[:, t])  # c_t = z_t + f_t * (c_{t-1} - z_t)
            prev = c[:, t]
        ctx.save_for_backward(f, z, c0, c)
        return c

    @staticmethod
    def backward(ctx, grad_c: torch.Tensor):
        f, z, c0, c = ctx.saved_tensors
        grad_f = torch.empty_like(f)
        grad_z = torch.empty_like(z)
        if ctx.native == "triton":
            grad_f, grad_z, grad_c0 = _triton_kernel().backward(f, z, c0, c, grad_c)
            return grad_f, grad_z, grad_c0, None
        if ctx.native is not None:
            grad_c = grad_c.contiguous()
            carry = torch.empty_like(c0)
            _over_rows(
                getattr(native_library(), f"{ctx.native}_backward"),
                f.size(0),
                f.numel(),
                f.data_ptr(),
                z.data_ptr(),
                c0.data_ptr(),
                c.data_ptr(),
                grad_c.data_ptr(),
                grad_f.data_ptr(),
                grad_z.data_ptr(),
                carry.data_ptr(),
                f.size(1),
                f.size(2),
            )
            return grad_f, grad_z, carry, None
        carry = torch.zeros_like(c0)  # f_{t+1} * dc_{t+1}
        dc = torch.empty_like(c0)
        scratch = torch.empty_like(c0)
        for t in range(f.size(1) - 1, -1, -1):
            torch.add(grad_c[:, t], carry, out=dc)  # dc_t = g_t + f_{t+1} dc_{t+1}
            torch.sub(c[:, t - 1] if t > 0 else c0, z[:, t], out=scratch)
            torch.mul(dc, scratch, out=grad_f[:, t])  # df_t = dc_t (c_{t-1} - z_t)
            torch.mul(dc, f[:, t], out=carry)
            torch.sub(dc, carry, out=grad_z[:, t])  # dz_t = dc_t (1 - f_t) = dc_t - dc_t f_t
        return grad_f, grad_z, carry, None


def forget_mult(f: torch.Tensor, z: torch.Tensor, c0: torch.Tensor | None = None, kernel: str = "auto") -> torch.Tensor:
    """All cell states (B, L, d) of c_t = f_t * c_{t-1} + (1 - f_t) * z_t for gates f and inputs z (B, L, d).
    `kernel`: "auto" (the C kernel for float32/float64 CPU tensors where it builds, the Triton kernel for CUDA
    tensors where Triton is installed, else the torch loop) or "torch" (always the torch loop)."""
    if f.shape != z.shape or f.dim() != 3:
        raise ValueError(f"f and z must both be (batch, length, dim), got {tuple(f.shape)} and {tuple(z.shape)}")
    if kernel not in ("auto", "torch"):
        raise ValueError(f"kernel must be auto or torch, got {kernel!r}")
    if c0 is None:
        c0 = z.new_zeros(z.size(0), z.size(2))
    return _ForgetMult.apply(f.contiguous(), z.contiguous(), c0.contiguous(), kernel)


def forget_mult_reference(f: torch.Tensor, z: torch.Tensor, c0: torch.Tensor | None = None) -> torch.Tensor:
    """The recurrence as written, step by step under autograd: the definition `forget_mult` is tested against."""
    c = z.new_zeros(z.size(0), z.size(2)) if c0 is None else c0
    states = []
    for f_t, z_t in zip(f.unbind(1), z.unbind(1)):
        c = f_t * c + (1 - f_t) * z_t
        states.append(c)
    return torch.stack(states, 1)


def masked_forget(f: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Gates with f = 1 at padded steps (`mask` (B, L) True on real tokens), so padding leaves c unchanged."""
    return torch.where(mask[..., None], f, torch.ones_like(f))


# ------------------------------------------------------------------------------------- CTRN's cells, fused (CPU)
def activate_gates_(gates: torch.Tensor) -> torch.Tensor:
    """Pre-activations (B, L, 3d) [z | f | o] turned in place into [tanh(z) | sigmoid(f) | sigmoid(o)]: a fresh
    (B, L, 3d) tensor would cost a page fault per 4 KB on first touch, as much as the activations themselves."""
    d = gates.size(-1) // 3
    gates[..., :d].tanh_()
    gates[..., d:].sigmoid_()
    return gates


def fused_cells_for(gates: torch.Tensor) -> str | None:
    """The C kernel's function-name prefix for `ctrn_cells` on these gates (float32 or float64 CPU tensors where
    the kernel builds), else None: the caller then composes the cells from `forget_mult` (GPU, half precision,
    no compiler, QA_MODELS_NATIVE=0)."""
    if gates.device.type != "cpu" or gates.dtype not in (torch.float32, torch.float64):
        return None
    if native_library() is None:
        return None
    return "ctrn_cells_f32" if gates.dtype == torch.float32 else "ctrn_cells_f64"


def _run_cells(function, active_q, active_a, masks, steps, states_q, states_a, cross: bool, *arrays) -> None:
    """A ctrn_cells.c function over the batch rows: the pointers both directions read (activations, masks, steps,
    each text's states c and cx), then `arrays` (what the direction writes, and backward's incoming gradients), then
    the lengths, d and `cross`."""
    shared = (active_q, active_a, *masks, *steps, states_q[0], states_q[-1], states_a[0], states_a[-1])
    _over_rows(
        function,
        active_q.size(0),
        states_q.numel() + states_a.numel(),
        *(t.data_ptr() for t in (*shared, *arrays)),
        active_q.size(1),
        active_a.size(1),
        states_q.size(-1),
        int(cross),
    )


class _CTRNCells(torch.autograd.Function):
    """Activations, both texts' cells and their mean pooling as one autograd node over the C kernel
    (`ctrn_cells.c`). Composed from torch operations, the cells take some thirty passes over (B, L, d) arrays
    each way (activations, padding masks, two recurrences, gathers of the partner's gates, three products, the
    mean, and each one's backward), which on CPU cost as much as CTRN's matrix products; fused, forward reads the
    activations once and writes the two states, and backward reads them once more and writes the gates'
    gradients."""

    @staticmethod
    def forward(ctx, gates_q, gates_a, mask_q, mask_a, steps_q, steps_a, cross: bool, prefix: str):
        # gates_*: (B, L, 3d) pre-activations [z | f | o]; masks (B, L) bool; steps (B, L) int64
        library = native_library()
        # in place: the gates are a product's fresh output, which its backward does not read
        active_q, active_a = activate_gates_(gates_q), activate_gates_(gates_a)
        ctx.mark_dirty(gates_q, gates_a)
        batch, d = gates_q.size(0), gates_q.size(2) // 3
        masks = [m.to(torch.uint8).contiguous() for m in (mask_q, mask_a)]
        steps = [s.to(torch.int64).contiguous() for s in (steps_q, steps_a)]
        states_q = gates_q.new_empty(2 if cross else 1, batch, gates_q.size(1), d)  # c and cx: (B, Lq, d) each
        states_a = gates_a.new_empty(2 if cross else 1, batch, gates_a.size(1), d)
        pooled_q, pooled_a = gates_q.new_empty(batch, d), gates_a.new_empty(batch, d)
        _run_cells(
            getattr(library, f"{prefix}_forward"),
            active_q,
            active_a,
            masks,
            steps,
            states_q,
            states_a,
            cross,
            pooled_q,
            pooled_a,
        )
        ctx.save_for_backward(active_q, active_a, *masks, *steps, states_q, states_a)
        ctx.cross, ctx.prefix = cross, prefix
        ctx.mark_non_differentiable(active_q, active_a)
        ctx.set_materialize_grads(False)  # no (B, L, 3d) zeros for the activations' (absent) gradients
        return pooled_q, pooled_a, active_q, active_a

    @staticmethod
    def backward(ctx, grad_q: torch.Tensor, grad_a: torch.Tensor, *_):
        active_q, active_a, mask_q, mask_a, steps_q, steps_a, states_q, states_a = ctx.saved_tensors
        batch, d = active_q.size(0), states_q.size(-1)
        grad_q = active_q.new_zeros(batch, d) if grad_q is None else grad_q.contiguous()
        grad_a = active_a.new_zeros(batch, d) if grad_a is None else grad_a.contiguous()
        grad_gates_q, grad_gates_a = torch.empty_like(active_q), torch.empty_like(active_a)  # the kernel fills both
        _run_cells(
            getattr(native_library(), f"{ctx.prefix}_backward"),
            active_q,
            active_a,
            (mask_q, mask_a),
            (steps_q, steps_a),
            states_q,
            states_a,
            ctx.cross,
            grad_q,
            grad_a,
            grad_gates_q,
            grad_gates_a,
        )
        return grad_gates_q, grad_gates_a, None, None, None, None, None, None


def ctrn_cells(
    gates_q: torch.Tensor,
    gates_a: torch.Tensor,
    mask_q: torch.Tensor,
    mask_a: torch.Tensor,
    steps_q: torch.Tensor,
    steps_a: torch.Tensor,
    cross: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CTRN's cells over both texts and their temporal mean pooling (qa_models/ctrn.py, `CTRN._cells` then
    `masked_mean`), fused into one C kernel each way: pooled (B, d) for question and answer from their gates'
    pre-activations (B, L, 3d) = [z | f | o], masks (B, L) and aligned steps (B, L) into the partner
    (`aligned_steps`). `cross=False`: QRNN's cells (h = o c). Only where `fused_cells_for` names a kernel.
    The gates must be contiguous and are activated in place (pass a product's fresh output, as CTRN does)."""
    prefix = fused_cells_for(gates_q)
    if prefix is None or fused_cells_for(gates_a) != prefix:
        raise ValueError("ctrn_cells: float32 or float64 CPU tensors and the C kernel (see fused_cells_for)")
    if gates_q.size(-1) % 3 or gates_q.size(-1) != gates_a.size(-1) or gates_q.size(0) != gates_a.size(0):
        raise ValueError(f"gates must be (B, L, 3d) alike, got {tuple(gates_q.shape)} and {tuple(gates_a.shape)}")
    if not (gates_q.is_contiguous() and gates_a.is_contiguous()):
        raise ValueError("ctrn_cells: the gates must be contiguous (B, L, 3d) tensors")
    for name, mask, steps, gates, partner in (
        ("question", mask_q, steps_q, gates_q, gates_a),
        ("answer", mask_a, steps_a, gates_a, gates_q),
    ):  # the kernel indexes memory with them: checked here, not trusted
        if mask.shape != gates.shape[:2] or steps.shape != gates.shape[:2]:
            raise ValueError(f"ctrn_cells: the {name}'s mask and steps must be {tuple(gates.shape[:2])}")
        if steps.numel() and (int(steps.min()) < 0 or int(steps.max()) >= partner.size(1)):
            raise ValueError(f"ctrn_cells: the {name}'s aligned steps must lie in [0, {partner.size(1)})")
    pooled_q, pooled_a, _, _ = _CTRNCells.apply(gates_q, gates_a, mask_q, mask_a, steps_q, steps_a, cross, prefix)
    return pooled_q, pooled_a

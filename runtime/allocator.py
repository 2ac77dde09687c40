"""glibc's malloc, tuned per process: handing freed heap back, and keeping big blocks for reuse.

glibc serves a block over its mmap threshold (128 KB at first, raised as such blocks are freed, to 32 MB at
most) with a fresh mapping, and unmaps it when freed. A CPU training step allocates and frees the same large
tensors every step (CTRN at the paper's size, batch 64 and L = 400: 20-80 MB each), so each step maps them
again and the kernel zero-fills them a 4 KB page fault at a time. Measured with `bench/encoders.py --quick
--families ctrn` (each case in a fresh process, 2 threads, two runs each way): CTRN's forward and backward took
810-1,024 ms with glibc's defaults and 473-489 ms with the thresholds below; nn.LSTM's 1,482-1,683 and 1,154-1,327.
The price is resident memory: the heap keeps the pages it reuses, with holes (torch aligns its blocks, so a freed
block is a few bytes short of the next request, and the heap settles holding a few), and CTRN's peak went from
458 MB to 1.2 GB. PyTorch's CPU performance guide makes the same point and suggests jemalloc or tcmalloc instead;
this needs no library that a pip install lacks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

# Blocks up to this size come from the heap and are reused from step to step; bigger ones (a DynSAN
# attention map over 8k tokens) are still mapped for themselves and returned at once.
REUSE_BLOCKS_UP_TO = 256 * 2**20
# Free memory at the top of the heap up to this much is kept for the next step rather than handed back; an
# idle worker still returns all of it (pipelines.blocks.trim_when_idle).
KEEP_FREE_HEAP_UP_TO = 2**30

# glibc's own settings of the two thresholds, which a user's choice wins over
GLIBC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
GLIBC_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

_LIBC: ctypes.CDLL | bool | None = None  # None: not looked up yet; False: no C library with mallopt


def glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (it has mallopt and malloc_trim), else None (musl, macOS)."""
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
        except OSError:
            libc = None
        _LIBC = libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else False
    return _LIBC if isinstance(_LIBC, ctypes.CDLL) else None


def release_free_heap() -> None:
    """Hand the heap that glibc holds free back to the operating system (malloc_trim)."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


def reuse_large_blocks(up_to: int = REUSE_BLOCKS_UP_TO, keep_free: int = KEEP_FREE_HEAP_UP_TO) -> bool:
    """From now on in this process, serve blocks up to `up_to` bytes from the heap and keep up to `keep_free`
    bytes of free heap, so that a loop that frees and allocates the same big tensors reuses their pages instead
    of mapping and faulting them in again. Whether it took effect: not where the C library is not glibc, nor
    where the user set either threshold in the environment (their choice stands)."""
    libc = glibc()
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    chosen = any(name in os.environ for name in GLIBC_SETTINGS) or any(t in tunables for t in GLIBC_TUNABLES)
    if libc is None or chosen:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, up_to)) and bool(libc.mallopt(M_TRIM_THRESHOLD, keep_free))

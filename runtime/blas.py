"""OpenBLAS's kernels pinned by instruction set, so that fastText's word vectors are a function of the data and the
options, not of the processor model.

gensim's FastText trains through OpenBLAS's level-1 routines (scipy's bundled OpenBLAS: sdot, saxpy), whose kernels
sum in other orders (AVX-512 against AVX2 widths), so the vectors' last bits, and every run that reads them, follow
the kernels. OpenBLAS picks them when it loads, by processor model, unless OPENBLAS_CORETYPE names them; and a
machine's environment may: the one measured below sets OPENBLAS_CORETYPE=Haswell in every process, though it has
AVX-512. Measured 2026-12-01 on an AMD EPYC of family 26 model 2 (Zen 5, AVX-512; OpenBLAS 0.3.30 picks SkylakeX
there when the variable is unset): with the inherited Haswell the same tokenised TrecQA gave sha256 78427c91... (as
Haswell did on family 25 model 1, AVX2 only), with SkylakeX 5353fac5..., the bytes the committed records read on
family 25 model 17; WikiQA's and SQuAD's vectors likewise matched theirs. So the kernels are chosen here by what the
CPU can run, not by its model or the environment: SkylakeX on every x86 CPU with AVX-512 (F, CD, BW, DQ, VL, what
those kernels use), Haswell on every other with AVX2 and FMA, OpenBLAS's own choice elsewhere (ARM, older x86).

OpenBLAS reads OPENBLAS_CORETYPE once, when the library loads: `pin_openblas_kernels` must run before numpy or scipy
is imported (jobs/word_vectors.py calls it before importing them); `--blas-kernels environment` keeps an inherited
value instead. `openblas_kernels` says which kernels the loaded libraries actually use, for the vectors' statistics.
"""

from __future__ import annotations

import ctypes
import os
import platform

# The instruction-set extensions each pinned kernel set needs (flag names as /proc/cpuinfo spells them), widest first.
PINNED_KERNELS = (
    ("SkylakeX", frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})),
    ("Haswell", frozenset({"avx2", "fma"})),
)


# The core names OpenBLAS's dynamic builds know, in lower case (OpenBLAS compares them so): x86-64, then arm64.
X86_64_CORES = """katmai coppermine northwood prescott banias atom core2 penryn dunnington nehalem athlon opteron
opteron_sse3 barcelona nano sandybridge bobcat bulldozer piledriver haswell steamroller excavator zen skylakex
cooperlake sapphirerapids"""
ARM64_CORES = """armv8 cortexa53 cortexa55 cortexa57 cortexa72 cortexa73 falkor thunderx thunderx2t99 tsv110 emag8180
neoversen1 neoversen2 neoversev1 thunderx3t110 a64fx armv8sve"""
# What jobs/word_vectors.py --blas-kernels takes.
BLAS_KERNEL_CHOICES = ("auto", "environment", *X86_64_CORES.split(), *ARM64_CORES.split())


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of the first processor; empty where /proc/cpuinfo is missing (macOS, Windows)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def kernels_for(flags: frozenset[str], machine: str | None = None) -> str | None:
    """The OpenBLAS kernel set pinned on a CPU with these flags; None where OpenBLAS keeps its own choice."""
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return None
    for kernels, needs in PINNED_KERNELS:
        if needs <= flags:
            return kernels
    return None


def pin_openblas_kernels(choice: str = "auto", environ=None, flags: frozenset[str] | None = None) -> str | None:
    """Set OPENBLAS_CORETYPE for this process and its children by `choice` (one of BLAS_KERNEL_CHOICES): "auto",
    the kernels for this CPU's instruction set (an inherited value is replaced: a machine image's setting, say,
    would make the vectors depend on the machine again); "environment", what OPENBLAS_CORETYPE already says; or an
    OpenBLAS core name. Returns the value in effect, None where OpenBLAS picks by processor model."""
    environ = os.environ if environ is None else environ
    if choice == "environment":
        return environ.get("OPENBLAS_CORETYPE") or None
    kernels = kernels_for(cpu_flags() if flags is None else flags) if choice == "auto" else choice
    if kernels is None:  # no pinned set for this CPU: whatever it would have been
        return environ.get("OPENBLAS_CORETYPE") or None
    environ["OPENBLAS_CORETYPE"] = kernels
    return kernels


def _loaded_openblas(maps: str = "/proc/self/maps") -> list[str]:
    """The OpenBLAS libraries this process has loaded (numpy's and scipy's bundle one each), by path."""
    paths: list[str] = []
    try:
        with open(maps) as f:
            for line in f:  # address, permissions, offset, device, inode, then the file mapped, if any
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if "openblas" in os.path.basename(path).lower() and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def openblas_kernels() -> dict[str, str]:
    """The kernel set (SkylakeX, Haswell, Zen, ... as OpenBLAS names it) each loaded OpenBLAS library runs, by the
    library's name without its build hash (numpy's libscipy_openblas64_, scipy's libscipy_openblas); empty where none
    is loaded or the process's maps cannot be read (not Linux)."""
    found: dict[str, str] = {}
    for path in _loaded_openblas():
        try:
            library = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))  # the copy already loaded, not another
        except OSError:
            continue
        for prefix, suffix in (("", ""), ("scipy_", ""), ("", "64_"), ("scipy_", "64_")):
            corename = getattr(library, f"{prefix}openblas_get_corename{suffix}", None)
            if corename is not None:
                corename.restype = ctypes.c_char_p
                name = os.path.basename(path).split(".so")[0].split("-")[0]
                found[name] = corename().decode()
                break
    return found

"""Encoder efficiency: forward+backward time and peak memory of the papers' efficient encoders against the
layers they replace, in one run on this machine.

    python bench/encoders.py [--quick] [--threads N] [--repeats R] [--json bench/encoders.json]
    python bench/encoders.py --device cuda [--families ctrn,forget-mult,dynsan] [--json docs/bench/encoders-gpu.json]

- GGSA: group multi-head attention (6 heads, groups of 10, offsets 0 and 5; D = 300) against global
  self-attention, textbook softmax(QK^T)V and torch's fused scaled_dot_product_attention (SDPA), at
  L = 200, 1,000, 4,000 (the paper: a factor m = L / l less attention work).
- CTRN and QRNN (d = 256, both texts of length L, batch 64) against the same network with nn.LSTM or nn.GRU
  of the same width in place of the quasi-recurrent layer and its cells, at L = 50 and 400 (the paper: 4x
  faster than an LSTM, on a GPU).
- The forget-mult recurrence alone (batch 64, d = 256): the kernel (C on CPU, Triton on a GPU) against the
  in-place torch loop and the definition step by step under autograd; and CTRN with the torch loop, for the
  kernel's effect on the model. On CPU also CTRN as a GPU runs it (`ctrn-unfused`: the gates convolved over the
  projected vectors, the cells composed from torch operations around the forget-mult kernel) against the CPU's
  path (`ctrn`, the default: the gates once per distinct word of the batch, the cells and pooling one C kernel).
  The word ids follow Zipf's law over a 30k vocabulary, as text does (a fifth of the positions hold a distinct
  word: `distinct_word_share`), and every network's word vectors are fixed, as in the paper.
- DynSAN: the DynSA block (D = 128, 8 heads, K = 256, as in the paper) against the same block attending over
  every token, textbook and SDPA, Bi-BloSA in its place (as Table 3 (g) and Table 4's Bi-BloSAN put it: no
  convolutions, D / 2 features a direction) and a BiLSTM of the same width, at L = 1k, 2k, 4k, 8k (the paper's
  Table 4, on a GPU: memory like a BiLSTM's, half that of full attention, two thirds of Bi-BloSAN's; 1.26 times
  Bi-BloSAN's training speed).

Every case runs in a fresh process (so peak memory is its own): warm-up passes (three on CPU, one on a GPU),
then --repeats timed passes of forward + backward (the best is kept; default 3); memory is the peak resident set
above what the process held before the first pass (ru_maxrss), and the bytes autograd saved for backward (the
activations, exact and machine-independent).
Every ratio is theirs over ours: above 1, ours is that many times faster or smaller. Every CPU case, ours and
theirs, runs with glibc keeping blocks up to 256 MB for reuse, as a training worker does (runtime/allocator.py);
`--allocator glibc` keeps glibc's defaults, which map and page-fault every block over 32 MB afresh at each step.
With --device cuda the cases run on GPU 0 in float32 (the recurrent baselines are cuDNN's LSTM and GRU, the
forget-mult CTRN's Triton kernel, `qa_models/forget_mult_triton.py`), timed between CUDA synchronisations, the
best of --repeats (default 20) passes; memory is the peak the CUDA allocator held above what it held before.
DynSAN's Table 4 is such a measure (one K80, against a Bi-LSTM in the block's place:
`dynsan_vs_bilstm_speedup_L4096`, `dynsan_vs_bilstm_memory_ratio_L4096`).
The last line is one JSON object (also written to --json) with `ggsa_vs_global_speedup_L1000` and
`dynsan_vs_full_speedup_L4096` (against SDPA), `ctrn_vs_lstm_speedup` (L = 400), `forget_mult_share_of_ctrn_step`,
`dynsan_vs_full_memory_ratio_L4096` (against the textbook form, as the paper measured),
`dynsan_vs_full_sdpa_memory_ratio_L4096`, `dynsan_vs_biblosa_speedup_L4096` and
`dynsan_vs_biblosa_memory_ratio_L4096`, with every case's figures under `cases`.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # bench/tokenize.py would shadow the standard library's tokenize
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse
import multiprocessing
import platform
import time
from collections.abc import Callable
from typing import Any

from bench.report import check_result_file, write_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GGSA_LENGTHS, CTRN_LENGTHS, DYNSAN_LENGTHS = (200, 1000, 4000), (50, 400), (1024, 2048, 4096, 8192)
QUICK = {"ggsa": (1000,), "ctrn": (400,), "forget-mult": (400,), "dynsan": (4096,)}
# Untimed passes before the timed ones on CPU: the heap settles over the first few steps (runtime/allocator.py;
# measured with CTRN, the second and third passes still page in fresh memory), as it does early in a training run.
CPU_WARMUP_PASSES = 3


# ------------------------------------------------------------------------------------------------ the cases
def _ggsa_case(variant: str, length: int, device: str = "cpu"):
    import torch

    from qa_models.attention import GroupMultiHeadAttention, MultiHeadAttention

    batch = max(1, 8000 // length)  # the same number of tokens at every length
    layer: torch.nn.Module
    if variant == "group":
        layer = GroupMultiHeadAttention(300, 6, 10, [0, 0, 0, 5, 5, 5])
    else:
        layer = MultiHeadAttention(300, 6, sdpa=variant == "global-sdpa")
    layer = layer.to(device)
    x = torch.randn(batch, length, 300, device=device, requires_grad=True)
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    return lambda: layer(x, mask).sum(), {"batch": batch}


class _RecurrentPairModel:
    """CTRN's network with a torch RNN (LSTM or GRU) of width d in place of its quasi-recurrent layer and cells."""

    def __init__(self, cell: str, config, device: str = "cpu"):
        import torch
        from torch import nn

        self.torch = torch
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim).to(device)
        self.embed.weight.requires_grad_(not config.freeze_embeddings)  # fixed, as CTRN's (the paper's setting)
        self.project = nn.Linear(config.embed_dim, config.dim).to(device)
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](config.dim, config.filters, batch_first=True).to(device)
        self.out = nn.Sequential(
            nn.Linear(2 * config.filters, config.hidden), nn.ReLU(), nn.Linear(config.hidden, 2)
        ).to(device)

    def __call__(self, q, q_mask, a, a_mask):
        def encode(ids, mask):
            h, _ = self.rnn(self.project(self.embed(ids)))
            keep = mask[..., None].float()
            return (h * keep).sum(1) / keep.sum(1)

        return self.out(self.torch.cat([encode(q, q_mask), encode(a, a_mask)], -1))


def _ctrn_case(variant: str, length: int, device: str = "cpu"):
    import torch

    from qa_models.ctrn import CTRN, CTRNConfig

    if variant == "ctrn-torch-loop":  # each case is a fresh process: no kernel (C or Triton) is loaded in this one
        os.environ["QA_MODELS_NATIVE"] = "0"
    if variant == "ctrn-unfused":  # the cells composed from torch operations, as on a GPU (a fresh process too)
        import qa_models.ctrn

        qa_models.ctrn.fused_cells_for = lambda gates: None
    config = CTRNConfig(
        vocab_size=30_000, embed_dim=300, dim=256, filters=256, hidden=256, dropout=0.0, cross=variant != "qrnn"
    )
    model: CTRN | _RecurrentPairModel
    if variant in ("ctrn", "qrnn", "ctrn-torch-loop", "ctrn-unfused"):
        model = CTRN(config).to(device)
    else:
        model = _RecurrentPairModel(variant, config, device)
    batch = 64
    # Word ids as text has them, Zipf's law over the vocabulary (p ~ 1 / rank): CTRN's gates cost in proportion to
    # a batch's distinct words (QuasiRecurrentGates.word_pre_activations), here about a fifth of its positions
    # (WikiQA's batches of 64 pairs: a sixth); uniform ids would flatter it
    generator = torch.Generator().manual_seed(0)
    frequency = 1.0 / torch.arange(1, config.vocab_size - 3, dtype=torch.float64)  # ids 4.. (0-3 are reserved)
    q, a = (
        (torch.multinomial(frequency, batch * length, replacement=True, generator=generator) + 4)
        .view(batch, length)
        .to(device)
        for _ in range(2)
    )
    distinct = torch.unique(torch.cat([q, a])).numel() / (2 * batch * length)
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    return lambda: model(q, mask, a, mask).sum(), {"batch": batch, "distinct_word_share": round(distinct, 3)}


def _forget_mult_case(variant: str, length: int, device: str = "cpu"):
    """The recurrence alone at CTRN's bench size (batch 64, d = 256): the C kernel (the Triton kernel on a GPU),
    the in-place torch loop with the same hand-written backward, and the definition step by step under autograd."""
    import torch

    from qa_models.scan import forget_mult, forget_mult_reference

    batch = 64
    f = torch.sigmoid(torch.randn(batch, length, 256, device=device)).requires_grad_()
    z = torch.randn(batch, length, 256, device=device, requires_grad=True)
    if variant == "autograd-loop":
        return lambda: forget_mult_reference(f, z).sum(), {"batch": batch}
    kernel = "auto" if variant == "kernel" else "torch"
    return lambda: forget_mult(f, z, kernel=kernel).sum(), {"batch": batch}


def _dynsan_case(variant: str, length: int, device: str = "cpu"):
    import torch
    from torch import nn

    from qa_models.dynsan import BiBloSABlock, DynSABlock

    x = torch.randn(1, length, 128, device=device, requires_grad=True)
    mask = torch.ones(1, length, dtype=torch.bool, device=device)
    if variant == "bilstm":
        lstm = nn.LSTM(128, 64, batch_first=True, bidirectional=True).to(device)
        return lambda: lstm(x)[0].sum(), {"batch": 1}
    if variant == "biblosa":
        biblosa = BiBloSABlock(128, 7, convolutions=False).to(device)
        return lambda: biblosa(x, mask)[0].sum(), {"batch": 1}
    block = DynSABlock(128, 8, 256, 7, select=variant == "dynsa", sdpa=variant in ("dynsa", "full-sdpa")).to(device)
    return lambda: block(x, mask)[0].sum(), {"batch": 1}


# each (variant, length[, device]) -> (one training step's loss, the case's fixed figures)
BUILDERS: dict[str, Callable[..., tuple[Callable[[], Any], dict]]] = {
    "ggsa": _ggsa_case,
    "ctrn": _ctrn_case,
    "forget-mult": _forget_mult_case,
    "dynsan": _dynsan_case,
}
VARIANTS = {
    "ggsa": ("group", "global-sdpa", "global-textbook"),
    "ctrn": ("ctrn", "ctrn-unfused", "ctrn-torch-loop", "qrnn", "lstm", "gru"),
    "forget-mult": ("kernel", "torch-loop", "autograd-loop"),
    "dynsan": ("dynsa", "full-sdpa", "full-textbook", "biblosa", "bilstm"),
}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _run_case(
    family: str, variant: str, length: int, threads: int, repeats: int, device: str = "cpu", allocator: str = "reuse"
) -> dict:
    import resource

    import torch

    from runtime.allocator import reuse_large_blocks

    # as a training worker runs (training/loop.py): glibc reuses big blocks instead of mapping them every step
    reused = allocator == "reuse" and reuse_large_blocks()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if device == "cuda":
        return _run_cuda_case(family, variant, length, repeats)
    step, extra = BUILDERS[family](variant, length)
    saved = 0

    def pack(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    before = _rss_mb()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    loss.backward()  # the first warm-up pass
    for _ in range(CPU_WARMUP_PASSES - 1):
        step().backward()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        step().backward()
        seconds.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    return {
        "family": family,
        "variant": variant,
        "length": length,
        **extra,
        "seconds": min(seconds),
        "peak_mb": round(peak - before, 1),
        "saved_for_backward_mb": round(saved / 2**20, 1),
        "allocator": "reuse" if reused else "glibc",
    }


def _run_cuda_case(family: str, variant: str, length: int, repeats: int) -> dict:
    import torch

    step, extra = BUILDERS[family](variant, length, "cuda")
    step().backward()  # the warm-up pass (kernel compilation, cuDNN's plan, the allocator's pools)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        step().backward()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return {
        "family": family,
        "variant": variant,
        "length": length,
        **extra,
        "seconds": min(seconds),
        "peak_mb": round((torch.cuda.max_memory_allocated() - before) / 2**20, 1),
        "device": torch.cuda.get_device_name(0),
    }


def run_case(family, variant, length, threads, repeats, device: str = "cpu", allocator: str = "reuse") -> dict:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_run_case, (family, variant, length, threads, repeats, device, allocator))


# -------------------------------------------------------------------------------------------------- report
def _ratio(cases, family, length, ours, theirs, key="seconds") -> float | None:
    by = {(c["variant"], c["length"]): c for c in cases if c["family"] == family}
    if (ours, length) not in by or (theirs, length) not in by:
        return None
    return round(by[(theirs, length)][key] / max(by[(ours, length)][key], 1e-9), 2)


def _share(cases, length) -> float | None:
    """The four recurrences' share of the CTRN step that runs them as separate kernels: `ctrn-unfused` on CPU
    (where `ctrn` fuses them with the rest of its cells), `ctrn` on a GPU."""
    by = {(c["family"], c["variant"], c["length"]): c["seconds"] for c in cases}
    step = by.get(("ctrn", "ctrn-unfused", length)) or by.get(("ctrn", "ctrn", length))
    if ("forget-mult", "kernel", length) not in by or step is None:
        return None
    return round(4 * by[("forget-mult", "kernel", length)] / step, 3)


def _forget_mult_bandwidth(cases, length) -> float | None:
    """GB/s the kernel moves: forward reads f, z and writes c, backward reads the incoming gradient, f, c and
    z and writes df and dz, nine (64, L, 256) float32 arrays in all."""
    by = {(c["family"], c["variant"], c["length"]): c["seconds"] for c in cases}
    if ("forget-mult", "kernel", length) not in by:
        return None
    return round(9 * 64 * length * 256 * 4 / by[("forget-mult", "kernel", length)] / 1e9, 2)


BOUNDS = {
    "ggsa": "attention work falls by m = L / l, but the Q/K/V and output projections (O(L D^2)) are shared by both "
    "and dominate at short L; SDPA's fused kernel narrows the gap at long L on CPU",
    "ctrn": "on CPU CTRN's gates cost one product per distinct word of the batch (the projection folded in), and "
    "its activations, cells and mean pooling are one C kernel each way (qa_models/ctrn_cells.c: forward reads the "
    "gates once and writes two states, backward reads them once more and writes the gates' gradients): what is "
    "left is memory traffic, gathering the gates to the steps and the cells' passes; an LSTM's hidden-to-hidden "
    "products cannot be shared between steps or words; on a GPU the recurrence is one Triton kernel per direction "
    "(forget_mult_triton.py) and the rest torch operations; against the fused LSTM/GRU of oneDNN (CPU) or cuDNN "
    "(GPU)",
    "forget-mult": "memory-bound: forward reads f, z and writes c; backward reads four (B, L, d) arrays and writes "
    "two, nine passes over memory with two multiply-adds per element (see "
    "forget_mult_kernel_traffic_gb_per_s)",
    "dynsan": "DynSA attends over K = 256 chosen tokens per head, so its attention is constant in L and the rest "
    "(convolutions, projections) linear; full attention's L x L scores dominate from about L = 2k; Bi-BloSA's "
    "multi-dimensional attention scores every feature of every pair it reads, within blocks of r = (2L)^(1/3) tokens "
    "(L r n) and between the L / r blocks ((L / r)^2 n): order L^(4/3), element by element (tanh, softmax, weighting "
    "at n = 64 a score), which a CPU pays for in memory passes, where DynSA's and SDPA's scores are matrix products",
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one length per family (L = 1000, 400, 4096), three repeats")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads per case")
    p.add_argument("--repeats", type=int, default=None, help="timed passes per case (default 3; 1 with --quick)")
    p.add_argument(
        "--lengths",
        action="append",
        default=[],
        metavar="FAMILY=L1,L2,...",
        help="sequence lengths of one family (ggsa, ctrn, forget-mult, dynsan) in place of its defaults; "
        "repeatable (experiments/results.py plots time and memory against these)",
    )
    p.add_argument("--families", default="ggsa,ctrn,forget-mult,dynsan", help="families to run, comma-separated")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: every case on GPU 0 (peak memory the CUDA allocator's, not the process's resident set)",
    )
    p.add_argument(
        "--allocator",
        choices=("reuse", "glibc"),
        default="reuse",
        help="CPU cases: reuse: glibc keeps blocks up to 256 MB for reuse, as training workers do "
        "(runtime/allocator.py); glibc: its defaults, which map every block over 32 MB afresh",
    )
    p.add_argument("--json", default=os.path.join(REPO, "bench", "encoders.json"))
    args = p.parse_args(argv)
    check_result_file(p, args.json, "ctrn_vs_lstm_speedup")
    repeats = args.repeats or (20 if args.device == "cuda" else 3)
    lengths = (
        QUICK
        if args.quick
        else {"ggsa": GGSA_LENGTHS, "ctrn": CTRN_LENGTHS, "forget-mult": CTRN_LENGTHS, "dynsan": DYNSAN_LENGTHS}
    )
    lengths = dict(lengths)
    for option in args.lengths:
        family, _, values = option.partition("=")
        if family not in BUILDERS or not values:
            p.error(f"--lengths {option!r}: expected FAMILY=L1,L2 with FAMILY one of {sorted(BUILDERS)}")
        lengths[family] = tuple(int(v) for v in values.split(","))
    families = [f for f in args.families.split(",") if f]
    if set(families) - set(BUILDERS):
        p.error(f"--families: unknown {sorted(set(families) - set(BUILDERS))}; one of {sorted(BUILDERS)}")
    started = time.time()
    cases = []
    for family in families:
        for length in lengths[family]:
            for variant in VARIANTS[family]:
                if args.device == "cuda" and variant == "ctrn-unfused":
                    continue  # on a GPU the cells are never fused: `ctrn` is that case
                case = run_case(family, variant, length, args.threads, repeats, args.device, args.allocator)
                cases.append(case)
                saved = case.get("saved_for_backward_mb")
                print(
                    f"{family:11s} {variant:16s} L={length:5d} batch={case['batch']:3d}  "
                    f"{case['seconds'] * 1000:9.1f} ms  peak {case['peak_mb']:8.1f} MB"
                    + (f"  saved {saved:8.1f} MB" if saved is not None else ""),
                    flush=True,
                )
    result = {
        "ggsa_vs_global_speedup_L1000": _ratio(cases, "ggsa", 1000, "group", "global-sdpa"),
        "ggsa_vs_global_textbook_speedup_L1000": _ratio(cases, "ggsa", 1000, "group", "global-textbook"),
        "ctrn_vs_lstm_speedup": _ratio(cases, "ctrn", 400, "ctrn", "lstm"),
        "qrnn_vs_lstm_speedup": _ratio(cases, "ctrn", 400, "qrnn", "lstm"),
        "ctrn_kernel_vs_torch_loop_speedup": _ratio(cases, "ctrn", 400, "ctrn", "ctrn-torch-loop"),
        "ctrn_fused_vs_unfused_speedup": _ratio(cases, "ctrn", 400, "ctrn", "ctrn-unfused"),
        "forget_mult_kernel_vs_torch_loop_speedup": _ratio(cases, "forget-mult", 400, "kernel", "torch-loop"),
        "forget_mult_kernel_vs_autograd_loop_speedup": _ratio(cases, "forget-mult", 400, "kernel", "autograd-loop"),
        # CTRN runs four recurrences per pair (own and cross cell, question and answer side)
        "forget_mult_share_of_ctrn_step": _share(cases, 400),
        "forget_mult_kernel_traffic_gb_per_s": _forget_mult_bandwidth(cases, 400),
        "dynsan_vs_full_speedup_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "full-sdpa"),
        "dynsan_vs_full_textbook_speedup_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "full-textbook"),
        "dynsan_vs_full_memory_ratio_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "full-textbook", "peak_mb"),
        "dynsan_vs_full_sdpa_memory_ratio_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "full-sdpa", "peak_mb"),
        "dynsan_vs_full_saved_ratio_L4096": _ratio(
            cases, "dynsan", 4096, "dynsa", "full-textbook", "saved_for_backward_mb"
        ),
        "dynsan_vs_biblosa_speedup_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "biblosa"),
        "dynsan_vs_biblosa_memory_ratio_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "biblosa", "peak_mb"),
        # Table 4's speedups and memory are against a Bi-LSTM in the block's place (a GPU measure: a K80)
        "dynsan_vs_bilstm_speedup_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "bilstm"),
        "dynsan_vs_bilstm_memory_ratio_L4096": _ratio(cases, "dynsan", 4096, "dynsa", "bilstm", "peak_mb"),
        "bounds": BOUNDS,
        "machine": {
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "processor": platform.processor() or platform.machine(),
            "device": cases[0].get("device", "cpu") if cases else args.device,
            "allocator": cases[0].get("allocator") if cases else None,
        },
        "quick": args.quick,
        "repeats": repeats,
        "seconds": round(time.time() - started, 1),
        "cases": cases,
    }
    for family, why in BOUNDS.items():
        print(f"bound ({family}): {why}")
    write_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

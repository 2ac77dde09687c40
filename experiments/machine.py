"""What a record says its run ran on and from: the device (a GPU by name, or the CPU's kind and the kernels torch
picks on it, which decide how a CPU run rounds), the versions of the software its figures depend on, and the
commit of the code."""

from __future__ import annotations

import os
import platform
import subprocess

from experiments.plan import REPO


def device_name(gpus_per_run: float | None) -> str:
    if not gpus_per_run:
        return "cpu"
    import torch

    return f"cuda: {torch.cuda.get_device_name(0)}"


def gpu_name(device: str) -> str:
    """The GPU a record's `device` names, as the page says it ("cuda: NVIDIA H200" is "NVIDIA H200"; "cpu" stays)."""
    return device.removeprefix("cuda: ")


def trained_on_gpu(record: dict) -> bool:
    """Whether a record's run trained on a GPU (its `device` names one; a record without it ran on CPUs)."""
    return str(record.get("device", "cpu")) != "cpu"


def device_kind(record: dict) -> str:
    """The kind of device a record's run trained on, as the page and the runner say it: "a CPU" or "a GPU"."""
    return "a GPU" if trained_on_gpu(record) else "a CPU"


SOFTWARE = ("torch", "ray", "transformers", "numpy", "pyarrow")


def software_versions() -> dict[str, str]:
    """The versions a record's figures depend on: Python, torch, Ray, transformers, numpy, and pyarrow (the bytes
    it writes for the data's shards, by which a record names what it read)."""
    from importlib.metadata import version

    return {"python": platform.python_version(), **{name: version(name) for name in SOFTWARE}}


# Settings of the environment that choose the code paths of torch's libraries, and so how a CPU run rounds: MKL's
# (torch's BLAS on x86: it picks a path by processor, which MKL_CBWR fixes) and oneDNN's instruction set.
ROUNDING_SETTINGS = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def cpu_kind() -> dict[str, str]:
    """The kind of CPU a CPU run's figures depend on, beside its software: the processor (model name, family and
    model from /proc/cpuinfo where there is one), the vector kernels torch dispatches to on it (AVX512, AVX2, ...,
    or what ATEN_CPU_CAPABILITY lowers them to), and any of ROUNDING_SETTINGS set (a run under MKL_CBWR=AVX2 is of
    another kind than one without). Kernels of another width round differently in the last bits, and a short
    training run amplifies that: measured, wikiqa-iarnn-word-seed0 from c92cc4d scores test MAP 0.4814 on AVX512
    kernels (twice, the same weights bit for bit) and 0.6180 with ATEN_CPU_CAPABILITY=avx2, same machine and inputs.
    The processor counts beside the kernels, and MKL's path is one part of it: recorded on an AMD EPYC with AVX512
    kernels, full-wikiqa-ctrn-seed0 (0.6298) re-ran on an Intel Xeon with AVX512 kernels to 0.6263, there with
    MKL_CBWR=AVX2 to 0.6297; full-wikiqa-ggsa-seed0 (0.5865) to 0.6139, with MKL_CBWR=AVX2 to 0.6059."""
    import torch

    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "cpu family", "model") and key.strip() not in fields:
                    fields[key.strip()] = value.strip()
                elif not line.strip() and fields:
                    break  # the first processor's block is enough: a machine's processors are of one kind
    except OSError:
        pass
    processor = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        processor += f" (family {fields['cpu family']}, model {fields['model']})"
    kind = {"processor": processor, "kernels": torch.backends.cpu.get_cpu_capability()}
    return kind | {name: os.environ[name] for name in ROUNDING_SETTINGS if os.environ.get(name)}


def describe_cpu(cpu: dict | None) -> str:
    if not cpu:
        return "a CPU it did not name"
    settings = "".join(f", {name}={cpu[name]}" for name in ROUNDING_SETTINGS if name in cpu)
    return f"{cpu['processor']}, {cpu['kernels']} kernels{settings}"


def cpu_mismatch(check: dict) -> str | None:
    """How a re-run check (experiments/rerun.py's) ran on another kind of CPU than its record: "another" where the
    record names another, "unnamed" where it names none; None on the same kind, or for a GPU record."""
    if check.get("recorded_device", "cpu") != "cpu" or check.get("recorded_cpu") == check.get("cpu"):
        return None
    return "another" if check.get("recorded_cpu") else "unnamed"


def machine_description(use_gpu: bool = False) -> str:
    """What a ledger record says it ran on: cores, processor, and the GPU or "no GPU"."""
    return f"{os.cpu_count()} cores ({describe_cpu(cpu_kind())}), " + (
        gpu_name(device_name(1)) if use_gpu else "no GPU"
    )


# What experiments/results.py writes as it runs: the ledger, the page and its plots. Their changes say nothing of the
# code a record ran from, so they never make the tree count as dirty (every record after the first of an
# invocation was marked -dirty by its own ledger before).
RESULTS_OUTPUTS = ("docs/results", "docs/results.md")


def git_commit() -> str:
    """The commit the code runs from, "-dirty" when a tracked file other than RESULTS_OUTPUTS differs from it (the
    figures then come from code no commit holds); "unknown" outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in RESULTS_OUTPUTS)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")

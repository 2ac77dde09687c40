"""GPU training throughput: our loop under Ray Train against a plain PyTorch loop and Hugging Face's Trainer on the
same GPU, how busy the GPU is, MFU, and two Ray Train workers sharing the GPU.

    python bench/training_gpu.py --data TOKENISED_WIKIQA [--encoder minilm=PATH] [--encoder mpnet-base=PATH]
        [--random-weights] [--batch-size 32] [--max-len 128] [--steps minilm=400,mpnet-base=200]
        [--compile reduce-overhead] [--arms hf-trainer,ours-bert,...] [--profile]
        [--parts throughput,multi-worker] [--json docs/bench/training-gpu.json]

Throughput (part `throughput`), for each encoder, in one process on one GPU, at the same batch, sequence cap and
precision (bf16 autocast over fp32 weights, as all three do it), one arm after another (--arms, in order; an arm
that fails is recorded with its error and the rest still run; --json is rewritten after each arm):
- ours (`ours-bert`, `ours-gsamn`): jobs/train.py's loop under Ray Train, one worker holding the whole GPU, fed by
  Ray Data as in a real run (`training.trainer.run`), as a cross-encoder (`--model bert`: the encoder's first
  state through a linear layer) and with GSAMN on top (`--model gsamn`), its forward compiled in --compile's mode
  (jobs/train.py --compile; `-eager` arms without), `ours-bert-buckets` with --length-buckets 32;
- plain (`plain-bert`, `plain-gsamn`): the same model, batches, compiled forward and optimiser in a plain PyTorch
  loop in this process (no Ray Train; the batches still come through `training.rows.epoch_batches`): the ceiling
  our loop should approach; it also reports the host's milliseconds per step by phase (`host_ms_per_step`:
  reading, building the batch, queueing forward and backward, queueing the optimiser step), which say what a GPU
  that is not busy waits for. `-seeded` seeds the generators every step and `-prefetched` builds the batches in
  a thread, as our loop does: what tells which of its ways, if any, costs it speed;
- hf-trainer (run first for each encoder): `transformers.Trainer` fine-tuning
  `AutoModelForSequenceClassification` (two labels) of the same encoder on the same pairs, tokenised once up
  front, padded per batch by `DataCollatorWithPadding`, Trainer's defaults otherwise (its default optimiser,
  `bf16=True`): the peer a user would pick; `hf-trainer-compiled` with Trainer's torch_compile in --compile's mode.
Examples per second are over the steps after a warm-up of a third of the arm's steps (at least 10: a compiled arm
records a CUDA graph at each sequence length's first batch), the clock read after the GPU has finished them (ours:
between the run's progress lines, whose loss read waits for the GPU; its own figure over every step after the
first is `examples_per_s_after_first_step`). `gpu_busy` is the mean of NVML's utilisation (the share of time a
kernel was running) sampled every 50 ms inside that window. --profile writes torch.profiler tables of 20 steps of
each plain arm and of each ours arm (the loop's QA_PROFILE) to a folder beside --json.

MFU is model FLOPs per second over the device's dense bf16 peak (989.5 TFLOP/s for the H100 SXM and the H200,
756 for the H100 PCIe): training costs 6 N per token for the N weights outside the embedding tables (forward 2N,
backward 4N) plus 12 n_layers d L per token for self-attention's scores and weighted sums at sequence length L
(forward 4 n_layers d L^2 per sequence, backward twice that), counted over the real (unpadded) tokens of the pairs
as the encoder's tokenizer cuts them at --max-len (Chowdhery et al. 2022, PaLM, appendix B). Padding and the
optimiser step are not model FLOPs.

The training data is --data's train split repeated until one epoch holds every timed step (`--repeat`, rows and
lengths as the set's), so no epoch end (dev evaluation, checkpoint) falls inside the timed steps.

With --random-weights each encoder is a seeded random initialisation of PATH's config.json (PATH then needs only
config.json and the tokenizer's files): weights do not change a step's time, and a device that cannot hold the
checkpoints (MPNet-base is 420 MB) still measures the models' own shapes.

Multi-worker (part `multi-worker`): GSAMN on the first --encoder, trained on --data for --mw-epochs epochs by one
worker holding the GPU (batch B) and by two workers sharing it (0.5 GPU each, batch B/2: the same global batch;
Gloo, since NCCL refuses two ranks on one device). The two-worker run is stopped mid-epoch by SIGTERM (a
checkpoint, as a preempted run) and run again, which resumes from it. Every row a worker trains on is traced
(QA_TRACE_ROWS): each epoch's rows must be trained exactly once across the workers and the two invocations (none
twice, none missing but the remainder of an equal split), and the final dev MAP must be within 0.01 of one
worker's (`same_result`).

The last line is one JSON object, also written to --json: `device`, `encoders: {name: {ours_vs_hf_trainer,
ours_vs_plain, gpu_busy, mfu, examples_per_s, runs: {...}}}` (the ratios for the cross-encoder, GSAMN's beside
them) and `multi_worker: {workers, backend, same_result, ...}`.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # bench/tokenize.py would shadow the standard library's tokenize
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse
import hashlib
import inspect
import json
import logging
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import replace

from bench.report import check_result_file, write_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Steps before the clock starts, at least WARM_STEPS and a third of an arm's steps: the allocator, autotuning, the
# first batches, and compiled arms' graphs (a CUDA graph is recorded at each sequence length's first batch).
WARM_STEPS = 10
WARM_SHARE = 3
# Dense bf16 peaks (NVIDIA's data sheets, without sparsity), by a name torch.cuda.get_device_name contains.
BF16_PEAKS = (("H100 PCIe", 756e12), ("H100", 989.5e12), ("H200", 989.5e12), ("A100", 312e12), ("L4", 121e12))


STARTED = time.time()


def _log(message: str) -> None:
    print(f"[bench-training-gpu +{time.time() - STARTED:.0f}s] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ the GPU's state
class BusySampler:
    """NVML's utilisation of GPU 0 every `period` seconds in a thread: (time, percent) pairs."""

    def __init__(self, period: float = 0.05):
        self.samples: list[tuple[float, int]] = []
        self.period, self.running = period, False
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.nvml = pynvml
        except Exception as error:  # no NVML: gpu_busy is reported as None with the reason
            self.nvml, self.reason = None, f"NVML unavailable: {error}"

    def __enter__(self):
        if self.nvml is not None:
            self.running = True
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.samples.append((time.time(), self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            time.sleep(self.period)

    def __exit__(self, *exc) -> None:
        self.running = False

    def busy(self, start: float, end: float) -> float | None:
        """Mean utilisation (0-1) of the samples in [start, end] (NVML's figure covers the period before it)."""
        inside = [percent for when, percent in self.samples if start + 0.2 <= when <= end]
        return round(sum(inside) / len(inside) / 100, 3) if inside else None


def synchronize(empty_cache: bool = False) -> None:
    """Wait for the GPU's queued work (a clock read before it would time the host's queueing alone)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        if empty_cache:
            torch.cuda.empty_cache()


def warm_steps(steps: int) -> int:
    return min(max(WARM_STEPS, steps // WARM_SHARE), steps // 2)


def steady_rate(progress_times: list, warm: int, batch_size: int, until: int) -> tuple[float, list[float]] | None:
    """Examples per second between the first progress line at or after step `warm` and the last one at or before
    step `until`, and that wall-clock window; None when fewer than two lines qualify."""
    lines = [(step, when) for step, when in progress_times or [] if warm <= step <= until]
    if len(lines) < 2:
        return None
    (first, start), (last, end) = lines[0], lines[-1]
    return (last - first) * batch_size / (end - start), [start, end]


def bf16_peak(name: str) -> float | None:
    return next((peak for key, peak in BF16_PEAKS if key in name), None)


# ------------------------------------------------------------------------------------------------ data and models
def repeated_split(data: str, repeat: int, folder: str) -> str:
    """A copy of tokenised folder `data` whose train split is its own rows `repeat` times over (qid and aid made
    unique per copy), the manifest's rows, files and digests updated; dev and test as they were."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.shards import shard_paths

    out = os.path.join(folder, f"{os.path.basename(os.path.normpath(data))}-x{repeat}")
    shutil.copytree(data, out)
    shutil.rmtree(os.path.join(out, "train"))
    os.makedirs(os.path.join(out, "train"))
    table = pa.concat_tables(pq.read_table(path) for path in shard_paths(data, "train")[0])
    copies = []
    for k in range(repeat):
        copy = table
        for column in ("qid", "aid"):
            values = pa.compute.binary_join_element_wise(copy.column(column), pa.scalar(f"x{k}"), "#")
            copy = copy.set_column(copy.schema.get_field_index(column), column, values)
        copies.append(copy)
    path = os.path.join(out, "train", "part-00000.parquet")
    pq.write_table(pa.concat_tables(copies), path, row_group_size=16384)
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    split = manifest["splits"]["train"]
    rows = table.num_rows * repeat
    split.update(
        rows=rows,
        questions=split.get("questions", 0) * repeat,
        positive=split.get("positive", 0) * repeat,
        files=[{"path": "train/part-00000.parquet", "rows": rows, "bytes": os.path.getsize(path), "sha256": digest}],
    )
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return out


def random_encoder(path: str, folder: str, name: str) -> str:
    """A seeded random initialisation of `path`'s config.json with its tokenizer, saved as a model folder."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    out = os.path.join(folder, f"{name}-random")
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.from_pretrained(path, local_files_only=True))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(path, local_files_only=True).save_pretrained(out)
    return out


def pairs(data: str, split: str = "train", limit: int | None = None):
    """(questions, answers, labels) of a tokenised split, in file order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.shards import shard_paths

    table = pa.concat_tables(
        pq.read_table(p, columns=["question", "answer", "label"]) for p in shard_paths(data, split)[0]
    )
    if limit is not None:
        table = table.slice(0, limit)
    return table.column("question").to_pylist(), table.column("answer").to_pylist(), table.column("label").to_pylist()


def flops_per_example(encoder: str, model, data: str, max_len: int) -> float:
    """6 N per real token (N: the weights outside embedding tables) plus 12 n_layers d L per token of attention,
    averaged over the train pairs as the encoder's tokenizer cuts them at `max_len` (the module docstring)."""
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(encoder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(encoder, local_files_only=True)
    questions, answers, _ = pairs(data, limit=20000)
    lengths = np.array(
        [len(ids) for ids in tokenizer(questions, answers, truncation="longest_first", max_length=max_len)["input_ids"]]
    )
    embedded = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    weights = sum(p.numel() for p in model.parameters() if id(p) not in embedded)
    per_token_attention = 12 * config.num_hidden_layers * config.hidden_size
    return float(np.mean(6 * weights * lengths + per_token_attention * lengths.astype(np.float64) ** 2))


# ------------------------------------------------------------------------------------------------------ the arms
def ours(cfg, sampler: BusySampler) -> dict:
    from training.loop import PROFILE_STEPS
    from training.trainer import run

    started = time.time()
    summary = run(cfg)
    # the loop's QA_PROFILE (--profile) records the last steps: slower, so outside the window
    profiled = PROFILE_STEPS if os.environ.get("QA_PROFILE") else 0
    times = summary.get("progress_times")
    steady = steady_rate(times, warm_steps(cfg.max_steps), cfg.batch_size, cfg.max_steps - profiled)
    if steady is None:  # too few progress lines: every step after the first, as the run reports it
        steady = summary["examples_per_s"], summary.get("timed_window") or [started, time.time()]
    return {
        "examples_per_s": round(steady[0], 1),
        "examples_per_s_after_first_step": round(summary["examples_per_s"], 1),
        "gpu_busy": sampler.busy(*steady[1]),
        "steps": summary["steps"],
        "precision": summary.get("precision"),
        "dev_map": round(summary["metrics"].get("map") or 0.0, 4),
        "wall_s": round(time.time() - started, 1),
    }


def plain(
    cfg, sampler: BusySampler, profile_to: str | None = None, seeded: bool = False, prefetch: bool = False
) -> dict:
    """The model, batches, autocast and optimiser of our loop in a plain loop on this process's GPU; with
    `profile_to`, 20 steps after the timed ones run under torch.profiler and its table of host and device time by
    operator (and the count of synchronisations) is written there. Two of the loop's own ways, each on demand, to
    tell which (if either) costs the loop its speed: `seeded`, every step seeds the generators as the loop does
    (`seed_micro_batch`); `prefetch`, batches are built and pinned in a thread (`training.data.prefetched`)."""
    import torch

    from pipelines.shards import read_manifest, shard_paths
    from training.config import data_fields
    from training.data import Batcher, pinned, prefetched, to_device
    from training.loop import seed_micro_batch
    from training.models import build_model, training_forward
    from training.optim import build_optimizer
    from training.rows import epoch_batches, row_groups, worker_rows

    device = torch.device("cuda" if cfg.use_gpu else "cpu")
    manifest = read_manifest(cfg.data)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, manifest.get("vocab_size", 0), None, data_fields(manifest), None).to(device)
    optimizer = build_optimizer(cfg, model, cfg.lr)
    step_forward = training_forward(model, cfg.compile)
    batcher = Batcher(cfg, model.inputs, getattr(model, "objective", None), getattr(model.config, "max_len", None))
    groups = row_groups(shard_paths(os.path.abspath(cfg.data), "train")[0])
    start, stop = worker_rows(sum(rows for *_, rows in groups), 1, 0)

    def prepare(item: tuple[int, dict]):
        inputs, labels = batcher(item[1], train=True)
        return (pinned(inputs), pinned(labels)) if prefetch and device.type == "cuda" else (inputs, labels)

    model.train()
    done, timed_from = 0, 0.0
    # the host's time per step by phase (no phase waits for the GPU but the last, so a phase that takes long here
    # is what the GPU waits for): reading the next batch, building its tensors, queueing forward and backward,
    # queueing the optimiser step
    phases = dict.fromkeys(("read", "batch", "forward_backward", "optimizer"), 0.0)
    batches = epoch_batches(groups, start, stop, cfg, 0, 0, batcher.length_key)
    items = prefetched(batches, prepare) if prefetch else batches
    clock = time.perf_counter()
    for item in items:
        clock = _lap(phases, "read", clock)
        inputs, labels = item if prefetch else prepare(item)
        if seeded:
            seed_micro_batch(cfg.seed, 0, 0, done)
        inputs, labels = to_device(inputs, device), to_device(labels, device)
        clock = _lap(phases, "batch", clock)
        forward_backward(model, inputs, labels, device, step_forward)
        clock = _lap(phases, "forward_backward", clock)
        optimiser_step(model, optimizer, cfg)
        clock = _lap(phases, "optimizer", clock)
        done += 1
        if done == warm_steps(cfg.max_steps):
            synchronize()
            timed_from = time.time()
            phases = dict.fromkeys(phases, 0.0)
            clock = time.perf_counter()
        if done == cfg.max_steps:
            break
    synchronize()
    ended = time.time()
    timed_steps = done - warm_steps(cfg.max_steps)
    if prefetch:
        items.close()  # its thread stops before the stream is read here again or closed
    elif profile_to:
        profile_steps(model, optimizer, batcher, batches, device, cfg, profile_to, step_forward)
    batches.close()  # the rest of the epoch is not read (its Ray Data stream stops here)
    del model, optimizer, step_forward
    torch._dynamo.reset()  # the compiled graphs and their CUDA graphs' memory go with the model
    synchronize(empty_cache=True)
    return {
        "examples_per_s": round(timed_steps * cfg.batch_size / (ended - timed_from), 1),
        "gpu_busy": sampler.busy(timed_from, ended),
        "steps": done,
        "host_ms_per_step": {name: round(1000 * seconds / timed_steps, 2) for name, seconds in phases.items()},
    }


def profile_steps(model, optimizer, batcher, batches, device, cfg, path: str, step_forward, steps: int = 20) -> None:
    """`steps` more steps of the plain loop under torch.profiler: the operators by host time, and by device time."""
    from torch.profiler import ProfilerActivity, profile

    from training.data import to_device
    from training.progress import write_profile_tables

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for (_, batch), _ in zip(batches, range(steps)):
            inputs, labels = batcher(batch, train=True)
            forward_backward(model, to_device(inputs, device), to_device(labels, device), device, step_forward)
            optimiser_step(model, optimizer, cfg)
        synchronize()
    header = f"{steps} steps of the plain loop ({cfg.model}, {cfg.encoder_path}, batch {cfg.batch_size})"
    write_profile_tables(profiler, path, header, device.type == "cuda")


def forward_backward(model, inputs: dict, labels, device, step_forward=None) -> None:
    """One micro-batch's forward (bf16 autocast; through `step_forward`, the compiled model, where given) and
    backward, as the training loop runs it."""
    import torch

    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model.loss((model if step_forward is None else step_forward)(**inputs), labels)
    loss.backward()


def optimiser_step(model, optimizer, cfg) -> None:
    """The recipe's gradient clip (if any), the optimiser's step, and the gradients cleared."""
    import torch

    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _lap(phases: dict, name: str, since: float) -> float:
    now = time.perf_counter()
    phases[name] += now - since
    return now


def hf_trainer(
    encoder: str, data: str, batch_size: int, max_len: int, steps: int, sampler, folder: str, compile_mode: str = "none"
) -> dict:
    """transformers.Trainer fine-tuning AutoModelForSequenceClassification on the same pairs, its defaults but
    bf16, no checkpoints and no reporting; with `compile_mode` (not "none") Trainer's torch_compile in that mode,
    batches padded to a multiple of 16 tokens as ours are compiled."""
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from training.config import PAD_MULTIPLE_COMPILED

    compiled = compile_mode != "none"
    tokenizer = AutoTokenizer.from_pretrained(encoder, local_files_only=True)
    questions, answers, labels = pairs(data, limit=steps * batch_size)
    encoded = tokenizer(questions, answers, truncation="longest_first", max_length=max_len)
    rows = [
        {"input_ids": ids, "attention_mask": mask, "labels": int(label)}
        for ids, mask, label in zip(encoded["input_ids"], encoded["attention_mask"], labels)
    ]
    clock: dict = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warm_steps(steps):
                synchronize()
                clock["from"] = time.time()

        def on_train_end(self, args, state, control, **kwargs):
            synchronize()
            clock["to"], clock["steps"] = time.time(), state.global_step

    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=PAD_MULTIPLE_COMPILED if compiled else None)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(encoder, num_labels=2, local_files_only=True)
    if "token_type_ids" in encoded and "token_type_ids" in inspect.signature(model.forward).parameters:
        for row, types in zip(rows, encoded["token_type_ids"]):  # BERT's segments, as a user passes them
            row["token_type_ids"] = types
    arguments = TrainingArguments(
        output_dir=os.path.join(folder, "hf-trainer"),
        per_device_train_batch_size=batch_size,
        max_steps=steps,
        learning_rate=2e-5,
        bf16=True,
        use_cpu=not torch.cuda.is_available(),
        save_strategy="no",
        report_to="none",
        logging_steps=50,
        disable_tqdm=True,
        seed=0,
        **({"torch_compile": True, "torch_compile_mode": compile_mode} if compiled else {}),
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=rows,
        data_collator=collator,
        callbacks=[Clock()],
    )
    trainer.train()
    optimiser = type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer)
    fused = any(group.get("fused") for group in trainer.optimizer.param_groups)
    del trainer, model
    torch._dynamo.reset()
    synchronize(empty_cache=True)
    return {
        "examples_per_s": round((clock["steps"] - warm_steps(steps)) * batch_size / (clock["to"] - clock["from"]), 1),
        "gpu_busy": sampler.busy(clock["from"], clock["to"]),
        "steps": clock["steps"],
        "optimizer": f"{optimiser.__name__}{' (fused)' if fused else ''}",
    }


# The arms run by default, in this order (the peer first: the comparison the benchmark exists for survives a time
# limit on the arms after it), and those --arms may add: ours and plain without --compile, Trainer compiled in
# --compile's mode (batches padded to a multiple of 16, as ours), ours with --length-buckets 32, plain with the
# loop's per-step seeding and/or its prefetch thread (which of the loop's ways, if any, slows it).
ARMS = ("hf-trainer", "ours-bert", "plain-bert", "ours-gsamn", "plain-gsamn")
OPTIONAL_ARMS = (
    "ours-bert-eager",
    "plain-bert-eager",
    "ours-gsamn-eager",
    "hf-trainer-compiled",
    "ours-bert-buckets",
    "plain-bert-seeded",
    "plain-bert-prefetched",
    "plain-bert-seeded-prefetched",
)


def run_arm(arm: str, base, args, name: str, encoder: str, data: str, sampler: BusySampler, folder: str) -> dict:
    """One arm's figures; an arm that fails is recorded with its error and the others still run."""
    try:
        if arm.startswith("hf-trainer"):
            mode = args.compile if arm == "hf-trainer-compiled" else "none"
            return hf_trainer(encoder, data, args.batch_size, args.max_len, base.max_steps, sampler, folder, mode)
        kind, model, *variant = arm.split("-")
        cfg = replace(
            base,
            model=model,
            name=f"{name}-{arm}",
            compile="none" if "eager" in variant else args.compile,
            length_buckets=32 if "buckets" in variant else 0,
        )
        if kind == "ours":
            return ours(cfg, sampler)
        profile = os.path.join(profiles_folder(args), f"{name}-{arm}.txt") if args.profile else None
        return plain(cfg, sampler, profile, seeded="seeded" in variant, prefetch="prefetched" in variant)
    except Exception as error:  # a benchmark reports what failed and measures the rest
        _log(f"{name} {arm}: failed: {type(error).__name__}: {error}")
        synchronize(empty_cache=True)
        return {"error": f"{type(error).__name__}: {str(error)[:400]}"}


def arm_model(arm: str) -> str:
    """The model an arm trains: GSAMN for the -gsamn arms, else the cross-encoder (Trainer's too)."""
    return "gsamn" if "gsamn" in arm else "bert"


def ratio(runs: dict, top: str, bottom: str) -> float | None:
    """runs[top] examples per second over runs[bottom]'s, where both arms ran."""
    a, b = runs.get(top, {}).get("examples_per_s"), runs.get(bottom, {}).get("examples_per_s")
    return round(a / b, 3) if a and b else None


def summary(runs: dict, model: str = "bert") -> dict:
    """The headline figures of the cross-encoder (`bert`) or of GSAMN (`gsamn`), from the arms that ran."""
    ours_arm = runs.get(f"ours-{model}", {})
    figures = {
        "ours_vs_plain": ratio(runs, f"ours-{model}", f"plain-{model}"),
        "gpu_busy": ours_arm.get("gpu_busy"),
        "mfu": ours_arm.get("mfu"),
        "examples_per_s": ours_arm.get("examples_per_s"),
        "compiled_vs_eager": ratio(runs, f"ours-{model}", f"ours-{model}-eager"),
    }
    if model == "bert":
        figures = {
            "ours_vs_hf_trainer": ratio(runs, "ours-bert", "hf-trainer"),
            "ours_vs_hf_trainer_compiled": ratio(runs, "ours-bert", "hf-trainer-compiled"),
            **figures,
        }
    return {key: value for key, value in figures.items() if value is not None or key in ("ours_vs_hf_trainer",)}


def throughput(args, encoders: dict[str, str], sampler: BusySampler, folder: str, result: dict) -> dict:
    """Every arm for every encoder; `result["encoders"]` is written to --json after each arm (a failure or a
    time limit later keeps what was measured)."""
    import torch

    from training.config import TrainConfig
    from training.models import build_model

    steps = dict(item.split("=") for item in args.steps.split(","))
    arms = args.arms.split(",")
    data = repeated_split(args.data, args.repeat, folder)
    peak = bf16_peak(torch.cuda.get_device_name(0)) if args.device == "cuda" else None
    results: dict = result.setdefault("encoders", {})
    for name, path in encoders.items():
        encoder = random_encoder(path, folder, name) if args.random_weights else path
        n = int(steps.get(name, 400))
        base = TrainConfig(
            model="bert",
            data=data,
            encoder_path=encoder,
            use_gpu=args.device == "cuda",
            precision="bf16",
            batch_size=args.batch_size,
            max_len=args.max_len,
            max_steps=n,
            seed=0,
            storage_path=os.path.join(folder, "runs"),
            name=f"{name}-bert",
            checkpoint_minutes=0,
            log_every=max(1, n // 12),  # the progress lines' times are what ours' steady state is read between
            patience=0,
        )
        flops = {  # the models the arms train (each count tokenises the train pairs), before the first arm
            model: flops_per_example(encoder, build_model(replace(base, model=model), 0), data, args.max_len)
            for model in {arm_model(arm) for arm in arms}
        }
        runs: dict = {}
        head = {
            "weights": "random (seeded) from the encoder's config" if args.random_weights else "pretrained",
            "steps": n,
            "compile": args.compile,
        }
        for arm in arms:
            _log(f"{name} {arm}: {n} steps")
            runs[arm] = figures = run_arm(arm, base, args, name, encoder, data, sampler, folder)
            if figures.get("examples_per_s"):
                per_example = flops[arm_model(arm)]
                figures["tflops_per_s"] = round(figures["examples_per_s"] * per_example / 1e12, 1)
                figures["mfu"] = round(figures["examples_per_s"] * per_example / peak, 4) if peak else None
            _log(f"{name} {arm}: {json.dumps(figures)}")
            results[name] = {**head, **summary(runs), "gsamn": summary(runs, "gsamn"), "runs": runs}
            write_result(result, args.json)
        entry = results[name]
        _log(f"{name}: {json.dumps({k: v for k, v in entry.items() if k != 'runs'})}")
    return results


# ------------------------------------------------------------------------------------------------- two workers
def trace_check(folder: str, name: str, train_rows: int, workers: int, epochs: int) -> dict:
    """Each epoch's traced rows across ranks and invocations: none twice, none missing but the remainder."""
    from collections import Counter

    seen: dict[int, Counter] = {}
    for rank in range(workers):
        with open(os.path.join(folder, name, f"rank-{rank}.tsv")) as f:
            for line in f:
                epoch, _, qid, aid = line.rstrip("\n").split("\t")
                seen.setdefault(int(epoch), Counter())[(qid, aid)] += 1
    expected = train_rows // workers * workers
    per_epoch = {
        epoch: {"rows": sum(c.values()), "distinct": len(c), "twice": sum(1 for v in c.values() if v > 1)}
        for epoch, c in sorted(seen.items())
    }
    complete = len(per_epoch) == epochs and all(
        e["rows"] == expected and e["distinct"] == expected and not e["twice"] for e in per_epoch.values()
    )
    return {"expected_rows_per_epoch": expected, "epochs": per_epoch, "partition": complete}


def multi_worker(args, encoder: str, folder: str) -> dict:
    import pyarrow.parquet as pq

    from pipelines.shards import shard_paths
    from training.config import TrainConfig
    from training.trainer import run

    trace = os.environ["QA_TRACE_ROWS"]
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in shard_paths(args.data, "train")[0])
    base = TrainConfig(
        model="gsamn",
        data=args.data,
        encoder_path=encoder,
        use_gpu=args.device == "cuda",
        precision="bf16",
        batch_size=args.batch_size,
        max_len=args.max_len,
        epochs=args.mw_epochs,
        seed=0,
        storage_path=os.path.join(folder, "mw-runs"),
        name="one-worker",
        patience=0,
        log_every=50,
    )
    started = time.time()
    one = run(base)
    one_s = time.time() - started
    _log(f"multi-worker: one worker dev {json.dumps(one['metrics'])} in {one_s:.0f} s")
    two_cfg = replace(base, name="two-workers", num_workers=2, gpus_per_worker=0.5, batch_size=args.batch_size // 2)
    if not base.use_gpu:  # the CPU check: each worker a core
        two_cfg = replace(two_cfg, cpus_per_worker=1)
    rank0 = os.path.join(trace, two_cfg.name, "rank-0.tsv")
    half_epoch_lines = rows // 2 // 2  # rank 0's rows in half an epoch

    def stop_mid_epoch() -> None:  # SIGTERM once rank 0 is half-way through its first epoch: a preemption
        while True:
            time.sleep(0.2)
            if os.path.exists(rank0):
                with open(rank0) as f:
                    if sum(1 for _ in f) >= half_epoch_lines:
                        os.kill(os.getpid(), signal.SIGTERM)
                        return

    threading.Thread(target=stop_mid_epoch, daemon=True).start()
    started = time.time()
    first = run(two_cfg)
    _log(f"multi-worker: two workers stopped by {first['interrupted']} at step {first['steps']}")
    second = run(two_cfg)
    two_s = time.time() - started
    _log(f"multi-worker: resumed from step {second['resumed_from_step']}, dev {json.dumps(second['metrics'])}")
    check = trace_check(trace, two_cfg.name, rows, 2, args.mw_epochs)
    delta = abs(second["metrics"]["map"] - one["metrics"]["map"])
    return {
        "workers": 2,
        "gpus_per_worker": 0.5,
        "backend": second["backend"],
        "model": "gsamn",
        "encoder": os.path.basename(os.path.normpath(encoder)),
        "data": os.path.basename(os.path.normpath(args.data)),
        "global_batch": args.batch_size,
        "epochs": args.mw_epochs,
        "one_worker_dev_map": round(one["metrics"]["map"], 4),
        "two_workers_dev_map": round(second["metrics"]["map"], 4),
        "dev_map_difference": round(delta, 4),
        "interrupted_by": first["interrupted"],
        "stopped_at_step": first["steps"],
        "resumed_from_step": second["resumed_from_step"],
        "steps": second["steps"],
        "rows": check,
        "same_result": bool(delta <= 0.01 and check["partition"] and second["resumed_from_step"] > 0),
        "one_worker_s": round(one_s, 1),
        "two_workers_s": round(two_s, 1),
        "one_worker_examples_per_s": one.get("examples_per_s"),
        "two_workers_examples_per_s": second.get("examples_per_s"),
    }


# --------------------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    from training.config import COMPILE_MODES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a tokenised answer-selection folder (WikiQA)")
    p.add_argument(
        "--encoder",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="an encoder folder (repeatable; default minilm and mpnet-base as qa_models.encoders resolves them)",
    )
    p.add_argument("--random-weights", action="store_true", help="seeded random weights from each config.json")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--steps", default="minilm=400,mpnet-base=200", help="steps per encoder and arm, NAME=N,...")
    p.add_argument("--repeat", type=int, default=8, help="copies of the train split in the throughput data")
    p.add_argument("--parts", default="throughput,multi-worker", help="throughput, multi-worker, or both")
    p.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"the throughput arms, in order (default {','.join(ARMS)}; also {', '.join(OPTIONAL_ARMS)})",
    )
    p.add_argument(
        "--compile",
        default="reduce-overhead",
        choices=list(COMPILE_MODES),
        help="torch.compile mode of ours and plain (jobs/train.py --compile), not of the -eager arms",
    )
    p.add_argument("--mw-encoder", default=None, help="the multi-worker run's encoder folder (default: the first)")
    p.add_argument("--mw-epochs", type=int, default=2)
    p.add_argument(
        "--profile",
        action="store_true",
        help="torch.profiler tables of 20 steps of each plain and ours arm (QA_PROFILE), in JSON-profiles/",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a small check of the script")
    p.add_argument("--json", default=os.path.join(REPO, "docs", "bench", "training-gpu.json"))
    args = p.parse_args(argv)
    check_result_file(p, args.json, "bf16_peak_tflops")
    unknown = [arm for arm in args.arms.split(",") if arm not in ARMS + OPTIONAL_ARMS]
    if unknown:
        p.error(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS + OPTIONAL_ARMS)})")
    return args


def profiles_folder(args) -> str:
    """Where --profile's tables go: beside --json, in a folder named after it."""
    return os.path.splitext(args.json)[0] + "-profiles"


def start_ray(trace: str | None = None, profile: str | None = None) -> None:
    """A private local Ray (every core, the GPU); `trace`: QA_TRACE_ROWS for its workers, `profile`: QA_PROFILE,
    which they inherit from the environment at start (tracing writes a line per row, so the throughput runs go
    without it)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    for variable, value in (("QA_TRACE_ROWS", trace), ("QA_PROFILE", profile)):
        if value:
            os.environ[variable] = value
        else:
            os.environ.pop(variable, None)
    from runtime.ray_env import init_local_ray

    init_local_ray(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False


def main(argv=None) -> int:
    args = parse_args(argv)
    import ray
    import torch
    import transformers

    from qa_models.encoders import resolve_encoder

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/training_gpu.py: no CUDA device here (--device cpu runs it small, as a check)")
    encoders = dict(item.split("=", 1) for item in args.encoder) or {
        name: resolve_encoder(name) for name in ("minilm", "mpnet-base")
    }
    parts = set(args.parts.split(","))
    folder = tempfile.mkdtemp(prefix="bench-training-gpu-")
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    result: dict = {
        "device": device,
        "bf16_peak_tflops": (bf16_peak(device) or 0) / 1e12 or None,
        "software": {"torch": torch.__version__, "transformers": transformers.__version__, "ray": ray.__version__},
        "cpus": os.cpu_count(),
        "batch_size": args.batch_size,
        "max_len": args.max_len,
        "precision": "bf16",
        "data": os.path.basename(os.path.normpath(args.data)) + f" train x{args.repeat}",
    }
    with BusySampler() as sampler:
        if sampler.nvml is None:
            result["gpu_busy_note"] = sampler.reason
        if "throughput" in parts:
            start_ray(profile=os.path.abspath(profiles_folder(args)) if args.profile else None)
            result["encoders"] = throughput(args, encoders, sampler, folder, result)
        if "multi-worker" in parts:
            start_ray(trace=os.path.join(folder, "trace"))
            result["multi_worker"] = multi_worker(args, args.mw_encoder or next(iter(encoders.values())), folder)
    ray.shutdown()
    write_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Batch scoring: jobs/score.py (Ray Data, a pool of Ranker actors) against the plain loop it replaces, per core,
and the job's memory as its input grows.

    python bench/scoring.py [--checkpoint RUN_OR_CHECKPOINT] [--data TOKENISED_DIR] [--split train]
        [--cores 2] [--repeats 1,4,16] [--job-batch 2048] [--json docs/bench/scoring.json]

Over the same (question, answer) pairs (a tokenised answer-selection split: WikiQA from ../shared/data by default,
tokenised into a temporary folder first), with the same checkpoint (default: GSAMN at its paper's width trained
for a few steps under Ray Train into a temporary folder; its weights do not change its speed):
- plain-rank: one process, torch on --cores threads, `ranker.rank(question, answers)` question by question: what
  a user writes without the job;
- plain-score: the same process, `ranker.score` over all the pairs at once (sorted by length across all of them,
  scored in the ranker's batches);
- plain-chunks: `ranker.score` over consecutive chunks of --job-batch pairs in file order: the actors' work (each
  call sorts only its own rows), in one process without Ray; the job against it is Ray's cost alone;
  each plain arm with a ranker of its own, whose tokenizer has seen none of the pairs;
- job-R: `python jobs/score.py --num-cpus C --actors C` (one CPU and one torch thread per actor) in a subprocess,
  over a folder holding the split's file R times (R x the pairs; every copy after the first with the copy's number
  appended to each text, so that no tokenisation is reused across copies): its wall time (Ray's start included), its own
  rows/s (the actors' start and the checkpoint's loading included, Ray's start not), its steady rows/s (from the
  first output file written to the last: R >= 2), and its peak memory: the PSS of the job's process tree
  (driver, Ray's processes, actors; shared pages divided among the processes that map them), sampled every
  0.2 s.
Per core is pairs/s over the cores an arm used. The ratios are the job's rows/s per core at the largest R over each
plain arm's; memory is flat when the peak at the largest R stays near the peak at R=1 while the input grows R-fold.

The last line is one JSON object (also written to --json).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # bench/tokenize.py would shadow the standard library's tokenize
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse
import json
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time

from bench.report import check_result_file, write_result
from bench.training import tokenised_wikiqa  # WikiQA tokenised into a temporary folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_BATCH = 2048  # rows per actor call: jobs/score.py's default


def _log(message: str) -> None:
    print(f"[bench-scoring] {message}", file=sys.stderr, flush=True)


def trained_checkpoint(data: str, folder: str, cores: int) -> str:
    """GSAMN at its paper's width, a few steps under Ray Train: a real checkpoint of jobs/train.py's loop."""
    import ray

    from runtime.ray_env import init_local_ray
    from training.config import TrainConfig
    from training.trainer import run

    init_local_ray(num_cpus=cores)
    try:
        cfg = TrainConfig(model="gsamn", data=data, storage_path=folder, name="gsamn", max_steps=4, seed=0)
        run(cfg)
    finally:
        ray.shutdown()
    return os.path.join(folder, "gsamn")


def pairs_of(data: str, split: str) -> tuple[list[str], list[tuple[str, str]], str]:
    """The split's question ids and (question, answer) pairs, in file order, and the split's one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.shards import shard_paths

    paths, _ = shard_paths(data, split)
    table = pa.concat_tables(pq.read_table(p, columns=["qid", "question", "answer"]) for p in paths)
    single = os.path.join(tempfile.mkdtemp(prefix="bench-scoring-"), f"{split}.parquet")
    pq.write_table(pa.concat_tables(pq.read_table(p) for p in paths), single)
    return table["qid"].to_pylist(), list(zip(table["question"].to_pylist(), table["answer"].to_pylist())), single


def plain_arms(checkpoint: str, qids: list[str], pairs: list[tuple[str, str]], cores: int, chunk: int) -> dict:
    import torch

    from inference import Ranker

    torch.set_num_threads(cores)
    questions: dict[str, list[int]] = {}
    for i, qid in enumerate(qids):
        questions.setdefault(qid, []).append(i)

    def fresh_ranker():
        # A ranker of its own for each arm: its tokenizer caches the texts it has seen, and an arm that followed
        # another over the same pairs would tokenise nothing. Warmed up on texts outside the data (first-call
        # allocations out of the timing, nothing of the pairs cached).
        ranker = Ranker.from_checkpoint(checkpoint, device="cpu")
        ranker.score([(f"warm-up question {i}", f"warm-up answer number {i}") for i in range(256)])
        return ranker

    ranker = fresh_ranker()
    started = time.perf_counter()
    for rows in questions.values():
        ranker.rank(pairs[rows[0]][0], [pairs[i][1] for i in rows])
    rank_s = time.perf_counter() - started
    ranker = fresh_ranker()
    started = time.perf_counter()
    ranker.score(pairs)
    score_s = time.perf_counter() - started
    ranker = fresh_ranker()
    started = time.perf_counter()
    for start in range(0, len(pairs), chunk):
        ranker.score(pairs[start : start + chunk])
    chunks_s = time.perf_counter() - started
    return {
        "plain-rank": _rates(len(pairs), rank_s, cores, questions=len(questions)),
        "plain-score": _rates(len(pairs), score_s, cores),
        "plain-chunks": _rates(len(pairs), chunks_s, cores, chunk=chunk),
    }


def _rates(rows: int, seconds: float, cores: int, **extra) -> dict:
    return dict(
        extra,
        rows=rows,
        seconds=round(seconds, 2),
        pairs_per_s=round(rows / seconds, 1),
        pairs_per_s_per_core=round(rows / seconds / cores, 1),
        cores=cores,
    )


class TreeMemory:
    """The peak PSS (MB) of a process and all its descendants, sampled in a thread every `interval` seconds, and
    the CPU seconds each of them had used when last seen, by role (`cpu_by_role`): where the cores' time went."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid, self.interval, self.peak, self.processes = pid, interval, 0.0, 0
        self.cpu: dict[int, tuple[str, float]] = {}  # pid: (role, user + system seconds when last sampled)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for process in tree:
                try:
                    total += process.memory_full_info().pss
                    times = process.cpu_times()  # the role as last seen: a Ray worker takes its title as it starts
                    self.cpu[process.pid] = (process_role(process, self.pid), times.user + times.system)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            if total / 2**20 > self.peak:
                self.peak, self.processes = total / 2**20, len(tree)
            self._stop.wait(self.interval)


def distinct_copy(single: str, copy: int, path: str) -> None:
    """The split's file as the job's input file `copy`: the first as it is, every other one with its number
    appended to each question and answer (one more token), so that a larger input is new text, as a larger corpus
    would be: the actors' tokenizer caches help within a copy (a question beside each of its answers), as in the
    plain arms, never across copies."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(single)
    for column in ("question", "answer") if copy else ():
        field = table.schema.field(column)
        marked = pc.binary_join_element_wise(table[column], pa.scalar(f"copy{copy}"), " ").cast(field.type)
        table = table.set_column(table.schema.get_field_index(column), field, marked)
    pq.write_table(table, path)  # every copy written alike: one schema, so the job scores them in one execution


def process_role(process, driver: int) -> str:
    """What a process of the job's tree does: the driver, a Ray worker by its title (ray::NAME: the scoring actors,
    the read tasks, idle workers), or a Ray daemon by its executable's name."""
    if process.pid == driver:
        return "driver"
    title = " ".join(process.cmdline()[:1])
    if title.startswith("ray::"):
        name = title.removeprefix("ray::").split("(")[0].split(".")[0]
        return f"ray::{name}" if name else "ray::worker"
    return process.name()


def cpu_shares(cpu: dict[int, tuple[str, float]]) -> dict:
    """CPU seconds by role, largest first, with each role's share of the total."""
    by_role: dict[str, float] = {}
    for role, seconds in cpu.values():
        by_role[role] = by_role.get(role, 0.0) + seconds
    total = sum(by_role.values()) or 1.0
    return {
        role: {"cpu_s": round(seconds, 1), "share": round(seconds / total, 3)}
        for role, seconds in sorted(by_role.items(), key=lambda item: -item[1])
    }


def job_arm(checkpoint: str, single: str, rows: int, repeat: int, cores: int, folder: str, batch: int) -> dict:
    inputs = os.path.join(folder, f"input-x{repeat}")
    os.makedirs(inputs)
    for copy in range(repeat):
        distinct_copy(single, copy, os.path.join(inputs, f"copy-{copy:03d}.parquet"))
    output = os.path.join(folder, f"scored-x{repeat}")
    command = [
        sys.executable,
        os.path.join(REPO, "jobs", "score.py"),
        "--checkpoint",
        checkpoint,
        "--input",
        inputs,
        "--output",
        output,
        "--num-cpus",
        str(cores),
        "--actors",
        str(cores),
        "--batch-size",
        str(batch),
    ]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress: list[tuple[float, int]] = []  # (seconds since the start, rows scored) at each file written
    lines: list[str] = []

    def read_progress() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            found = re.search(r"^\[score\] .*\(([\d,]+) rows scored", line)
            if found:
                progress.append((time.perf_counter() - started, int(found.group(1).replace(",", ""))))

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    with TreeMemory(process.pid) as memory:
        out = process.stdout.read() if process.stdout else ""
        process.wait()
    reader.join()
    wall = time.perf_counter() - started
    if process.returncode:
        tail = "".join(lines)[-3000:]
        raise SystemExit(f"{' '.join(command)} failed with exit code {process.returncode}:\n{tail}")
    summary = json.loads(out.strip().splitlines()[-1])
    if summary["rows"] != rows * repeat:
        raise SystemExit(f"the job scored {summary['rows']:,} rows of {rows * repeat:,}")
    input_mb = sum(os.path.getsize(os.path.join(inputs, f)) for f in os.listdir(inputs)) / 2**20
    shutil.rmtree(output)
    shutil.rmtree(inputs)
    steady = {}
    if len(progress) >= 2 and progress[-1][0] > progress[0][0]:
        # between the first file written and the last: the actors started and loaded, Ray Data streaming
        scored, seconds = progress[-1][1] - progress[0][1], progress[-1][0] - progress[0][0]
        steady = {
            "steady_pairs_per_s": round(scored / seconds, 1),
            "steady_pairs_per_s_per_core": round(scored / seconds / cores, 1),
            "first_file_s": round(progress[0][0], 1),
        }
    return dict(
        _rates(summary["rows"], summary["seconds"], cores, repeat=repeat),
        **steady,
        wall_s=round(wall, 1),
        pairs_per_s_wall=round(summary["rows"] / wall, 1),
        input_mb=round(input_mb, 1),
        peak_pss_mb=round(memory.peak, 0),
        processes_at_peak=memory.processes,
        cpu_by_role=cpu_shares(memory.cpu),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="run or checkpoint folder (default: a GSAMN trained briefly)")
    p.add_argument("--data", default=None, help="tokenised answer-selection folder (default: WikiQA, tokenised)")
    p.add_argument("--split", default="train", help="the split whose pairs are scored (default train)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores each arm uses (default all)")
    p.add_argument("--repeats", default="1,4,16", help="the job's input: the split's file this many times")
    p.add_argument("--job-batch", type=int, default=JOB_BATCH, help="the job's --batch-size: rows per actor call")
    p.add_argument("--json", default=os.path.join(REPO, "docs", "bench", "scoring.json"))
    args = p.parse_args(argv)
    check_result_file(p, args.json, "job_batch")
    repeats = sorted({int(r) for r in args.repeats.split(",")})
    with tempfile.TemporaryDirectory(prefix="bench-scoring-") as folder:
        data = args.data or tokenised_wikiqa(folder)
        checkpoint = args.checkpoint or trained_checkpoint(data, os.path.join(folder, "runs"), args.cores)
        qids, pairs, single = pairs_of(data, args.split)
        _log(f"{len(pairs):,} pairs of {len(set(qids)):,} questions; checkpoint {checkpoint}")
        result: dict = {
            "machine": f"{args.cores} cores of {os.cpu_count()} ({platform.machine()}), no GPU",
            "checkpoint": os.path.basename(os.path.normpath(checkpoint))
            if args.checkpoint
            else "gsamn (paper width, 4 steps)",
            "data": os.path.relpath(args.data, REPO) if args.data else "wikiqa",
            "split": args.split,
            "pairs": len(pairs),
            "job_batch": args.job_batch,
        }
        result.update(plain_arms(checkpoint, qids, pairs, args.cores, args.job_batch))
        for name in ("plain-rank", "plain-score", "plain-chunks"):
            _log(f"{name}: {result[name]['pairs_per_s']:,} pairs/s ({result[name]['pairs_per_s_per_core']:,} a core)")
        result["job"] = []
        for repeat in repeats:
            arm = job_arm(checkpoint, single, len(pairs), repeat, args.cores, folder, args.job_batch)
            result["job"].append(arm)
            _log(
                f"job x{repeat}: {arm['rows']:,} rows, {arm['pairs_per_s']:,} pairs/s ({arm['pairs_per_s_per_core']:,} "
                f"a core; steady {arm.get('steady_pairs_per_s_per_core', '-')}), {arm['wall_s']} s wall, "
                f"peak PSS {arm['peak_pss_mb']:,.0f} MB"
            )
        shutil.rmtree(os.path.dirname(single))
    largest, smallest = result["job"][-1], result["job"][0]
    rank, batched = result["plain-rank"]["pairs_per_s_per_core"], result["plain-score"]["pairs_per_s_per_core"]
    chunks = result["plain-chunks"]["pairs_per_s_per_core"]
    result["ratios"] = {
        "job_vs_plain_rank_per_core": round(largest["pairs_per_s_per_core"] / rank, 2),
        "job_vs_plain_score_per_core": round(largest["pairs_per_s_per_core"] / batched, 2),
        "job_steady_vs_plain_rank_per_core": round(largest.get("steady_pairs_per_s_per_core", 0) / rank, 2),
        "job_steady_vs_plain_score_per_core": round(largest.get("steady_pairs_per_s_per_core", 0) / batched, 2),
        "job_steady_vs_plain_chunks_per_core": round(largest.get("steady_pairs_per_s_per_core", 0) / chunks, 2),
        "peak_memory_largest_vs_smallest_input": round(largest["peak_pss_mb"] / smallest["peak_pss_mb"], 2),
        "input_largest_vs_smallest": round(largest["rows"] / smallest["rows"], 1),
    }
    write_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

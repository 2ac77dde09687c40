"""Batch scoring: a trained answer-selection checkpoint scores every (question, answer) row of Parquet files on
Ray Data, a pool of actors each holding the model (`Ranker`), and writes the input rows plus `score` (or the
column --score-column names: a StackExchangeQA shard's own `score` is the answer's votes).

One output file per input file (`part-NNNNN.parquet`, in the inputs' sorted order; each row keeps its file's row
order), each written whole (a temporary name, then a rename) into a staging folder beside --output
(`OUTPUT.partial-score`) that records what it is scoring (`plan.json`: the checkpoint's sha256, the inputs, their
sizes and the columns). A run that stops part-way leaves its finished files there, and the same command run again
scores only the files it lacks, so no row is scored twice into the output; a different checkpoint or input starts
the staging folder over. The last step writes `manifest.json` (rows, files, the checkpoint) and renames the staging
folder to --output, replacing an earlier output of this job only then.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from pipelines.atomic import STAGING_MARKER, check_output, real_path, swap_into_place, write_marker
from runtime.checks import MissingInput, UsageError, at_least, integer_at_least, one_of

JOB = "score"
PLAN_FILE, MANIFEST_FILE = "plan.json", "manifest.json"


@dataclass
class ScoreConfig:
    checkpoint: str
    input: str
    output: str
    question_column: str = "question"
    answer_column: str = "answer"
    score_column: str = "score"  # the column the model's scores are written to, beside the input's
    which: str = "best"
    # rows per actor call: the ranker sorts them by length before batching, so a larger call pads less (2048 against
    # 256: 1.5x the job's pairs/s, bench/scoring.py)
    batch_size: int = 2048
    actors: int | None = None  # None: one per CPU (or per GPU share) the cluster has
    cpus_per_actor: float = 1.0
    num_gpus_per_actor: float = 0.0

    def __post_init__(self):
        one_of("--which", self.which, ("best", "latest"))
        integer_at_least("--batch-size", self.batch_size, 1)
        integer_at_least("--actors", self.actors, 1, allow_none=True)
        at_least("--cpus-per-actor", self.cpus_per_actor, 0)  # a finite number: nan and inf passed before
        if self.cpus_per_actor == 0:
            raise UsageError(f"--cpus-per-actor must be above 0, got {self.cpus_per_actor}")
        at_least("--num-gpus-per-actor", self.num_gpus_per_actor, 0)
        if self.question_column == self.answer_column:
            raise UsageError(f"--question-column and --answer-column are both {self.question_column!r}")
        if not self.score_column.strip():
            raise UsageError("--score-column: empty; name the column the scores go to")
        if self.score_column in (self.question_column, self.answer_column):
            raise UsageError(f"--score-column {self.score_column}: the text column it would replace")

    def check_inputs(self) -> tuple[str, list[str]]:
        """What the run would refuse first: the checkpoint (resolved from a run folder; an answer-selection
        model's), the input files (Parquet, each with both text columns, no --score-column), and an --output that
        would replace an input or a folder of something else. Returns (checkpoint, input files)."""
        import pyarrow.parquet as pq

        from qa_models import MODELS
        from training.checkpoints import checkpoint_summary, resolve_checkpoint

        if "://" not in self.checkpoint and not os.path.exists(self.checkpoint):
            raise MissingInput(f"--checkpoint {self.checkpoint}: no such checkpoint or run folder")
        checkpoint = resolve_checkpoint(self.checkpoint, self.which)
        model = checkpoint_summary(checkpoint).get("train", {}).get("model")
        if model in MODELS and getattr(MODELS[model], "inputs", None) == "passages":
            raise UsageError(f"--checkpoint {checkpoint}: a {model} checkpoint, a reading-comprehension model")
        files = input_files(self.input)
        for path in files:
            try:
                names = pq.read_schema(path).names
            except Exception as error:  # not Parquet, or damaged: name the file
                raise UsageError(f"--input {path}: not a readable Parquet file ({error})") from None
            missing = [c for c in (self.question_column, self.answer_column) if c not in names]
            if missing:
                raise UsageError(f"--input {path}: no column {', '.join(missing)} (it has {', '.join(names)})")
            if self.score_column in names:
                raise UsageError(
                    f"--input {path}: already has a column {self.score_column} (a StackExchangeQA shard's score is "
                    "the answer's votes), which the output would replace; name another with --score-column"
                )
        check_output(self.output, JOB, inputs=[self.input, checkpoint])
        return checkpoint, files


def input_files(path: str) -> list[str]:
    """A Parquet file, or every *.parquet under a folder, sorted."""
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    if not os.path.isdir(path):
        raise MissingInput(f"--input {path}: no such file or folder")
    files = sorted(glob.glob(os.path.join(os.path.abspath(path), "**", "*.parquet"), recursive=True))
    if not files:
        raise MissingInput(f"--input {path}: no .parquet file in it")
    return files


def staging_folder(output: str) -> str:
    return os.path.abspath(output).rstrip(os.sep) + ".partial-" + JOB


def part_name(number: int) -> str:
    return f"part-{number:05d}.parquet"


def plan_of(cfg: ScoreConfig, checkpoint: str, files: list[str]) -> dict:
    from pipelines.shards import sha256_file
    from training.checkpoints import STATE_FILE

    return {
        "checkpoint": checkpoint,
        "checkpoint_sha256": sha256_file(os.path.join(checkpoint, STATE_FILE)) if "://" not in checkpoint else None,
        "inputs": [{"path": p, "bytes": os.path.getsize(p), "mtime": os.path.getmtime(p)} for p in files],
        "columns": [cfg.question_column, cfg.answer_column, cfg.score_column],
    }


def prepared_staging(cfg: ScoreConfig, plan: dict) -> tuple[str, set[int]]:
    """The staging folder, and the input files (by number) already scored there under the same plan; a staging
    folder of another plan (another checkpoint or input) is started over."""
    staging = staging_folder(cfg.output)
    try:
        with open(os.path.join(staging, PLAN_FILE)) as f:
            same = json.load(f) == json.loads(json.dumps(plan))
    except (OSError, ValueError):
        same = False
    if not same:
        if os.path.exists(os.path.join(staging, STAGING_MARKER)):
            shutil.rmtree(staging)
        elif os.path.exists(staging):
            raise UsageError(f"{staging}: exists and is not a staging folder of {JOB}; move it away")
        os.makedirs(staging)
        open(os.path.join(staging, STAGING_MARKER), "w").close()
        _write_json(os.path.join(staging, PLAN_FILE), plan)
    done = {n for n in range(len(plan["inputs"])) if os.path.exists(os.path.join(staging, part_name(n)))}
    return staging, done


def same_schema_runs(files: list[str], numbers: list[int]) -> list[list[int]]:
    """`numbers` (files by number, in order) cut into runs of consecutive files with one Arrow schema: a run is
    scored in one Ray Data execution, whose batches may hold rows of two files."""
    import pyarrow.parquet as pq

    runs: list[list[int]] = []
    last = None
    for number in numbers:
        schema = pq.read_schema(files[number]).remove_metadata()
        if runs and schema.equals(last):
            runs[-1].append(number)
        else:
            runs.append([number])
        last = schema
    return runs


class _Parts:
    """Writes the ordered scored rows of a run of input files into their part files: each file takes the next
    `counts[i]` rows, in a temporary file renamed to its part name once whole (a file without rows gets an empty
    part with its columns and `column`, the scores')."""

    def __init__(
        self,
        staging: str,
        paths: list[str],
        numbers: list[int],
        counts: list[int],
        log,
        started: float,
        column: str = "score",
    ):
        self.staging, self.paths, self.numbers, self.counts, self.column = staging, paths, numbers, counts, column
        self.log, self.started = log, started
        self.current, self.left, self.temporary, self.rows = -1, 0, "", 0
        self.writer: Any = None  # a pyarrow ParquetWriter while a file is being written
        self._next()

    def _next(self) -> None:
        """Closes the finished file, if any, and opens the next that has rows (empty ones written on the way)."""
        import pyarrow.parquet as pq

        if self.current >= 0:
            self._close()
        self.current += 1
        while self.current < len(self.numbers) and self.counts[self.current] == 0:
            temporary = self._temporary()
            empty = pq.read_table(self.paths[self.current]).append_column(self.column, _empty_scores())
            pq.write_table(empty, temporary)
            self._rename(temporary)
            self.current += 1
        if self.current < len(self.numbers):
            self.left, self.writer, self.temporary = self.counts[self.current], None, self._temporary()

    def _temporary(self) -> str:
        return os.path.join(self.staging, f"{part_name(self.numbers[self.current])}.tmp-{uuid.uuid4().hex[:8]}")

    def write(self, batch) -> None:
        import pyarrow.parquet as pq

        while batch.num_rows:
            if self.current >= len(self.numbers):
                raise RuntimeError(f"{batch.num_rows} scored rows more than the input files hold")
            take = min(self.left, batch.num_rows)
            piece, batch = batch.slice(0, take), batch.slice(take)
            if self.writer is None:
                self.writer = pq.ParquetWriter(self.temporary, piece.schema)
            self.writer.write_table(piece)
            self.left -= take
            self.rows += take
            if self.left == 0:
                self._next()

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self._rename(self.temporary)

    def _rename(self, temporary: str) -> None:
        number = self.numbers[self.current]
        os.replace(temporary, os.path.join(self.staging, part_name(number)))
        rate = self.rows / max(time.time() - self.started, 1e-9)
        self.log(
            f"[score] {self.paths[self.current]}: {part_name(number)} ({self.rows:,} rows scored, {rate:,.0f} rows/s)"
        )

    def finish(self) -> None:
        """Every file whole: a run that delivered fewer rows than its files hold is an error, not a short file."""
        if self.current < len(self.numbers):
            if self.writer is not None:
                self.writer.close()
                os.remove(self.temporary)
            raise RuntimeError(
                f"{self.paths[self.current]}: {self.left} of its {self.counts[self.current]} rows were not scored"
            )


class ScoreBatch:
    """A Ray Data actor: the checkpoint's Ranker, loaded once, scoring a batch of rows."""

    def __init__(self, checkpoint: str, question_column: str, answer_column: str, device: str, score_column: str):
        from inference.ranker import Ranker

        self.ranker = Ranker.from_checkpoint(checkpoint, device=device)
        self.columns = (question_column, answer_column)
        self.score_column = score_column

    def __call__(self, batch):
        import pyarrow as pa

        questions = batch.column(self.columns[0]).to_pylist()
        answers = batch.column(self.columns[1]).to_pylist()
        scores = self.ranker.score([(q or "", a or "") for q, a in zip(questions, answers)])
        return batch.append_column(self.score_column, pa.array(scores, pa.float32()))


def score(cfg: ScoreConfig, log=print) -> dict:
    """Score every input row not yet scored; the job's summary."""
    import pyarrow.parquet as pq
    import ray

    from training.rows import read_pieces

    checkpoint, files = cfg.check_inputs()
    plan = plan_of(cfg, checkpoint, files)
    staging, done = prepared_staging(cfg, plan)
    pending = [n for n in range(len(files)) if n not in done]
    if done:
        log(f"[score] {len(done)} of {len(files)} files scored by an earlier run: scoring the other {len(pending)}")
    started, rows = time.time(), 0
    if pending:
        resources = ray.cluster_resources()
        if cfg.num_gpus_per_actor:
            share = resources.get("GPU", 0) / cfg.num_gpus_per_actor
        else:
            share = resources.get("CPU", 1) / cfg.cpus_per_actor
        actors = cfg.actors or max(1, int(share))
        device = "cuda" if cfg.num_gpus_per_actor else "cpu"
        for run in same_schema_runs(files, pending):
            # One execution for the run of files, so the actors start and load the checkpoint once, not per file:
            # their row groups in order, read by tasks that reserve no CPU (the actors hold the cores); the rows come
            # back in order, so each file's output is the next rows_of(file) rows, written whole, then renamed.
            counts = [pq.ParquetFile(files[n]).metadata.num_rows for n in run]
            pieces = []
            for number in run:
                metadata = pq.ParquetFile(files[number]).metadata
                pieces += [
                    (files[number], group, 0, metadata.row_group(group).num_rows)
                    for group in range(metadata.num_row_groups)
                ]
            parts = _Parts(staging, [files[n] for n in run], run, counts, log, started, cfg.score_column)
            if pieces and sum(counts):
                scored = read_pieces(pieces, read_cpus=0.0).map_batches(
                    ScoreBatch,
                    fn_constructor_args=(checkpoint, cfg.question_column, cfg.answer_column, device, cfg.score_column),
                    batch_size=cfg.batch_size,
                    batch_format="pyarrow",
                    compute=ray.data.ActorPoolStrategy(size=actors),
                    num_cpus=cfg.cpus_per_actor,
                    num_gpus=cfg.num_gpus_per_actor or None,
                )
                for batch in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
                    parts.write(batch)
            parts.finish()
            rows += parts.rows
    total = sum(pq.ParquetFile(os.path.join(staging, part_name(n))).metadata.num_rows for n in range(len(files)))
    manifest = {
        "job": JOB,
        "config": asdict(cfg),
        "checkpoint": checkpoint,
        "checkpoint_sha256": plan["checkpoint_sha256"],
        "rows": total,
        "files": [{"path": part_name(n), "input": files[n]} for n in range(len(files))],
    }
    _write_json(os.path.join(staging, MANIFEST_FILE), manifest)
    os.remove(os.path.join(staging, STAGING_MARKER))
    write_marker(staging, JOB)
    # a link to a folder is kept: the folder it names is replaced
    swap_into_place(staging, real_path(cfg.output) if os.path.exists(cfg.output) else os.path.abspath(cfg.output))
    seconds = time.time() - started
    return {
        "output": cfg.output,
        "rows": total,
        "rows_scored_now": rows,
        "files": len(files),
        "seconds": round(seconds, 1),
        "rows_per_s": round(rows / seconds, 1) if rows and seconds else None,
    }


def _empty_scores():
    import pyarrow as pa

    return pa.array([], pa.float32())


def _write_json(path: str, value: dict) -> None:
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(temporary, "w") as f:
        json.dump(value, f, indent=1)
    os.replace(temporary, path)

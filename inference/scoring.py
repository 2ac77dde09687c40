"""Batch scoring: a trained answer-selection checkpoint scores every (question, answer) row of Parquet files on
Ray Data, a pool of actors each holding the model (`Ranker`), and writes the input rows plus `score` (or the
column --score-column names: a StackExchangeQA shard's own `score` is the answer's votes).

One output file per input file, at the input's path under the --input folder (a build's `test/part-00000.parquet`
is scored into `OUTPUT/test/part-00000.parquet`; a single input file keeps its name), each row in its file's row
order; a StackExchangeQA build's folder gives its split shards, not its attribution rows. Each file is written
whole (a temporary name, then a rename) into a staging folder beside --output (`OUTPUT.partial-score`) that
records what it is scoring (`plan.json`: the checkpoint's sha256, the inputs, their sizes, the columns and the
output names). A run that stops part-way leaves its finished files there, and the same command run again scores
only the files it lacks, so no row is scored twice into the output; a different checkpoint or input starts the
staging folder over. The last step writes `manifest.json` (rows, files, the checkpoint) and renames the staging
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

from pipelines.atomic import STAGING_MARKER, check_output, output_job, real_path, swap_into_place, write_marker
from runtime.checks import MissingInput, UsageError, at_least, integer_at_least, one_of

JOB = "score"
BUILD_JOB = "build_stackexchangeqa"
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

    def check_inputs(self) -> tuple[str, str, list[str]]:
        """What the run would refuse first: the checkpoint (resolved from a run folder; an answer-selection
        model's), the input files (Parquet, each with both text columns, no --score-column), and an --output that
        would replace an input or a folder of something else. Returns (checkpoint, why it was chosen, input
        files)."""
        import pyarrow.parquet as pq

        from qa_models import MODELS
        from training.checkpoints import checkpoint_summary, choose_checkpoint

        if "://" not in self.checkpoint and not os.path.exists(self.checkpoint):
            raise MissingInput(f"--checkpoint {self.checkpoint}: no such checkpoint or run folder")
        checkpoint, chosen = choose_checkpoint(self.checkpoint, self.which)
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
        return checkpoint, chosen, files


def input_files(path: str) -> list[str]:
    """A Parquet file, or every *.parquet under a folder, sorted; of a jobs/build_stackexchangeqa.py output, the
    shards of its splits (its attribution rows, authors and links, are no pairs to score)."""
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    if not os.path.isdir(path):
        raise MissingInput(f"--input {path}: no such file or folder")
    root = os.path.abspath(path)
    if output_job(root) == BUILD_JOB:
        from pipelines.readers import splits_at

        folders = [os.path.join(root, split) for split in splits_at("stackexchangeqa", root)]
    else:
        folders = [root]
    files = sorted(f for folder in folders for f in glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True))
    if not files:
        raise MissingInput(f"--input {path}: no .parquet file in it")
    return files


def output_names(path: str, files: list[str]) -> list[str]:
    """Where each input file's scored rows go, relative to --output: its path under the --input folder (splits
    stay apart, named as in the input), or a single input file's own name."""
    if os.path.isfile(path):
        return [os.path.basename(f) for f in files]
    return [os.path.relpath(f, os.path.abspath(path)) for f in files]


def staging_folder(output: str) -> str:
    return os.path.abspath(output).rstrip(os.sep) + ".partial-" + JOB


def plan_of(cfg: ScoreConfig, checkpoint: str, files: list[str]) -> dict:
    from pipelines.shards import sha256_file
    from training.checkpoints import STATE_FILE

    return {
        "checkpoint": checkpoint,
        "checkpoint_sha256": sha256_file(os.path.join(checkpoint, STATE_FILE)) if "://" not in checkpoint else None,
        "inputs": [{"path": p, "bytes": os.path.getsize(p), "mtime": os.path.getmtime(p)} for p in files],
        "outputs": output_names(cfg.input, files),
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
    done = {n for n, name in enumerate(plan["outputs"]) if os.path.exists(os.path.join(staging, name))}
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
    """Writes the ordered scored rows of a run of input files into their output files (`names`, relative to the
    staging folder): each file takes the next `counts[i]` rows, in a temporary file renamed to its name once whole (a
    file without rows gets an empty one with its columns and `column`, the scores')."""

    def __init__(
        self,
        staging: str,
        paths: list[str],
        names: list[str],
        counts: list[int],
        log,
        started: float,
        column: str = "score",
    ):
        self.staging, self.paths, self.names, self.counts, self.column = staging, paths, names, counts, column
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
        while self.current < len(self.names) and self.counts[self.current] == 0:
            temporary = self._temporary()
            empty = pq.read_table(self.paths[self.current]).append_column(self.column, _empty_scores())
            pq.write_table(empty, temporary)
            self._rename(temporary)
            self.current += 1
        if self.current < len(self.names):
            self.left, self.writer, self.temporary = self.counts[self.current], None, self._temporary()

    def _temporary(self) -> str:
        path = os.path.join(self.staging, self.names[self.current])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return f"{path}.tmp-{uuid.uuid4().hex[:8]}"

    def write(self, batch) -> None:
        import pyarrow.parquet as pq

        while batch.num_rows:
            if self.current >= len(self.names):
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
        name = self.names[self.current]
        os.replace(temporary, os.path.join(self.staging, name))
        rate = self.rows / max(time.time() - self.started, 1e-9)
        shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.1f}"  # a first small file came out at "0 rows/s"
        self.log(f"[score] {self.paths[self.current]}: {name} ({self.rows:,} rows scored, {shown} rows/s)")

    def finish(self) -> None:
        """Every file whole: a run that delivered fewer rows than its files hold is an error, not a short file."""
        if self.current < len(self.names):
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

    checkpoint, chosen, files = cfg.check_inputs()
    log(f"[score] {checkpoint}: {chosen}")
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
            names = [plan["outputs"][n] for n in run]
            parts = _Parts(staging, [files[n] for n in run], names, counts, log, started, cfg.score_column)
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
    total = sum(pq.ParquetFile(os.path.join(staging, name)).metadata.num_rows for name in plan["outputs"])
    manifest = {
        "job": JOB,
        "config": asdict(cfg),
        "checkpoint": checkpoint,
        "chosen": chosen,
        "checkpoint_sha256": plan["checkpoint_sha256"],
        "rows": total,
        "files": [{"path": name, "input": path} for name, path in zip(plan["outputs"], files)],
    }
    _write_json(os.path.join(staging, MANIFEST_FILE), manifest)
    os.remove(os.path.join(staging, STAGING_MARKER))
    write_marker(staging, JOB)
    # a link to a folder is kept: the folder it names is replaced
    swap_into_place(staging, real_path(cfg.output) if os.path.exists(cfg.output) else os.path.abspath(cfg.output))
    seconds = time.time() - started
    return {
        "output": cfg.output,
        "checkpoint": checkpoint,
        "chosen": chosen,
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

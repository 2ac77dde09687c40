"""Score a Parquet corpus of question-answer pairs with a trained answer-selection checkpoint, on Ray Data.

    python jobs/score.py --checkpoint RUN_DIR_OR_CHECKPOINT --input PARQUET_OR_DIR --output DIR
        [--question-column question] [--answer-column answer] [--score-column score] [--actors N]
        [--cpus-per-actor 1] [--num-gpus-per-actor 0] [--batch-size 2048] [--which best|latest]

A pool of actors, each holding the checkpoint's model (`inference.Ranker`: the run's tokenizer or vocabulary,
batched and scored as jobs/evaluate.py scores a split), scores every row of the input (a StackExchangeQA build's
folder, whose split shards it reads, a tokenised folder, or any Parquet with the two text columns);
--num-gpus-per-actor puts each actor on a GPU share of the cluster. DIR gets the input rows plus `score` (float32;
a StackExchangeQA shard has a `score` of its own, the answer's votes, so name another with --score-column), each
input file's rows at its path under the input folder (`DIR/test/part-00000.parquet`), and manifest.json (each
output file's input); the folder appears whole, and a run that stops part-way resumes where it stopped when
run again (inference/scoring.py). The last stdout line is one JSON object: output, rows, files, seconds, rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.errors import fail
from runtime.ray_env import add_local_ray_options

if TYPE_CHECKING:
    from inference.scoring import ScoreConfig


def parse_args(argv=None) -> tuple[ScoreConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (state.pt) or run folder STORAGE/NAME")
    p.add_argument(
        "--input",
        required=True,
        help="a Parquet file, or a folder of them (searched recursively; of a StackExchangeQA build's folder, its "
        "split shards)",
    )
    p.add_argument("--output", required=True, help="folder for the scored rows (input rows plus score)")
    p.add_argument("--question-column", default="question", help="the question text column (default question)")
    p.add_argument("--answer-column", default="answer", help="the answer text column (default answer)")
    p.add_argument(
        "--score-column",
        default="score",
        help="the column the model's scores are written to (default score; StackExchangeQA shards have their own "
        "score, the answer's votes: name another, such as model_score)",
    )
    p.add_argument("--which", default="best", choices=["best", "latest"], help="checkpoint of a run folder")
    p.add_argument(
        "--batch-size",
        type=int,
        default=2048,
        help="rows per actor call, sorted by length there and scored in the ranker's batches (default 2048)",
    )
    p.add_argument("--actors", type=int, default=None, help="actors in the pool (default: one per CPU or GPU share)")
    p.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs each actor reserves (default 1)")
    p.add_argument("--num-gpus-per-actor", type=float, default=0.0, help="GPU share of each actor (default 0: CPU)")
    add_local_ray_options(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the checkpoint, the input and the output as a run would, print the resolved "
        "configuration and exit (2 where the run would be refused)",
    )
    args = p.parse_args(argv)
    from inference.scoring import ScoreConfig
    from runtime.checks import UsageError

    try:
        cfg = ScoreConfig(
            checkpoint=args.checkpoint,
            input=args.input,
            output=args.output,
            question_column=args.question_column,
            answer_column=args.answer_column,
            score_column=args.score_column,
            which=args.which,
            batch_size=args.batch_size,
            actors=args.actors,
            cpus_per_actor=args.cpus_per_actor,
            num_gpus_per_actor=args.num_gpus_per_actor,
        )
    except UsageError as error:
        p.error(str(error))
    return cfg, args


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    try:  # the actors fit the local Ray it starts; the checkpoint, every input file's columns and the output
        check_actors_fit(cfg, args.num_cpus)
        checkpoint, chosen, files = cfg.check_inputs()
    except Exception as error:
        return fail("score", error)
    if args.dry_run:
        print(
            json.dumps(
                dict(asdict(cfg), resolved_checkpoint=checkpoint, chosen=chosen, input_files=len(files)), indent=2
            )
        )
        return 0
    from inference.scoring import score
    from runtime.ray_env import run_on_ray

    def progress(line: str) -> None:  # stderr: stdout is the summary's, its last line one JSON object
        print(line, file=sys.stderr, flush=True)

    summary, rc = run_on_ray("score", lambda: score(cfg, log=progress), args.num_cpus, verbose=args.verbose)
    if rc:
        return rc
    written = f"{summary['files']} file{'s' if summary['files'] != 1 else ''}"
    print(f"scored {summary['rows']:,} rows into {written} in {cfg.output}")
    print(json.dumps(summary))
    return 0


def check_actors_fit(cfg: ScoreConfig, num_cpus: int | None) -> None:
    """One actor of the pool fits the local Ray a job run directly starts: Ray Data waited for ever otherwise ("The
    job may hang forever unless the cluster scales up"). More --actors than fit is no refusal: the pool scores with
    those it can place (measured: --actors 3 under --num-cpus 2 scored every row)."""
    from runtime.ray_env import check_fits_local_ray

    check_fits_local_ray("--cpus-per-actor", unit="actor", cpus=cfg.cpus_per_actor, num_cpus=num_cpus)
    check_fits_local_ray("--num-gpus-per-actor", unit="actor", gpus=cfg.num_gpus_per_actor)


if __name__ == "__main__":
    sys.exit(main())

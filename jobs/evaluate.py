"""Score a trained checkpoint on any split of tokenised shards and write per-question results.

    python jobs/evaluate.py --checkpoint RUN_DIR_OR_CHECKPOINT --data DIR [--split test] [--output FILE.jsonl]

--checkpoint is a checkpoint folder (with state.pt) or a run folder (STORAGE/NAME of jobs/train.py), in which
case the run's best checkpoint by its --select-metric is scored (`--which latest` for the latest). One process,
no Ray: the split's shards are read straight from Parquet, checked against the manifest. Per-question results
go to --output as JSON lines, written whole (temporary file, then rename): for answer selection AP, RR, P@1,
candidates, positives and the ranking as (aid, label, score) from best to worst; for extractive reading the
predicted span and its text, the gold answers, EM and F1; for multiple choice the predicted and right candidate.
The last stdout line is one JSON object: checkpoint, split, metrics (MAP, MRR, P@1; EM, F1; or accuracy, with
questions), rows, output.
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

from runtime.ray_env import quiet_progress_bars

if TYPE_CHECKING:
    from training.evaluation import EvaluateConfig


def parse_args(argv=None) -> tuple[EvaluateConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (state.pt) or run folder STORAGE/NAME")
    p.add_argument("--data", required=True, help="folder written by jobs/tokenize_corpora.py, same vocabulary")
    p.add_argument("--split", default="test", help="split to score (default test)")
    p.add_argument("--output", default=None, help="per-question results as JSON lines")
    p.add_argument("--which", default="best", choices=["best", "latest"], help="checkpoint of a run folder")
    p.add_argument(
        "--eval-policy",
        default=None,
        choices=["clean", "strict", "raw"],
        help="questions with no/only positives (default: the run's)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows scored at once (default: the run's dev batch size, which reproduces its dev figures "
        "exactly; another size pads differently and can move near-tied scores)",
    )
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:1, ...")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the checkpoint, the data and the output as a run would, print the resolved "
        "configuration and exit (2 where the run would be refused)",
    )
    args = p.parse_args(argv)
    # imported once the arguments parsed: the scoring modules load torch (1.5 s), which --help need not wait for
    from runtime.checks import UsageError
    from training.evaluation import EvaluateConfig

    try:
        cfg = EvaluateConfig(
            checkpoint=args.checkpoint,
            data=args.data,
            split=args.split,
            output=args.output,
            which=args.which,
            eval_policy=args.eval_policy,
            batch_size=args.batch_size,
            device=args.device,
        )
    except UsageError as error:
        p.error(str(error))
    return cfg, args


def main(argv=None) -> int:
    quiet_progress_bars()  # before transformers is imported; the Ray jobs call it in ray_session
    cfg, args = parse_args(argv)
    from runtime.errors import fail
    from training.checkpoints import write_jsonl
    from training.evaluation import evaluate_checkpoint, print_summary

    try:  # the checkpoint (its checksums), the data and the output, as the run would check them first
        checkpoint, chosen = cfg.check_inputs()
    except Exception as error:
        return fail("evaluate", error)
    if args.dry_run:
        print(json.dumps(dict(asdict(cfg), resolved_checkpoint=checkpoint, chosen=chosen), indent=2))
        return 0
    try:
        summary, records = evaluate_checkpoint(cfg)
        if cfg.output:
            write_jsonl(records, cfg.output)
    except Exception as error:  # one line naming the file or checkpoint (the traceback in the log it names)
        return fail("evaluate", error)
    print_summary(summary)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

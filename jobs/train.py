"""Train an answer-selection or reading-comprehension encoder on tokenised shards with Ray Train.

    python jobs/train.py --model gsamn --data DIR --storage-path DIR --name RUN \
        [--max-steps N] [--checkpoint-every N] [--num-workers N] [--seed S] [--init-from RUN_OR_CHECKPOINT]

Transfer as in the GSAMN paper, pretraining on StackExchangeQA then fine-tuning on a target set:

    python jobs/tokenize_corpora.py --dataset stackexchangeqa --input SEQA --output tok/seqa
    python jobs/train.py --model gsamn --data tok/seqa --name pretrain
    python jobs/tokenize_corpora.py --dataset wikiqa --input WikiQACorpus --output tok/wikiqa --vocab tok/seqa
    python jobs/train.py --model gsamn --data tok/wikiqa --name finetune --init-from runs/pretrain

Running the same command again resumes the run from its latest checkpoint. Progress goes to stderr; the
last line on stdout is one JSON object: model, steps, resumed_from_step, metrics (dev MAP, MRR, P@1; EM and F1;
or accuracy), checkpoint, best (the best checkpoint by --select-metric), test (with --test-split: that
checkpoint's figures on the split), training_curve, tensorboard and examples_per_s (after the first step).
Under `ray job submit -- python jobs/train.py ...` it trains on the cluster (add --use-gpu).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from training.command import parse_train_args
from training.config import TrainConfig


def parse_args(argv=None) -> tuple[TrainConfig, argparse.Namespace]:
    return parse_train_args(argv, description=__doc__)


def fetch(source: str, destination: str) -> None:
    """Copy the file `source` (a path or a pyarrow filesystem URI) to the local `destination`, whole (temporary
    file, then rename)."""
    import pyarrow.fs

    os.makedirs(os.path.dirname(os.path.abspath(destination)), exist_ok=True)
    staged = f"{destination}.partial-{os.getpid()}"
    filesystem, path = pyarrow.fs.FileSystem.from_uri(source if "://" in source else os.path.abspath(source))
    pyarrow.fs.copy_files(
        path, staged, source_filesystem=filesystem, destination_filesystem=pyarrow.fs.LocalFileSystem()
    )
    os.replace(staged, destination)


def print_dev_figures(summary: dict) -> None:
    """The model's dev figures at the last step, and at the best checkpoint where that is another (the one
    --test-split and evaluate.py score: a run stopped by --patience ends evaluations after it), and beside them
    (ranking) what a random and a word-overlap ranking score on the same questions."""
    from training.progress import figure_cells

    m = summary["metrics"]
    if not m.get("questions"):
        return
    names = [name for name in m if name != "questions"]

    def shown(figures: dict) -> str:
        return "  ".join(figure_cells(figures, names))

    best = summary.get("best") or {}
    rows = [(summary["model"], m, "")]
    if best.get("dev") and best["step"] != summary["steps"]:
        rows = [
            (f"{summary['model']} step {summary['steps']}", m, "  last step"),
            (f"{summary['model']} step {best['step']}", best["dev"], "  best checkpoint"),
        ]
    width = max(16, *(len(name) + 2 for name, _, _ in rows))
    print(f"dev {m['questions']} questions:", file=sys.stderr)
    for name, figures, note in rows:
        print(f"  {name:<{width}}{shown(figures)}{note}", file=sys.stderr)
    for name, figures in (summary.get("references") or {}).items():
        print(f"  {name.replace('_', ' '):<{width}}{shown(figures)}", file=sys.stderr)


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    from runtime.errors import fail
    from training.trainer import check_run, check_workers_fit

    try:  # every check a run makes before training, before Ray starts; --dry-run stops after them
        plan = check_run(cfg)
        check_workers_fit(cfg, args.num_cpus)
        if args.test_output:
            from pipelines.atomic import check_output_file
            from pipelines.shards import tokenised_files
            from training.evaluation import PER_QUESTION_RESULTS

            check_output_file(
                args.test_output, tokenised_files(cfg.data), option="--test-output", kind=PER_QUESTION_RESULTS
            )
    except Exception as error:
        return fail("train", error)
    if args.dry_run:
        from qa_models import MODELS
        from qa_models.recipes import recipe_of

        recipe = recipe_of(MODELS[cfg.model], cfg.recipe)
        print(
            json.dumps(
                dict(
                    asdict(cfg),
                    embeddings_file=plan.vectors,
                    init_checkpoint=plan.init_from,
                    init_checkpoint_chosen=plan.init_chosen,
                    resume_from=plan.resume_from,
                    total_steps=plan.total_steps,
                    model_config=asdict(plan.model_config),
                    recipe_text={"source": recipe.source, "ours": recipe.ours, "deviations": recipe.deviations},
                ),
                indent=2,
            )
        )
        return 0
    from runtime.ray_env import run_on_ray
    from training.evaluation import print_summary
    from training.trainer import run

    summary, rc = run_on_ray("train", lambda: run(cfg, plan), args.num_cpus, state_api=True, verbose=args.verbose)
    if rc:
        return rc
    summary.pop("loss_curve", None)
    if summary.get("interrupted"):
        import signal

        print(
            f"train: stopped by {summary['interrupted']} at step {summary['steps']} of {summary['total_steps']}; "
            f"checkpoint {summary['checkpoint']}; run the same command to resume",
            file=sys.stderr,
        )
        print(json.dumps(summary))
        return 128 + int(getattr(signal, summary["interrupted"]))
    print_dev_figures(summary)
    if summary.get("test"):
        print_summary(summary["test"])
        if args.test_output:
            try:
                fetch(summary["test"]["predictions"], args.test_output)
            except OSError as error:
                return fail("train", error)
            summary["test"]["output"] = args.test_output
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

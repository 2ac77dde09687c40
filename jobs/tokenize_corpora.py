"""Tokenise a corpus with spaCy into Parquet shards with a vocabulary and a manifest.

    python jobs/tokenize_corpora.py --dataset NAME --input PATH --output DIR

NAME stackexchangeqa reads INPUT/{train,dev,test}/*.parquet as written by jobs/build_stackexchangeqa.py (the
row counts of the shards checked against its stats.json). The published answer-selection sets are read in
their own formats by pipelines/readers.py, which prints the split sizes found beside the published ones and
records both in the manifest:
  wikiqa       the WikiQA-{train,dev,test}.tsv folder
  trecqa       jacana TRAIN/DEV/TEST(/TRAIN-ALL).xml, or castorini train/, clean-dev/, raw-test/, ... folders
  insuranceqa  the InsuranceQA v1 folder: vocabulary, answers.label.token_idx, question.train.token_idx.label,
               question.{dev,test1,test2}.label.token_idx.pool
  yahooqa      {train,dev,test}.tsv with question<TAB>answer<TAB>label (the Tay et al. 2017 splits)
  semeval-ql   the SemEval-2016 Task 3 Qatar Living XML files
Writes
OUTPUT/{split}/*.parquet (the TOKENISED_PAIRS schema), OUTPUT/vocab.json (counted on train only) and
OUTPUT/manifest.json: {"splits": {SPLIT: {"questions": N, "rows": N, "positive": N, "files": [...]}}, ...}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipelines.tokenize import TokenizeConfig

DATASETS = ("stackexchangeqa", "wikiqa", "trecqa", "insuranceqa", "yahooqa", "semeval-ql")


def parse_args(argv=None) -> tuple[TokenizeConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=DATASETS, help="which corpus format --input holds")
    p.add_argument("--input", required=True, help="the corpus folder")
    p.add_argument("--output", required=True, help="output folder; replaced atomically when complete")
    p.add_argument("--min-count", type=int, default=1, help="tokens seen fewer times in train map to <unk>")
    p.add_argument("--max-vocab", type=int, default=100_000, help="vocabulary size cap, reserved ids included")
    p.add_argument("--cased", action="store_true", help="keep case (default: lower-case tokens)")
    p.add_argument("--raw", action="store_true",
                   help="published sets: keep every question (default: the papers' clean splits, e.g. WikiQA "
                        "without questions that have no correct answer, TrecQA dev/test without all-positive or "
                        "all-negative questions)")
    p.add_argument("--semeval-task", choices=("A", "C"), default="A",
                   help="semeval-ql: A, comments against their thread's question (the CTRN paper's QatarLiving); "
                        "C, against the original question")
    p.add_argument("--skip-bad-records", action="store_true",
                   help="published sets: skip malformed records and list them in the manifest (default: stop "
                        "with an error naming the file and line)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray started when not on a cluster")
    p.add_argument("--dry-run", action="store_true", help="print the resolved configuration and exit")
    args = p.parse_args(argv)
    cfg = TokenizeConfig(dataset=args.dataset, input=args.input, output=args.output, min_count=args.min_count,
                         max_vocab=args.max_vocab, lowercase=not args.cased,
                         clean=not args.raw, on_error="skip" if args.skip_bad_records else "raise",
                         semeval_task=args.semeval_task)
    return cfg, args


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    if args.dry_run:
        print(json.dumps(asdict(cfg), indent=2))
        return 0
    from jobs.ray_env import run_on_ray
    from pipelines.tokenize import write

    manifest, rc = run_on_ray("tokenize_corpora", lambda: write(cfg), args.num_cpus)
    if rc:
        return rc
    for split, s in manifest["splits"].items():
        print(f"{split:<6} {s['questions']:>7,} questions {s['rows']:>9,} rows {len(s['files']):>4} shards")
    print(f"vocabulary {manifest['vocab_size']:,} tokens; wrote {cfg.output}/manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

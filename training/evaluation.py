"""Scoring: a model on a split's Parquet files (ranking figures per question, or the predicted span or candidate),
the dev figures training reports, what a random and a word-overlap ranking score on the same questions, and
`evaluate_checkpoint`, which jobs/evaluate.py and a run's --test-split use, and `rank_zero_shot`, jobs/zero_shot.py's
pretrained sentence encoder as an untrained bi-encoder."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.atomic import FileKind
from pipelines.shards import read_manifest
from runtime.checks import MissingInput, UsageError, integer_at_least, one_of
from training.checkpoints import check_vocabulary_fits, choose_checkpoint, load_checkpoint
from training.config import TrainConfig, autocast_dtype, check_device, resolve_device
from training.data import ROW, Batcher, check_data_fits_model, eval_batches, in_file_order, to_device
from training.progress import figure_cells

# What --output (evaluate, zero_shot) and train's --test-output write, and so the only file they replace
PER_QUESTION_RESULTS = FileKind("earlier per-question results (JSON lines, each with a qid)", "jsonl", "qid")


def score_batches(model, batcher: Batcher, batches, device, dtype: torch.dtype | None = None) -> dict:
    """The model's score for every row of `batches` (numpy dicts of tokenised pairs), with qid, aid, label."""
    model.eval()
    out: dict[str, list] = {"qid": [], "aid": [], "label": [], "score": []}
    positions: list[int] = []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        for batch in batches:
            inputs, _ = batcher(batch)
            logits = model(**{k: v.to(device) for k, v in inputs.items()})
            out["score"].extend(model.score(logits).float().cpu().tolist())
            out["label"].extend(batch["label"].tolist())
            out["qid"].extend(batch["qid"].tolist())
            out["aid"].extend(batch["aid"].tolist() if "aid" in batch else [None] * len(batch["label"]))
            positions.extend(batch[ROW].tolist() if ROW in batch else [])
    model.train()
    return {name: in_file_order(values, positions) for name, values in out.items()}


def read_batches(model, batcher: Batcher, batches, device, dtype: torch.dtype | None = None) -> list[dict]:
    """One record per question of tokenised-passage `batches`. Extractive: `prediction` (the best span of at
    most max_answer_tokens, as text), `span`, `answers`, `em`, `f1`. Multiple choice: `prediction` (the
    candidate whose mentions hold the most probability, eq. 8), `answer`, `correct`."""
    from qa_models.metrics import exact_match, f1_score

    model.eval()
    records: list[dict] = []
    positions: list[int] = []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        for batch in batches:
            inputs, targets = batcher(batch)
            positions.extend(batch[ROW].tolist() if ROW in batch else [])
            output = model(**to_device(inputs, device))
            if model.config.task == "extractive":
                for i, (start, end) in enumerate(model.best_spans(output).cpu().tolist()):
                    prediction = " ".join(batch["context_tokens"][i][start : end + 1])
                    answers = list(batch["answers"][i])
                    records.append(
                        {
                            "qid": batch["qid"][i],
                            "prediction": prediction,
                            "span": [start, end],
                            "answers": answers,
                            "em": exact_match(prediction, answers),
                            "f1": f1_score(prediction, answers),
                        }
                    )
            else:
                candidates = max(1, max(len(c) for c in batch["candidates"]))
                log_probs = model.candidate_log_probs(output, targets["mentions"].to(device), candidates)
                for i, choice in enumerate(log_probs.argmax(-1).cpu().tolist()):
                    names = list(batch["candidates"][i])
                    answer = int(batch["answer_index"][i])
                    records.append(
                        {
                            "qid": batch["qid"][i],
                            "prediction": names[choice] if choice < len(names) else "",
                            "answer": names[answer] if 0 <= answer < len(names) else "",
                            "correct": float(choice == answer),
                        }
                    )
    model.train()
    return in_file_order(records, positions)


def summarise_reading(records: list[dict]) -> dict:
    """Mean EM and F1, or accuracy, over the records of `read_batches`."""
    if records and "correct" in records[0]:
        return {"accuracy": float(np.mean([r["correct"] for r in records])), "questions": len(records)}
    return {
        "em": float(np.mean([r["em"] for r in records])) if records else 0.0,
        "f1": float(np.mean([r["f1"] for r in records])) if records else 0.0,
        "questions": len(records),
    }


def eval_batch_size(cfg: TrainConfig, inputs: str) -> int:
    """Rows per dev batch: the training batch for passages (memory), at least 64 pairs otherwise. evaluate.py
    uses the same by default: a padded batch changes scores by rounding, and an undertrained model's near-tied
    spans flip on that."""
    return cfg.batch_size if inputs == "passages" else max(64, cfg.batch_size)


def score_split(
    model,
    batcher: Batcher,
    paths: list[str],
    columns: list[str],
    cfg: TrainConfig,
    device,
    dtype: torch.dtype | None = None,
    policy: str | None = None,
    batch_size: int | None = None,
) -> tuple[dict, list[dict]]:
    """`model` on a split's Parquet files: ({rows, metrics[, policy]}, one record per question), what
    jobs/evaluate.py writes and what training reports for --test-split. Answer selection: AP, RR, P@1 and the
    ranking of each question under `policy` (default: the run's); reading: the predicted span or candidate."""
    from qa_models.metrics import per_question_ranking, summarise_ranking

    batches = eval_batches(paths, batch_size or eval_batch_size(cfg, batcher.inputs), columns, batcher.length_key)
    if batcher.inputs == "passages":
        records = read_batches(model, batcher, batches, device, dtype)
        return {"rows": len(records), "metrics": summarise_reading(records)}, records
    scored = score_batches(model, batcher, batches, device, dtype)
    policy = policy or cfg.eval_policy
    rows = [
        {"aid": aid, "label": label, "score": score}
        for aid, label, score in zip(scored["aid"], scored["label"], scored["score"])
    ]
    records = per_question_ranking(scored["qid"], scored["label"], scored["score"], policy=policy, ids=rows)
    return {"policy": policy, "rows": len(rows), "metrics": summarise_ranking(records)}, records


def evaluate(
    model,
    batcher: Batcher,
    paths: list[str],
    columns: list[str],
    cfg: TrainConfig,
    device,
    dtype: torch.dtype | None = None,
) -> dict:
    """Dev figures of `model` on the Parquet files `paths` (rank 0 reads them whole, without Ray Data: a dev set
    is small, and a Ray Data execution costs seconds of start-up at every evaluation)."""
    from qa_models.metrics import ranking_metrics

    batches = eval_batches(paths, eval_batch_size(cfg, batcher.inputs), columns, batcher.length_key)
    if batcher.inputs == "passages":
        return summarise_reading(read_batches(model, batcher, batches, device, dtype))
    scored = score_batches(model, batcher, batches, device, dtype)
    return ranking_metrics(scored["qid"], scored["label"], scored["score"], policy=cfg.eval_policy)


def evaluations_since_best(dev_history: list, metric: str) -> int:
    """Dev evaluations since the best one (the first to reach the highest `metric`): a tie is no improvement."""
    scores = [figures[metric] for _, figures in dev_history if figures.get(metric) is not None]
    if not scores:
        return 0
    best = scores.index(max(scores))
    return len(scores) - 1 - best


def best_so_far(score: float | None, earlier: list, metric: str) -> bool:
    """Whether the last step's dev `score` is above every earlier evaluation's (`dev_history` entries): then the
    final weights are the run's best, and rank 0 scores --test-split with them in place. Otherwise the job scores
    the best checkpoint afterwards (`held_out_figures`). A tie is no improvement: the best is the first to reach
    the highest score, as --patience counts and checkpoints rank (`checkpoints.select_score`). No score (a dev set
    without figures): the final weights, as the job would pick."""
    if score is None:
        return True
    return all(score > figures[metric] for _, figures in earlier if figures.get(metric) is not None)


def dev_references(paths: list[str], policy: str, seed: int) -> dict:
    """A random and a word-overlap ranking of the dev questions (qa_models/references.py), scored as the model's
    dev figures are: what its MAP/MRR/P@1 mean."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qa_models.references import reference_rankings

    table = pa.concat_tables([pq.read_table(p, columns=["qid", "label", "question_ids", "answer_ids"]) for p in paths])
    return reference_rankings(
        table["qid"].to_pylist(),
        table["label"].to_pylist(),
        table["question_ids"].to_pylist(),
        table["answer_ids"].to_pylist(),
        policy,
        seed,
    )


@dataclass
class EvaluateConfig:
    checkpoint: str
    data: str
    split: str = "test"
    output: str | None = None
    which: str = "best"  # for a run folder: "best" (by the run's select metric) or "latest"
    eval_policy: str | None = None  # None: the run's own
    batch_size: int | None = None  # None: the run's dev batch size (eval_batch_size)
    device: str = "auto"

    def __post_init__(self):
        """Every option range-checked here, before any work (evaluate.py's --dry-run runs the same checks)."""
        one_of("--which", self.which, ("best", "latest"))
        if self.eval_policy is not None:
            one_of("--eval-policy", self.eval_policy, ("clean", "strict", "raw"))
        integer_at_least("--batch-size", self.batch_size, 1, allow_none=True)
        if not (self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device)):
            raise UsageError(f"--device must be auto, cpu, cuda or cuda:N; got {self.device!r}")

    def check_inputs(self) -> tuple[str, str]:
        """What evaluation would refuse first: the checkpoint (resolved from a run folder, its files checked
        against their checksums), the data's manifest and split, and an --output that would replace an input.
        Returns the checkpoint to score and why it was chosen (`checkpoints.choose_checkpoint`)."""
        from pipelines.atomic import check_output_file
        from pipelines.shards import shard_paths, tokenised_files
        from training.checkpoints import checkpoint_summary

        check_device(self.device)
        if "://" not in self.checkpoint and not os.path.exists(self.checkpoint):
            raise MissingInput(f"--checkpoint {self.checkpoint}: no such checkpoint or run folder")
        checkpoint, chosen = choose_checkpoint(self.checkpoint, self.which)
        summary = checkpoint_summary(checkpoint)
        manifest = read_manifest(self.data)
        if self.split not in manifest.get("splits", {}):
            raise UsageError(
                f"--split {self.split}: {self.data} has no such split (it has "
                f"{', '.join(sorted(manifest.get('splits', {})))})"
            )
        check_vocabulary_fits(summary, manifest, self.data, checkpoint, "the checkpoint's")
        shard_paths(self.data, self.split)  # its shards are there, whole, as the manifest lists them
        if self.output:
            check_output_file(
                self.output,
                tokenised_files(self.data) + [os.path.join(checkpoint, name) for name in os.listdir(checkpoint)]
                if "://" not in checkpoint
                else tokenised_files(self.data),
                kind=PER_QUESTION_RESULTS,
            )
        return checkpoint, chosen


def evaluate_checkpoint(cfg: EvaluateConfig) -> tuple[dict, list[dict]]:

    from pipelines.shards import shard_paths

    checkpoint, chosen = choose_checkpoint(cfg.checkpoint, cfg.which)
    device = resolve_device(cfg.device)
    model, train_cfg, state, saved = load_checkpoint(checkpoint, device)
    manifest = read_manifest(cfg.data)
    check_data_fits_model(train_cfg, manifest)
    check_vocabulary_fits(saved, manifest, cfg.data, checkpoint, "the checkpoint's")
    paths, schema = shard_paths(cfg.data, cfg.split)
    batcher = Batcher(
        train_cfg,
        model.inputs,
        getattr(model, "objective", None),
        getattr(model.config, "max_len", None),
        manifest.get("max_context_tokens"),
    )
    dtype = autocast_dtype(train_cfg.precision if device.type == "cuda" else "fp32", device)
    figures, records = score_split(
        model, batcher, paths, schema.names, train_cfg, device, dtype, cfg.eval_policy, cfg.batch_size
    )
    summary = {
        "checkpoint": checkpoint,
        "chosen": chosen,
        "model": train_cfg.model,
        "step": state.get("step", saved.get("step")),
        "split": cfg.split,
    }
    return dict(summary, **figures, output=cfg.output), records


@dataclass
class ZeroShotConfig:
    """jobs/zero_shot.py's options: a pretrained sentence encoder ranking a split's answers as a bi-encoder."""

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
        from pipelines.shards import shard_paths, tokenised_files
        from qa_models.encoders import require_encoder

        manifest = read_manifest(self.data)
        if manifest.get("schema", "tokenised_pairs") != "tokenised_pairs":
            raise UsageError(f"{self.data}: {manifest.get('schema')} shards; a bi-encoder ranks answer-selection pairs")
        if self.split not in manifest.get("splits", {}):
            raise UsageError(
                f"--split {self.split}: {self.data} has no such split (it has "
                f"{', '.join(sorted(manifest.get('splits', {})))})"
            )
        shard_paths(self.data, self.split)
        try:
            require_encoder(self.encoder_path, self.max_len)
        except (ImportError, FileNotFoundError, ValueError) as error:
            raise UsageError(f"--encoder-path {self.encoder_path}: {error}") from None
        if self.output:
            check_output_file(self.output, tokenised_files(self.data), kind=PER_QUESTION_RESULTS)


def rank_zero_shot(cfg: ZeroShotConfig) -> tuple[dict, list[dict]]:
    """Rank the answers of a split of tokenised pairs by a pretrained sentence encoder's cosine between question and
    answer, without training (the zero-shot bi-encoder baseline): the summary and the per-question records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

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
        vectors = [
            embedder(distinct[i : i + cfg.batch_size]).float().numpy() for i in range(0, len(distinct), cfg.batch_size)
        ]
        return dict(zip(distinct, np.concatenate(vectors) if vectors else np.zeros((0, 1), np.float32)))

    questions, answers = embed(rows["question"]), embed(rows["answer"])
    scores = [float(questions[q] @ answers[a]) for q, a in zip(rows["question"], rows["answer"])]
    ids = [
        {"aid": aid, "label": label, "score": score} for aid, label, score in zip(rows["aid"], rows["label"], scores)
    ]
    records = per_question_ranking(rows["qid"], rows["label"], scores, policy=cfg.eval_policy, ids=ids)
    summary = {
        "encoder": path,
        "split": cfg.split,
        "policy": cfg.eval_policy,
        "rows": len(scores),
        "metrics": summarise_ranking(records),
        "output": cfg.output,
    }
    return summary, records


def print_summary(summary: dict, ranked_by: str = "") -> None:
    """The figures of a scored split on one stderr line (after `ranked_by`, what ranked it, where given); the JSON
    summary follows on stdout. A checkpoint's summary names it first, and why it was the one scored."""
    if summary.get("chosen"):
        print(f"{summary['model']} {summary['checkpoint']}: {summary['chosen']}", file=sys.stderr)
    shown = "  ".join(figure_cells(summary["metrics"], digits=4))
    print(
        f"{ranked_by + ', ' if ranked_by else ''}{summary['split']}: {shown}  over "
        f"{summary['metrics']['questions']} questions ({summary['rows']} rows)",
        file=sys.stderr,
    )

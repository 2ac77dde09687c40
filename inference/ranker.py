"""A trained answer-selection checkpoint at work: `Ranker.from_checkpoint(path).rank(question, answers)`.

    from inference import Ranker

    ranker = Ranker.from_checkpoint("runs/wikiqa-gsamn")          # a run folder (its best checkpoint) or one checkpoint
    ranker.rank("how are glacier caves formed?", answers)      # [(index, score), ...], best first
    ranker.score([(question, answer), ...])                    # one score per pair, in the order given

Everything the model needs travels with the checkpoint: its configuration, its weights (read with
weights_only=True, checked against the checkpoint's checksums), and how text becomes its input: a pretrained
encoder's own tokenizer (`--encoder-path`), or spaCy's blank English tokenizer and the vocabulary of the data it
trained on (`vocab.json`, kept in the checkpoint; a checkpoint written before it was kept reads the vocabulary of
its training data folder where that is still here and is the same file, by sha256). Pairs are batched, padded and
scored as jobs/evaluate.py scores a split (the same `Batcher`, the model's own `score`), so a pair's score here is
the score evaluate.py gives the same pair.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from runtime.checks import MissingInput, UsageError
from training.checkpoints import VOCAB_FILE, choose_checkpoint, load_checkpoint
from training.config import autocast_dtype, resolve_device
from training.data import ROW, Batcher
from training.evaluation import score_batches

DEFAULT_BATCH_SIZE = 64  # pairs scored at once (evaluation's smallest dev batch)


class Ranker:
    """Scores (question, answer) pairs with a trained answer-selection model; `rank` orders a question's
    candidates best first."""

    def __init__(
        self, model, train_cfg, batcher: Batcher, device: torch.device, words=None, checkpoint: str = "", chosen=""
    ):
        self.model, self.train_cfg, self.batcher, self.device = model, train_cfg, batcher, device
        self.words = words  # (spaCy tokenizer, vocabulary) of a word-vector model; None for a pretrained encoder
        self.checkpoint = checkpoint
        self.chosen = chosen  # why this checkpoint of a run folder (`training.checkpoints.choose_checkpoint`)
        self.dtype = autocast_dtype(train_cfg.precision if device.type == "cuda" else "fp32", device)

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "auto", which: str = "best") -> Ranker:
        """The model of checkpoint folder `path`, or of the best (`which="latest"`: the latest) checkpoint of the
        run folder `path` (STORAGE/NAME of jobs/train.py), on `device` ("auto": a GPU where there is one)."""
        from qa_models.encoders import resolve_encoder
        from training.config import TrainConfig

        if "://" not in path and not os.path.exists(path):
            raise MissingInput(f"{path}: no such checkpoint or run folder")
        checkpoint, chosen = choose_checkpoint(path, which)
        torch_device = resolve_device(device)
        model, train_cfg, _, saved = load_checkpoint(checkpoint, torch_device)
        if model.inputs == "passages":
            raise UsageError(
                f"{checkpoint}: a checkpoint of {train_cfg.model}, a reading-comprehension model; Ranker ranks "
                "answers with an answer-selection model (score a reading split with jobs/evaluate.py)"
            )
        words = None
        if train_cfg.encoder_path:
            encoder = resolve_encoder(train_cfg.encoder_path)
            if not os.path.isdir(encoder):
                raise MissingInput(
                    f"{checkpoint}: its tokenizer is the encoder folder {encoder}, which is not on this machine"
                )
            train_cfg = TrainConfig.from_saved(dict(saved["train"], encoder_path=encoder))
        else:
            words = word_tokenizer(checkpoint, saved)
        batcher = Batcher(
            train_cfg,
            model.inputs,
            getattr(model, "objective", None),
            getattr(model.config, "max_len", None),
        )
        return cls(model, train_cfg, batcher, torch_device, words, checkpoint, chosen)

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int = DEFAULT_BATCH_SIZE) -> list[float]:
        """The model's score of every (question, answer) pair, in the order given; higher ranks first."""
        pairs = list(pairs)
        for number, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
                raise UsageError(f"pairs[{number}]: expected a (question, answer) pair of strings, got {pair!r}")
        if not pairs:
            return []
        columns = self.columns([q for q, _ in pairs], [a for _, a in pairs])
        columns[ROW] = np.arange(len(pairs))
        # scored in batches of similar length, as evaluation batches a split (less padding, the same scores), and
        # handed back in the order given by the rows' positions
        order = np.argsort(self.batcher.length_key(columns), kind="stable")
        batches = (
            {name: values[order[start : start + batch_size]] for name, values in columns.items()}
            for start in range(0, len(order), batch_size)
        )
        return score_batches(self.model, self.batcher, batches, self.device, self.dtype)["score"]

    def rank(self, question: str, answers: Sequence[str], batch_size: int = DEFAULT_BATCH_SIZE):
        """[(index into `answers`, score)], best first (ties keep the order given)."""
        scores = self.score([(question, answer) for answer in answers], batch_size)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [(i, scores[i]) for i in order]

    def columns(self, questions: list[str], answers: list[str]) -> dict:
        """The numpy batch a tokenised split would give for these pairs (what `Batcher` reads)."""
        n = len(questions)
        columns = {
            "qid": np.array([f"q{i}" for i in range(n)], dtype=object),
            "label": np.zeros(n, dtype=np.int8),
            "question": np.array(questions, dtype=object),
            "answer": np.array(answers, dtype=object),
        }
        if self.words is not None:
            tokenizer, vocabulary = self.words
            columns["question_ids"] = _id_column(vocabulary, tokenizer.tokenize_cached(questions))
            columns["answer_ids"] = _id_column(vocabulary, tokenizer.tokenize_cached(answers))
        else:  # length_key reads token counts; the encoder's tokenizer cuts at max_len as it pads
            columns["question_ids"] = _id_column(None, [q.split() for q in questions])
            columns["answer_ids"] = _id_column(None, [a.split() for a in answers])
        return columns


def _id_column(vocabulary, token_rows: list[list[str]]) -> np.ndarray:
    column = np.empty(len(token_rows), dtype=object)
    for i, tokens in enumerate(token_rows):
        ids = vocabulary.ids(tokens) if vocabulary is not None else [0] * len(tokens)
        column[i] = np.asarray(ids, dtype=np.int32)
    return column


def word_tokenizer(checkpoint: str, saved: dict):
    """(spaCy tokenizer, Vocabulary) of a word-vector model's checkpoint: its own vocab.json, or (a checkpoint
    written before the vocabulary travelled with it) its training data's, where that is the same file."""
    from pipelines.shards import sha256_file
    from pipelines.tokenize import SpacyTokenizer
    from pipelines.vocabulary import Vocabulary

    text = saved.get("text") or {}
    own = os.path.join(checkpoint, VOCAB_FILE) if "://" not in checkpoint else None
    if own and os.path.exists(own):
        path = own
    else:
        data = saved.get("train", {}).get("data") or ""
        path = os.path.join(data, VOCAB_FILE)
        expected = saved.get("vocab_sha256")
        if not os.path.exists(path) or (expected and sha256_file(path) != expected):
            raise MissingInput(
                f"{checkpoint}: no {VOCAB_FILE} in the checkpoint (written before the vocabulary travelled with "
                f"it), and its training data's {path} is "
                + ("not here" if not os.path.exists(path) else "another vocabulary (sha256 differs)")
                + "; resume the run once to rewrite the checkpoint, or keep the data folder beside it"
            )
    vocabulary = Vocabulary.load(path)
    if saved.get("vocab_size") and len(vocabulary) != saved["vocab_size"]:
        raise UsageError(f"{path}: {len(vocabulary)} tokens, the checkpoint was trained with {saved['vocab_size']}")
    return SpacyTokenizer(lowercase=text.get("lowercase", True)), vocabulary

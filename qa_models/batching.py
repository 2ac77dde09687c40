"""Turning tokenised pairs into padded model inputs (plain PyTorch; the training glue calls these)."""

from __future__ import annotations

import zlib

import numpy as np
import torch

SEP_ID, PAD_ID = 2, 0  # pipelines.vocabulary.RESERVED: <pad>=0, <unk>=1, <sep>=2, <cls>=3


def _truncate_pair(q: list, a: list, budget: int) -> tuple[list, list]:
    """Fit question + answer into `budget` tokens, keeping at least half for the answer when both are long."""
    if len(q) + len(a) <= budget:
        return q, a
    q_keep = min(len(q), max(budget // 2, budget - len(a)))
    return q[:q_keep], a[: budget - q_keep]


def pair_batch(question_ids, answer_ids, labels, max_len: int) -> dict:
    """`question <sep> answer`, right-padded: input_ids and attention_mask (B, L), labels (B,)."""
    rows = []
    for q, a in zip(question_ids, answer_ids):
        q, a = _truncate_pair(list(q), list(a), max_len - 1)
        rows.append(q + [SEP_ID] + a)
    input_ids, attention_mask = _padded(rows)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": torch.as_tensor(np.asarray(labels), dtype=torch.long),
    }


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    tensor = torch.from_numpy(ids)
    return tensor, tensor != PAD_ID


def separate_batch(question_ids, answer_ids, labels, max_len: int) -> dict:
    """Question and answer as two right-padded sequences of at most `max_len` tokens each (models that read
    them apart, such as CTRN): question_ids/question_mask (B, Lq), answer_ids/answer_mask (B, La), labels (B,)."""
    q_ids, q_mask = _padded([list(q)[:max_len] for q in question_ids])
    a_ids, a_mask = _padded([list(a)[:max_len] for a in answer_ids])
    return {
        "question_ids": q_ids,
        "question_mask": q_mask,
        "answer_ids": a_ids,
        "answer_mask": a_mask,
        "labels": torch.as_tensor(np.asarray(labels), dtype=torch.long),
    }


def triplet_batch(
    qids, question_ids, answer_ids, labels, max_len: int, seed: int = 0, negatives: str = "question"
) -> dict:
    """Pairwise training rows from a batch of labelled pairs: each positive (q, a+) with one negative a-. With
    `negatives="question"`, an answer labelled 0 for the same question when the batch has one (the data set's own,
    harder negatives), else an answer to another question in the batch; with "random", always an answer to
    another question (the "randomly selected answer irrelevant to q_i" of the GGSA paper, section 3.3). The draw
    is seeded by `seed` and the batch's question ids, so a resumed run draws the same.
    question_ids/mask (B', Lq), answer_ids/negative_ids and their masks (B', La) padded alike, and `labels`
    (B',) the row weights: 1, or 0 for the one filler row of a batch without a usable positive (the forward
    pass still runs, so data-parallel replicas stay in step)."""
    qids = np.asarray([str(q) for q in qids])
    labels = np.asarray(labels)
    rng = np.random.default_rng([seed, zlib.crc32("\x1f".join(qids).encode())])
    rows, weights = [], []
    for i in np.flatnonzero(labels > 0):
        same_question = qids == qids[i]
        pool = np.flatnonzero(same_question & (labels <= 0)) if negatives == "question" else np.zeros(0, np.int64)
        if not len(pool):
            pool = np.flatnonzero(~same_question)
        if len(pool):
            rows.append((int(i), int(pool[rng.integers(len(pool))])))
            weights.append(1.0)
    if not rows:
        rows, weights = [(0, 0)], [0.0]
    q_ids, q_mask = _padded([list(question_ids[i])[:max_len] for i, _ in rows])
    both, both_mask = _padded(
        [list(answer_ids[i])[:max_len] for i, _ in rows] + [list(answer_ids[j])[:max_len] for _, j in rows]
    )
    half = len(rows)
    return {
        "question_ids": q_ids,
        "question_mask": q_mask,
        "answer_ids": both[:half],
        "answer_mask": both_mask[:half],
        "negative_ids": both[half:],
        "negative_mask": both_mask[half:],
        "labels": torch.tensor(weights, dtype=torch.float32),
    }


class TransformerPairs:
    """Pairs encoded with a pretrained model's own tokenizer (`[CLS] q [SEP] a [SEP]`)."""

    def __init__(self, path: str, max_len: int, pad_multiple: int | None = None):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.max_len = max_len
        self.pad_multiple = pad_multiple  # pad each batch to a multiple of this many tokens (None: its longest)

    def __call__(self, questions, answers, labels) -> dict:
        enc = self.tokenizer(
            list(questions),
            list(answers),
            truncation="longest_first",
            max_length=self.max_len,
            padding=True,
            pad_to_multiple_of=self.pad_multiple,
            return_tensors="np",  # numpy, then shared with torch: a third of the call went to torch.tensor(lists)
        )
        return {
            "input_ids": torch.from_numpy(enc["input_ids"]),
            "attention_mask": torch.from_numpy(enc["attention_mask"].astype(bool)),
            "labels": torch.as_tensor(np.asarray(labels), dtype=torch.long),
        }


def _padded_chars(rows: list[list[list[int]]], length: int) -> torch.Tensor:
    """Character ids (B, L, W) of every token, right-padded with 0 in both directions."""
    width = max([1] + [len(word) for row in rows for word in row[:length]])
    chars = np.zeros((len(rows), length, width), dtype=np.int64)
    for i, row in enumerate(rows):
        for t, word in enumerate(row[:length]):
            chars[i, t, : len(word)] = word
    return torch.from_numpy(chars)


def passage_batch(rows: dict, max_question: int = 64, max_context: int = 5000) -> dict:
    """Model inputs and targets from tokenised-passage columns (TOKENISED_PASSAGES, as numpy or lists):
    question_ids/chars/mask (B, Lq[, W]), context_ids/chars/mask (B, L[, W]) with the passages concatenated in
    rank order, `passage` (B, L) each token's passage number; targets `starts`/`ends` (B, A) every occurrence of
    the answer (-1 padded; occurrences past `max_context` are dropped, so a row may have none), `mentions`
    (B, L) each token's candidate index (-1: no mention) and `answer` (B,) the right candidate (multiple
    choice; -1 for extractive sets)."""
    contexts = [list(c)[:max_context] for c in rows["context_ids"]]
    q_ids, q_mask = _padded([list(q)[:max_question] for q in rows["question_ids"]])
    c_ids, c_mask = _padded(contexts)
    length = c_ids.size(1)
    passage = np.zeros((len(contexts), length), dtype=np.int64)
    mentions = np.full((len(contexts), length), -1, dtype=np.int64)
    answers = []
    for i, context in enumerate(contexts):
        for number, start in enumerate(list(rows["passage_starts"][i])):
            passage[i, start:] = number
        kept = [(s, e) for s, e in zip(rows["answer_starts"][i], rows["answer_ends"][i]) if e < len(context)]
        answers.append(kept)
        for s, e, c in zip(rows["mention_starts"][i], rows["mention_ends"][i], rows["mention_candidates"][i]):
            if e < len(context):
                mentions[i, s : e + 1] = c
    most = max([1] + [len(a) for a in answers])
    starts = np.full((len(contexts), most), -1, dtype=np.int64)
    ends = starts.copy()
    for i, kept in enumerate(answers):
        for j, (s, e) in enumerate(kept):
            starts[i, j], ends[i, j] = s, e
    return {
        "question_ids": q_ids,
        "question_chars": _padded_chars(list(rows["question_char_ids"]), q_ids.size(1)),
        "question_mask": q_mask,
        "context_ids": c_ids,
        "context_chars": _padded_chars(list(rows["context_char_ids"]), length),
        "context_mask": c_mask,
        "passage": torch.from_numpy(passage) * c_mask,
        "targets": {
            "starts": torch.from_numpy(starts),
            "ends": torch.from_numpy(ends),
            "mentions": torch.from_numpy(mentions),
            "answer": torch.as_tensor(np.asarray(rows["answer_index"]), dtype=torch.long),
        },
    }

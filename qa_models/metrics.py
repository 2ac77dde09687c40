"""Evaluation metrics: MAP, MRR and P@1 for answer selection; EM, F1 and accuracy for reading comprehension.

Ranking conventions, written down because published numbers depend on them:

* Ties. Candidates with equal scores are ordered explicitly, never by input order: on WikiQA test, file
  order alone gives MAP 0.64 against 0.40 for a random order, so an evaluator that keeps input order for
  ties flatters weak models. `ties="pessimistic"` (default) puts negatives before positives within a tie,
  a lower bound: a constant-score model scores at or below the random-order expectation. `ties="random"`
  shuffles each tie with a seeded generator (an unbiased sample of that expectation).
* Questions with no positive candidate, or with only positives. `policy="clean"` (default, the WikiQA
  convention of the papers) skips questions with no positive and keeps all-positive ones (AP = RR = 1);
  `policy="strict"` also skips all-positive questions (the TrecQA "clean" dev/test convention);
  `policy="raw"` keeps every question, scoring those with no positive as 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

POLICIES = ("clean", "strict", "raw")
TIES = ("pessimistic", "random")


def _order(labels: np.ndarray, scores: np.ndarray, ties: str, rng: np.random.Generator) -> np.ndarray:
    """Indices from best to worst score, ties broken by `ties`, never by position."""
    if ties == "pessimistic":
        secondary = labels.astype(np.float64)  # within a tie, label 0 first
    elif ties == "random":
        secondary = rng.random(len(scores))
    else:
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
    return np.lexsort((secondary, -scores.astype(np.float64)))


def average_precision(ranked_labels: Sequence[int]) -> float:
    ranked = np.asarray(ranked_labels) > 0
    if not ranked.any():
        return 0.0
    hits = np.cumsum(ranked)
    return float(np.mean(hits[ranked] / (np.flatnonzero(ranked) + 1)))


def reciprocal_rank(ranked_labels: Sequence[int]) -> float:
    ranked = np.asarray(ranked_labels) > 0
    return float(1.0 / (np.argmax(ranked) + 1)) if ranked.any() else 0.0


def per_question_ranking(
    qids: Iterable,
    labels: Iterable,
    scores: Iterable,
    policy: str = "clean",
    ties: str = "pessimistic",
    seed: int = 0,
    ids: Iterable | None = None,
) -> list[dict]:
    """One record per question, in qid order: `qid`, `ap`, `rr`, `p@1`, `candidates`, `positives`, `ranking`
    (candidate indices, or `ids`, from best to worst, ties broken by `ties`) and `skipped` (None, or why the
    policy leaves the question out; such questions carry no ap/rr/p@1)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    groups: dict = defaultdict(lambda: ([], [], []))
    ids = ids if ids is not None else range(2**62)
    for qid, label, score, ident in zip(qids, labels, scores, ids):
        group = groups[qid]
        group[0].append(int(label))
        group[1].append(float(score))
        group[2].append(ident)
    rng = np.random.default_rng(seed)
    records = []
    for qid in sorted(groups, key=str):
        lab, sco = (np.asarray(x) for x in groups[qid][:2])
        positives = int((lab > 0).sum())
        skipped = (
            "no_positive"
            if positives == 0 and policy != "raw"
            else "only_positive"
            if positives == len(lab) and policy == "strict"
            else None
        )
        # Skipped questions draw nothing from `rng`, so random tie-breaks do not depend on them.
        order = _order(lab, sco, "pessimistic" if skipped else ties, rng)
        record = {
            "qid": qid,
            "candidates": len(lab),
            "positives": positives,
            "skipped": skipped,
            "ranking": [groups[qid][2][i] for i in order],
        }
        if not skipped:
            ranked = lab[order]
            record.update({"ap": average_precision(ranked), "rr": reciprocal_rank(ranked), "p@1": float(ranked[0] > 0)})
        records.append(record)
    return records


def summarise_ranking(records: list[dict]) -> dict:
    """MAP, MRR and P@1 over the records of `per_question_ranking`, with the questions evaluated and skipped."""
    kept = [r for r in records if r["skipped"] is None]
    skipped = {"no_positive": 0, "only_positive": 0}
    for r in records:
        if r["skipped"]:
            skipped[r["skipped"]] += 1
    n = len(kept)
    return {
        "map": float(np.mean([r["ap"] for r in kept])) if n else 0.0,
        "mrr": float(np.mean([r["rr"] for r in kept])) if n else 0.0,
        "p@1": float(np.mean([r["p@1"] for r in kept])) if n else 0.0,
        "questions": n,
        "skipped": skipped,
    }


def ranking_metrics(
    qids: Iterable, labels: Iterable, scores: Iterable, policy: str = "clean", ties: str = "pessimistic", seed: int = 0
) -> dict:
    """MAP, MRR and P@1 over questions, with the counts of questions evaluated and skipped."""
    return summarise_ranking(per_question_ranking(qids, labels, scores, policy, ties, seed))


# Reading comprehension, with the SQuAD v1.1 evaluation script's normalisation.
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD v1.1)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold_answers: Sequence[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(g) for g in gold_answers))


def f1_score(prediction: str, gold_answers: Sequence[str]) -> float:
    """Token F1 against the best-matching gold answer."""
    best = 0.0
    pred_tokens = normalize_answer(prediction).split()
    for gold in gold_answers:
        gold_tokens = normalize_answer(gold).split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def reading_metrics(predictions: Sequence[str], gold: Sequence[Sequence[str]]) -> dict:
    """Mean EM and F1 (in [0, 1]) over questions."""
    if len(predictions) != len(gold):
        raise ValueError(f"{len(predictions)} predictions for {len(gold)} questions")
    em = [exact_match(p, g) for p, g in zip(predictions, gold)]
    f1 = [f1_score(p, g) for p, g in zip(predictions, gold)]
    return {"em": float(np.mean(em)) if em else 0.0, "f1": float(np.mean(f1)) if f1 else 0.0, "questions": len(em)}


def accuracy(predictions: Sequence, gold: Sequence) -> float:
    """Share of exact label matches (multiple-choice reading comprehension, WikiHop)."""
    if len(predictions) != len(gold):
        raise ValueError(f"{len(predictions)} predictions for {len(gold)} gold labels")
    return float(np.mean([p == g for p, g in zip(predictions, gold)])) if gold else 0.0

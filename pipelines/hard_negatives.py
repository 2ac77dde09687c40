"""Hard negatives mined by a model, in place of random ones (`--hard-negatives MINER` of
jobs/build_stackexchangeqa.py).

Answer-selection work since the GSAMN paper trains on negatives that a first model ranks high: TANDA (Garg,
Vu and Moschitti, "TANDA: Transfer and Adapt Pre-Trained Transformer Models for Answer Sentence Selection",
2020), ANCE (Xiong et al., "Approximate Nearest Neighbor Negative Contrastive Learning for Dense Text
Retrieval", 2021), sentence-transformers' `mine_hard_negatives`. Here, for each kept question:

- the candidates are the answers of its pool group (same site and split by default, the random sampler's
  groups), never one of the question's own answers, whatever its score (an answer below min_score still
  answers its question);
- a bi-encoder (`qa_models.encoders.SentenceEmbedder`: the shipped MiniLM by default, or any local sentence
  encoder) embeds questions and answers, and ranks the candidates by cosine with the question; with a trained
  checkpoint of jobs/train.py as the miner, the bi-encoder's top `candidates` are re-ranked by the checkpoint's
  scores (`inference.Ranker`), as sentence-transformers re-scores a retriever's list with a cross-encoder;
- the false-negative guard: a candidate whose cosine with one of the question's positives reaches
  `max_similarity` is passed over (a near-duplicate of a right answer is not a wrong one), and counted;
- a question takes as many negatives as the random sampler would give it (each positive floor(k) or floor(k)+1,
  seeded by its answer id: `pipelines.negatives.negatives_wanted`), the top-ranked that pass the guard; a group
  with too few gives what it has, and the shortfall is reported as the random sampler's is.

The result depends on the miner, the seed and the rows only: a pool group is embedded whole by one task, its
texts in a fixed order, and ties are broken by answer id, so partitioning changes nothing. Scale: one task
scores a pool group exactly (its questions in chunks against all its answers) and holds the group's vectors
(1.5 kB an answer with MiniLM's 384 floats: a million answers, 1.5 GB); `--negative-pool tag` cuts a large site
into smaller groups; `reduce_resources` puts the tasks on GPUs.

The stage loads no model itself: it is handed a `Miner` (`inference.miner.ModelMiner`), which loads its models
in each task's process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.blocks import trim_when_idle
from pipelines.negatives import NEGATIVES, shortfall_rows

# One row per (pool answer, pool group) and per kept question, in the group the question draws from.
MINING = pa.schema(
    [
        ("kind", pa.string()),  # "answer" or "question"
        ("group", pa.string()),  # "" for a question without a group to draw from
        ("qid", pa.string()),  # an answer's own question, or the question itself
        ("aid", pa.string()),  # "" on a question row
        ("text", pa.string()),
        ("score", pa.int32()),  # an answer's votes
        ("positive", pa.bool_()),  # a positive of its question (the guard compares candidates with these)
        ("wanted", pa.int64()),  # negatives a question asks for; 0 on an answer row
        ("site", pa.string()),
        ("split", pa.string()),
    ]
)
# MINING rows with their text's sentence vector, as the shuffle's map tasks send them to the group's task.
EMBEDDED = MINING.append(pa.field("vector", pa.list_(pa.float32())))

SKETCH_POINTS = 513  # order statistics kept per partition and distribution, to merge quantiles on the driver
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
CHUNK_SCORES = 1 << 24  # question x answer scores held at once by a task (64 MB of float32)


@dataclass(frozen=True)
class MinerSpec:
    """What mines: `retriever`, a sentence encoder (a name of `qa_models.encoders.resolve_encoder` or a folder),
    ranks every candidate; `checkpoint`, where set, re-ranks the retriever's top `candidates` with a trained
    answer-selection model (`inference.miner.miner_spec` makes one from --hard-negatives, its paths absolute:
    tasks may run anywhere on the cluster's shared file system)."""

    retriever: str = "minilm"
    checkpoint: str | None = None
    candidates: int = 64
    max_similarity: float = 0.95
    batch_size: int = 64
    max_len: int = 256


class Miner(Protocol):
    """The models a MinerSpec names, at work (`inference.miner.ModelMiner`; a pipeline stage loads no model
    itself). Ray pickles a miner into every task, so it loads its models on first use in the task's process."""

    @property
    def spec(self) -> MinerSpec: ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), d) float32 normalised sentence vectors of the retriever."""
        ...

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """The re-ranking checkpoint's score of each (question, answer) pair (only where spec.checkpoint is set)."""
        ...


def embedded(batch: pa.Table, miner: Miner) -> pa.Table:
    """MINING rows with the sentence vector of their text (the shuffle's map tasks embed, a block each, in
    parallel; the group's task only compares)."""
    vectors = miner.embed(batch["text"].to_pylist()) if batch.num_rows else np.zeros((0, 1), np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1])
    return batch.append_column("vector", column).cast(EMBEDDED)


def vectors_of(table: pa.Table) -> np.ndarray:
    """The `vector` column as an (n, d) float32 array."""
    column = table["vector"].combine_chunks()
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(table.num_rows, -1) if table.num_rows else np.zeros((0, 1), np.float32)


@dataclass
class Mined:
    """One group's picks: for each question (in the order given) the candidate indices it takes, best first,
    the miner's score of each, and what the guard passed over."""

    picks: list[np.ndarray]
    scores: list[np.ndarray]
    near_duplicates: int
    positive_scores: list[float]
    candidate_means: list[float]
    reranked: bool


def select_hard_negatives(
    question_vectors: np.ndarray,
    answer_vectors: np.ndarray,
    answer_qids: list[str],
    answer_positive: np.ndarray,
    question_qids: list[str],
    wanted: np.ndarray,
    max_similarity: float,
    shortlist: int = 0,
    rescore: Callable[[int, np.ndarray], np.ndarray] | None = None,
) -> Mined:
    """The negatives of each question of a pool group, from normalised vectors (answers sorted by id, so ties go
    to the smaller id): the highest cosines among the answers that are not its own and not within
    `max_similarity` of one of its positives, `wanted[i]` of them. With `rescore(i, candidates) -> scores`, the
    top max(shortlist, wanted) that pass are re-ranked by it and the best `wanted` kept."""
    n = len(answer_qids)
    own: dict[str, list[int]] = {}
    for j, qid in enumerate(answer_qids):
        own.setdefault(qid, []).append(j)
    picks, scores, positive_scores, candidate_means = [], [], [], []
    near_duplicates = 0
    chunk = max(1, CHUNK_SCORES // max(1, n))
    for start in range(0, len(question_qids), chunk):
        block = question_vectors[start : start + chunk] @ answer_vectors.T  # (c, n) cosines
        for offset, row in enumerate(block):
            i = start + offset
            mine = np.asarray(own.get(question_qids[i], []), dtype=np.int64)
            positives = mine[answer_positive[mine]] if len(mine) else mine
            positive_scores += (rescore(i, positives) if rescore is not None else row[positives]).tolist()
            row = row.astype(np.float64)
            row[mine] = -np.inf
            others = n - len(mine)
            if others:
                candidate_means.append(float(row[np.isfinite(row)].mean()))
            want = int(wanted[i]) if others else 0
            keep = max(want, shortlist) if rescore is not None and want else want
            chosen, passed_over = _top_passing(row, keep, others, answer_vectors, positives, max_similarity)
            near_duplicates += passed_over
            if rescore is not None and len(chosen):
                rescored = rescore(i, chosen)
                order = np.lexsort((chosen, -rescored))[:want]  # best first, ties by answer id
                chosen, chosen_scores = chosen[order], rescored[order]
            else:
                chosen_scores = row[chosen]
            picks.append(chosen)
            scores.append(np.asarray(chosen_scores, dtype=np.float64))
    return Mined(picks, scores, near_duplicates, positive_scores, candidate_means, rescore is not None)


def _top_passing(
    row: np.ndarray, keep: int, others: int, vectors: np.ndarray, positives: np.ndarray, max_similarity: float
) -> tuple[np.ndarray, int]:
    """The first `keep` candidates of `row` (best first, ties by index; -inf rows are never taken) whose cosine
    with every positive stays below `max_similarity`, and how many the guard passed over on the way. Looks at a
    short head first (argpartition), and at the whole row only when the guard leaves the head short."""
    if keep <= 0:
        return np.zeros(0, np.int64), 0
    head = min(others, 4 * keep + 16)
    while True:
        if head < len(row):
            top = np.argpartition(-row, head - 1)[:head]
            top = top[np.lexsort((top, -row[top]))]
        else:
            top = np.lexsort((np.arange(len(row)), -row))[:others]
        top = top[np.isfinite(row[top])]
        if len(positives):
            close = (vectors[top] @ vectors[positives].T).max(axis=1) >= max_similarity  # (head,)
        else:
            close = np.zeros(len(top), bool)
        passing = np.flatnonzero(~close)  # positions in `top`
        if len(passing) >= keep or head >= others:
            end = passing[keep - 1] + 1 if len(passing) >= keep else len(top)
            return top[passing[:keep]], int(close[:end].sum())
        head = others


def sketch(values) -> dict:
    """At most SKETCH_POINTS evenly spaced order statistics of `values` and their number: what a partition sends
    the driver of a distribution, merged there by `merged_quantiles`."""
    values = np.sort(np.asarray(list(values), dtype=np.float64))
    n = len(values)
    if n > SKETCH_POINTS:
        values = values[np.linspace(0, n - 1, SKETCH_POINTS).round().astype(np.int64)]
    return {"n": n, "points": values.tolist()}


def merged_quantiles(sketches: list[dict], counts: list[int] | None = None) -> dict:
    """Quantiles (QUANTILES) and the count of the values behind `sketches`, each point weighted by the share of
    its partition's values it stands for; exact where no partition held more than SKETCH_POINTS values."""
    counts = counts if counts is not None else [s["n"] for s in sketches]
    values, weights = [], []
    for s, count in zip(sketches, counts):
        if s["points"]:
            values += s["points"]
            weights += [count / len(s["points"])] * len(s["points"])
    total = int(sum(counts))
    if not values:
        return {"count": total}
    order = np.argsort(values, kind="stable")
    points, weight = np.asarray(values)[order], np.asarray(weights)[order]
    cumulative = np.cumsum(weight) - weight  # values strictly before each point
    spread = max(cumulative[-1], 1e-12)
    out: dict[str, Any] = {"count": total, "mean": round(float(np.average(points, weights=weight)), 4)}
    for q in QUANTILES:
        out[f"p{round(q * 100)}"] = round(float(np.interp(q * spread, cumulative, points)), 4)
    return out


def mine_block(block: pa.Table, miner: Miner) -> tuple[pa.Table, dict]:
    """NEGATIVES rows for every question of a partition that holds whole pool groups (after a shuffle by group;
    the question's text left empty, as the random sampler's with question_text=False: the pairs' shuffle brings it
    from the question's row), and the partition's summary: rows, shortfall, what the guard passed over, and
    sketches of the miner's scores (mined negatives, positives, and each question's mean over all its candidates:
    what a random negative scores on average)."""
    trim_when_idle(now=True)
    summary: dict[str, Any] = {"rows": 0, "short": 0, "near_duplicates": 0, "questions": 0}
    scores: dict[str, list[float]] = {"negative": [], "positive": [], "candidate_mean": []}
    tables = [NEGATIVES.empty_table()]
    if block.num_rows:
        order = [("group", "ascending"), ("kind", "ascending"), ("aid", "ascending"), ("qid", "ascending")]
        block = block.take(pc.sort_indices(block, order))  # per group: answers by id, then questions by id
        groups = block["group"].to_numpy(zero_copy_only=False)
        starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        for start, end in zip(starts, np.r_[starts[1:], len(groups)]):
            segment = block.slice(int(start), int(end - start))
            if segment["group"][0].as_py() == "":  # questions with no group to draw from
                tables.append(_shortfall(segment.filter(pc.equal(segment["kind"], "question")), np.zeros(0)))
                continue
            tables += _mine_group(segment, miner, summary, scores)
    table = pa.concat_tables(tables)
    summary["rows"] = int(pc.sum(pc.equal(table["short"], 0)).as_py() or 0)
    summary["short"] = int(pc.sum(table["short"]).as_py() or 0)
    summary["scores"] = {name: sketch(values) for name, values in scores.items()}
    return table, summary


def _mine_group(segment: pa.Table, miner: Miner, summary: dict, scores: dict) -> list[pa.Table]:
    is_question = pc.equal(segment["kind"], "question")
    answers, questions = segment.filter(pc.invert(is_question)), segment.filter(is_question)
    if not questions.num_rows:
        return []
    answer_texts, question_texts = answers["text"].to_pylist(), questions["text"].to_pylist()
    spec = miner.spec
    rescore = None
    if spec.checkpoint:

        def rescore(i: int, candidates: np.ndarray) -> np.ndarray:
            return miner.score([(question_texts[i], answer_texts[j]) for j in candidates.tolist()])

    wanted = questions["wanted"].to_numpy()
    mined = select_hard_negatives(
        vectors_of(questions),
        vectors_of(answers),
        answers["qid"].to_pylist(),
        answers["positive"].to_numpy(zero_copy_only=False),
        questions["qid"].to_pylist(),
        wanted,
        spec.max_similarity,
        shortlist=spec.candidates,
        rescore=rescore,
    )
    summary["questions"] += questions.num_rows
    summary["near_duplicates"] += mined.near_duplicates
    scores["negative"] += [float(x) for s in mined.scores for x in s]
    scores["positive"] += mined.positive_scores
    scores["candidate_mean"] += mined.candidate_means
    counts = np.array([len(p) for p in mined.picks], dtype=np.int64)
    asking = questions.select(["qid", "site", "split"]).take(pa.array(np.repeat(np.arange(len(counts)), counts)))
    picked = answers.select(["aid", "text", "score"]).take(
        pa.array(np.concatenate(mined.picks) if len(counts) else np.zeros(0, np.int64), pa.int64())
    )
    drawn = pa.table(
        {
            "qid": asking["qid"],
            "question": pa.array([""] * len(picked), pa.string()),
            "aid": picked["aid"],
            "answer": picked["text"],
            "score": picked["score"],
            "site": asking["site"],
            "split": asking["split"],
            "short": pa.array(np.zeros(len(picked), np.int64)),
        }
    ).cast(NEGATIVES)
    return [drawn, _shortfall(questions, counts)]


def _shortfall(questions: pa.Table, got: np.ndarray) -> pa.Table:
    """A NEGATIVES row for each question that got fewer than it wanted (`got`: what it got; empty: nothing)."""
    wanted = questions["wanted"].to_numpy()
    got = got if len(got) else np.zeros(len(wanted), np.int64)
    short = np.flatnonzero(wanted > got)
    return shortfall_rows(questions, short, (wanted - got)[short])


def mined_negative_blocks(
    threads: tuple[list, list[int]],
    prepare: Callable[[pa.Table], pa.Table],
    miner: Miner,
    partitions: int,
    task_bytes: int = 32 << 20,
    gpus: float = 0.0,
    map_done: list | None = None,
) -> list[tuple]:
    """Mined negatives over block references, as `pipelines.negatives.negative_blocks` gives random ones: for
    each partition, references to its NEGATIVES block, to its summary (`mine_block`: "rows" and "short" among
    it) and to the block's bytes, not waited for. The shuffle's map tasks turn each block of `threads` into
    MINING rows (`prepare`) and embed their texts, a block each in parallel (with `gpus` GPUs); the shuffle by
    pool group brings each group whole to one task, which compares vectors (and runs the checkpoint, with `gpus`
    GPUs, where one re-ranks). `map_done` gets a reference per embedding task (`hash_shuffle`)."""
    from pipelines.shuffle import composed, hash_shuffle

    on_gpus = {"num_gpus": gpus} if gpus else None
    return hash_shuffle(
        [(*threads, composed(prepare, partial(embedded, miner=miner)))],
        ["group"],
        partitions,
        mine_block,
        {"miner": miner},
        returns=2,
        task_bytes=task_bytes,
        map_resources=on_gpus,
        reduce_resources=on_gpus if miner.spec.checkpoint else None,
        map_done=map_done,
    )


def mined_summary(spec: MinerSpec, summaries: list[dict]) -> dict:
    """The build's account of mined negatives (stats.json, the data card): the miner, the guard, and the score
    distributions merged over partitions."""
    return {
        "drawn": "mined",
        "retriever": spec.retriever,
        "reranker": spec.checkpoint,
        "candidates": spec.candidates if spec.checkpoint else None,
        "max_similarity": spec.max_similarity,
        "scored_by": "the checkpoint's score" if spec.checkpoint else "cosine of the retriever's vectors",
        "questions": sum(s["questions"] for s in summaries),
        "near_duplicates_passed_over": sum(s["near_duplicates"] for s in summaries),
        "scores": {
            name: merged_quantiles([s["scores"][name] for s in summaries])
            for name in ("negative", "positive", "candidate_mean")
        },
    }

"""The training loop's pieces that need no Ray: length bucketing, step counts, precision, and the metrics'
per-question records."""
import numpy as np
import pytest
import torch

from jobs.train_loop import Batcher, TrainConfig, autocast_dtype, length_buckets, total_steps_for


def _batches(rows: int, batch_size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    qids = np.array([f"q{i // 5}" for i in range(rows)], dtype=object)  # five candidates per question
    question_lengths = {q: int(rng.integers(3, 40)) for q in set(qids)}
    questions = np.array([np.arange(question_lengths[q]) for q in qids] + [None], dtype=object)[:-1]
    answers = np.array([np.arange(int(n)) for n in rng.integers(5, 200, rows)] + [None], dtype=object)[:-1]
    labels = rng.integers(0, 2, rows)
    for start in range(0, rows, batch_size):
        part = slice(start, start + batch_size)
        yield {"qid": qids[part], "question_ids": questions[part], "answer_ids": answers[part], "label": labels[part]}


def _padded_tokens(batches, max_len=256) -> int:
    return sum(len(b["qid"]) * max(min(len(q) + len(a), max_len) for q, a in zip(b["question_ids"], b["answer_ids"]))
               for b in batches)


def test_length_buckets_keep_every_row_and_cut_padding():
    cfg = TrainConfig(model="gsamn", data="d")
    batcher = Batcher(cfg, "joint")
    plain = list(_batches(1000, 16))
    bucketed = list(length_buckets(_batches(1000, 16), 8, 16, batcher.length_key, np.random.default_rng(0)))
    assert len(bucketed) == len(plain) and [len(b["qid"]) for b in bucketed[:-1]] == [16] * (len(plain) - 1)
    key = lambda b: sorted(zip(b["qid"], map(len, b["answer_ids"]), b["label"]))  # noqa: E731
    assert sorted(r for b in bucketed for r in key(b)) == sorted(r for b in plain for r in key(b))
    assert _padded_tokens(bucketed) < 0.75 * _padded_tokens(plain), (_padded_tokens(bucketed), _padded_tokens(plain))
    again = list(length_buckets(_batches(1000, 16), 8, 16, batcher.length_key, np.random.default_rng(0)))
    assert all(np.array_equal(a["label"], b["label"]) and list(a["qid"]) == list(b["qid"])
               for a, b in zip(again, bucketed))  # a resumed run skips exactly what it consumed


def test_pairwise_buckets_keep_a_questions_rows_together():
    cfg = TrainConfig(model="ggsa", data="d")
    batcher = Batcher(cfg, "separate", objective="pairwise")
    stream = [q for b in length_buckets(_batches(600, 20), 6, 20, batcher.length_key, np.random.default_rng(1))
              for q in b["qid"]]
    changes = sum(a != b for a, b in zip(stream, stream[1:]))
    assert changes == len(set(stream)) - 1  # each question's rows form one run


def test_steps_count_optimiser_steps_with_accumulation():
    cfg = TrainConfig(model="gsamn", data="d", batch_size=8, grad_accumulation=3, epochs=2, num_workers=2)
    # 1,000 rows, 500 per worker, 63 micro-batches: 21 steps an epoch
    assert total_steps_for(cfg, 1000) == 42
    cfg = TrainConfig(model="gsamn", data="d", batch_size=8, grad_accumulation=4)
    assert total_steps_for(cfg, 1000) == 32  # 125 micro-batches: 31 full steps and a short one


def test_precision_options():
    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is None and autocast_dtype("fp32", cpu) is None
    assert autocast_dtype("bf16", cpu) is torch.bfloat16 and autocast_dtype("fp16", cpu) is torch.float16
    with pytest.raises(ValueError, match="fp16 needs --use-gpu"):
        TrainConfig(model="gsamn", data="d", precision="fp16")
    with pytest.raises(ValueError, match="length-buckets"):
        TrainConfig(model="gsamn", data="d", length_buckets=-1)


def test_per_question_records_agree_with_the_summary():
    from qa_models.metrics import per_question_ranking, ranking_metrics, summarise_ranking

    rng = np.random.default_rng(0)
    qids = [f"q{i // 4}" for i in range(200)]
    labels = (rng.random(200) < 0.3).astype(int)
    scores = np.round(rng.random(200), 1)  # ties on purpose
    for policy in ("clean", "strict", "raw"):
        for ties in ("pessimistic", "random"):
            records = per_question_ranking(qids, labels, scores, policy=policy, ties=ties, seed=3)
            assert summarise_ranking(records) == ranking_metrics(qids, labels, scores, policy, ties, seed=3)
            assert len(records) == 50 and all(len(r["ranking"]) == r["candidates"] == 4 for r in records)

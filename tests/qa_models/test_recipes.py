"""Each paper's recipe as data, and the training pieces that apply it: optimiser, schedule, coupled L2, the moving
average of the weights, early stopping's count, and the model options the recipes added (IARNN's initialisation,
CTRN's overlap features, GGSA's random negatives and separate encoders, DynSAN's per-passage positions)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from qa_models import MODELS
from qa_models.recipes import UNIFORM, TrainingRecipe, recipe_of
from training.config import RECIPE_FIELDS, TrainConfig
from training.evaluation import evaluations_since_best
from training.models import model_config
from training.optim import WeightAverage, build_optimizer, evaluation_weights, l2_penalty, lr_factor


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_has_a_recipe_that_quotes_its_paper_and_resolves(name):
    recipe = recipe_of(MODELS[name], "paper")
    assert recipe is not UNIFORM and recipe.source and recipe.ours, name
    fields = {f.name for f in dataclasses.fields(MODELS[name].config_class)}
    assert set(recipe.model_options) <= fields, f"{name}: options {set(recipe.model_options) - fields} not in config"
    cfg = TrainConfig(model=name, data="d")
    for field in RECIPE_FIELDS:
        expected = getattr(recipe, field)
        assert getattr(cfg, field) == (tuple(expected) if field == "betas" else expected), (name, field)
    assert model_config(cfg, 64).__dict__.items() >= recipe.model_options.items()


def test_the_papers_settings_are_the_recipes():
    ggsa, ctrn, iarnn, dynsan, gsamn = (
        MODELS[m].recipe for m in ("ggsa", "ctrn", "iarnn-occam-context", "dynsan", "gsamn")
    )
    assert (ggsa.optimizer, ggsa.momentum > 0, ggsa.lr, ggsa.batch_size, ggsa.negatives) == (
        "rmsprop",
        True,
        1e-4,
        128,
        "random",
    )
    assert (ctrn.optimizer, ctrn.l2, ctrn.model_options["dropout"], ctrn.patience) == ("adam", 4e-6, 0.5, 5)
    assert (iarnn.optimizer, iarnn.rho, iarnn.l2) == ("adadelta", 0.9, 1e-5)
    assert iarnn.model_options == {"embed_dropout": 0.3, "init": "unit_spectral", "occam_floor": 0.05}
    assert (dynsan.schedule, dynsan.warmup_steps, dynsan.ema_decay, dynsan.batch_size) == (
        "warmup_constant",
        500,
        0.9999,
        32,
    )
    assert (gsamn.optimizer, gsamn.encoder_lr, gsamn.weight_decay, gsamn.schedule, gsamn.warmup) == (
        "adamw",
        5e-5,
        0.01,
        "warmup_linear",
        0.1,
    )
    assert MODELS["iarnn-word"].config_class().occam_floor == 0.05  # lambda_q, section 5.2


def test_flags_override_the_recipe_and_uniform_is_the_old_single_recipe():
    cfg = TrainConfig(model="ggsa", data="d", lr=3e-4, batch_size=16, negatives="question")
    assert (cfg.optimizer, cfg.lr, cfg.batch_size, cfg.negatives, cfg.momentum) == (
        "rmsprop",
        3e-4,
        16,
        "question",
        0.9,
    )
    uniform = TrainConfig(model="ggsa", data="d", recipe="uniform")
    assert (uniform.optimizer, uniform.lr, uniform.weight_decay, uniform.schedule, uniform.batch_size) == (
        "adamw",
        1e-3,
        0.01,
        "warmup_linear",
        32,
    )
    assert TrainConfig(model="gsamn", data="d", encoder_path="/m").lr == 5e-5
    assert TrainConfig(model="gsamn", data="d").lr == 1e-3
    with pytest.raises(ValueError, match="optimizer must be one of"):
        TrainConfig(model="gsamn", data="d", optimizer="sgd")
    with pytest.raises(ValueError, match="recipe must be one of"):
        TrainConfig(model="gsamn", data="d", recipe="mine")
    # a config saved before recipes existed resolves as it trained: the uniform recipe
    old = {"model": "ctrn", "data": "d", "batch_size": 32, "lr": None, "weight_decay": 0.01, "warmup": 0.1}
    restored = TrainConfig.from_saved(old)
    assert (restored.recipe, restored.optimizer, restored.lr) == ("uniform", "adamw", 1e-3)
    # the recipe's model options sit below the flags and --model-option
    cfg = TrainConfig(model="iarnn-word", data="d", model_overrides={"embed_dropout": 0.1})
    assert model_config(cfg, 64).embed_dropout == 0.1 and model_config(cfg, 64).init == "unit_spectral"
    assert model_config(TrainConfig(model="ctrn", data="d", dropout=0.2), 64).dropout == 0.2


def test_schedules_by_hand():
    linear = lr_factor("warmup_linear", total_steps=100, warmup=0.1)
    assert [linear(s) for s in (0, 9, 10, 55, 100)] == [0.1, 1.0, 1.0, 0.5, 0.0]
    constant = lr_factor("warmup_constant", total_steps=100, warmup_steps=500)
    assert constant(0) == 1 / 500 and constant(249) == 0.5 and constant(499) == 1.0 and constant(5000) == 1.0
    flat = lr_factor("constant", total_steps=100)
    assert flat(0) == flat(99) == 1.0


@pytest.mark.parametrize(
    "optimizer, kind",
    [
        ("adamw", torch.optim.AdamW),
        ("adam", torch.optim.Adam),
        ("rmsprop", torch.optim.RMSprop),
        ("adadelta", torch.optim.Adadelta),
    ],
)
def test_each_optimizer_with_its_settings(optimizer, kind):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    model[1].weight.requires_grad_(False)  # frozen parameters (fixed embeddings) are not optimised
    cfg = TrainConfig(model="ctrn", data="d", optimizer=optimizer, momentum=0.7, rho=0.8, weight_decay=0.05)
    opt = build_optimizer(cfg, model, 0.5)
    assert isinstance(opt, kind)
    params = [p for g in opt.param_groups for p in g["params"]]
    assert len(params) == 3 and all(p is not model[1].weight for p in params)
    group = opt.param_groups[0]
    assert group["lr"] == 0.5
    if optimizer == "adamw":  # decay on matrices only
        assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
        assert opt.param_groups[0]["params"] == [model[0].weight]
    if optimizer == "rmsprop":
        assert group["momentum"] == 0.7
    if optimizer == "adadelta":
        assert group["rho"] == 0.8


def test_head_lr_gives_the_layers_above_a_pretrained_transformer_their_own_rate():
    from qa_models.encoders import PretrainedTransformer

    encoder = PretrainedTransformer.__new__(PretrainedTransformer)  # its parameters, without loading a model
    torch.nn.Module.__init__(encoder)
    encoder.model = torch.nn.Linear(3, 3)
    model = torch.nn.Sequential(encoder, torch.nn.Linear(3, 1))
    cfg = TrainConfig(model="gsamn", data="d", weight_decay=0.01)
    plain = build_optimizer(cfg, model, 5e-5)
    assert [len(g["params"]) for g in plain.param_groups] == [2, 2]  # as before: matrices, then the rest
    assert {g["lr"] for g in plain.param_groups} == {5e-5}
    cfg = TrainConfig(model="gsamn", data="d", weight_decay=0.01, head_lr=1e-3)
    split = build_optimizer(cfg, model, 5e-5)
    rates = [(g["lr"], g["weight_decay"], [id(p) for p in g["params"]]) for g in split.param_groups]
    assert rates == [
        (5e-5, 0.01, [id(encoder.model.weight)]),
        (1e-3, 0.01, [id(model[1].weight)]),
        (5e-5, 0.0, [id(encoder.model.bias)]),
        (1e-3, 0.0, [id(model[1].bias)]),
    ]
    scheduler = torch.optim.lr_scheduler.LambdaLR(split, lr_factor("warmup_linear", 10, 0.1))
    split.step()
    scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([5e-5 * 1.0, 1e-3 * 1.0, 5e-5, 1e-3])


def test_l2_penalty_is_lambda_times_the_squared_norm_of_trainable_parameters():
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model.bias.copy_(torch.tensor([1.0, -1.0]))
    assert float(l2_penalty(model, 0.5).detach()) == pytest.approx(0.5 * (1 + 4 + 9 + 16 + 1 + 1))
    model.bias.requires_grad_(False)
    assert float(l2_penalty(model, 0.5).detach()) == pytest.approx(0.5 * 30)
    assert l2_penalty(model, 0.0) == 0.0


def test_weight_average_follows_tensorflows_form_and_swaps_in_for_evaluation():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    average = WeightAverage(model, decay=0.9999)
    expected = 0.0
    for n, value in enumerate([1.0, 2.0, 3.0], start=1):
        with torch.no_grad():
            model.weight.fill_(value)
        average.update(model)
        decay = min(0.9999, (1 + n) / (10 + n))
        expected = decay * expected + (1 - decay) * value
    assert float(average.shadow["weight"]) == pytest.approx(expected)
    with average.applied(model):
        assert model.weight.item() == pytest.approx(expected)
    assert model.weight.item() == 3.0  # the live weights are back
    restored = WeightAverage(model, 0.5)
    restored.load_state_dict(average.state_dict())
    assert restored.updates == 3 and restored.decay == 0.9999
    state = {"model": model.state_dict(), "weight_average": average.state_dict()}
    assert float(evaluation_weights(state)["weight"]) == pytest.approx(expected)
    assert float(evaluation_weights({"model": model.state_dict()})["weight"]) == 3.0


def test_evaluations_since_the_best_count_ties_as_no_improvement():
    history = [[10, {"map": 0.5}], [20, {"map": 0.6}], [30, {"map": 0.6}], [40, {"map": 0.55}]]
    assert evaluations_since_best(history, "map") == 2
    assert evaluations_since_best(history[:2], "map") == 0
    assert evaluations_since_best([], "map") == 0


def test_iarnn_unit_spectral_initialisation_sets_each_matrix_and_gate_block_to_norm_one():
    from qa_models.iarnn import IARNNConfig, IARNNGate

    model = IARNNGate(IARNNConfig(vocab_size=20, embed_dim=6, hidden=5, attention="gate", init="unit_spectral"))
    for name, parameter in model.named_parameters():
        if parameter.ndim != 2 or name.startswith("embed"):
            continue
        parts = {"x_proj": 3, "h_gates": 2, "q_gates": 2}.get(name.split(".")[-2], 1)
        for block in parameter.chunk(parts, dim=0):
            assert float(torch.linalg.matrix_norm(block, ord=2)) == pytest.approx(1.0, abs=1e-5), name


def _reference_overlap(question: list[int], answer: list[int], idf: np.ndarray, stop: set[int]) -> list[float]:
    """Severyn and Moschitti's compute_overlap_features, as released, once with all words and once without stop
    words, over word ids (ids under 4 are not words)."""
    features = []
    for stoplist in (set(), stop):
        q_set = {w for w in question if w >= 4 and w not in stoplist}
        a_set = {w for w in answer if w >= 4 and w not in stoplist}
        shared = q_set & a_set
        size = max(1, len(q_set) + len(a_set))
        features += [len(shared) / size, sum(idf[w] for w in shared) / size]
    return features


def test_ctrn_overlap_features_equal_the_released_code():
    from qa_models.batching import separate_batch
    from qa_models.ctrn import overlap_features

    rng = np.random.default_rng(0)
    idf = rng.random(30).astype(np.float32) * 5
    stop = {4, 5, 6}
    stopword = np.zeros(30, dtype=bool)
    stopword[list(stop)] = True
    questions = [list(rng.integers(1, 30, n)) for n in (3, 7, 1, 5)]
    answers = [list(rng.integers(1, 30, n)) for n in (9, 2, 4, 12)]
    answers[0] += questions[0]  # sure overlap, repeated words included
    batch = separate_batch(questions, answers, [1, 0, 0, 1], 50)
    got = overlap_features(
        batch["question_ids"],
        batch["question_mask"],
        batch["answer_ids"],
        batch["answer_mask"],
        torch.from_numpy(idf),
        torch.from_numpy(stopword),
    )
    expected = [_reference_overlap(q, a, idf, stop) for q, a in zip(questions, answers)]
    np.testing.assert_allclose(got.numpy(), np.array(expected, dtype=np.float32), rtol=1e-5, atol=1e-6)
    assert got[0, 0] > 0


def test_word_statistics_idf_over_distinct_questions_and_answers(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.word_statistics import word_statistics

    tokens = ["<pad>", "<unk>", "<sep>", "<cls>", "the", "beer", "hops", "malt"]
    (tmp_path / "vocab.json").write_text(json.dumps({"tokens": tokens}))
    # two distinct questions (one repeated over its candidates) and three distinct answers: 5 documents
    table = pa.table({"question_ids": [[4, 5], [4, 5], [6]], "answer_ids": [[4, 6, 6], [7], [5, 7]]})
    pq.write_table(table, tmp_path / "train.parquet")
    idf, stopword = word_statistics([str(tmp_path / "train.parquet")], str(tmp_path / "vocab.json"))
    documents = {4: 2, 5: 2, 6: 2, 7: 2}
    for word, df in documents.items():
        assert idf[word] == pytest.approx(math.log(5 / df))
    assert stopword.tolist() == [False] * 4 + [True, False, False, False]


def test_ctrn_with_overlap_features_trains_and_keeps_its_statistics():
    from qa_models.ctrn import CTRN, CTRNConfig

    config = dataclasses.replace(CTRNConfig.tiny(), overlap_features=True)
    model = CTRN(config)
    assert model.needs_word_statistics
    model.load_word_statistics(np.arange(64, dtype=np.float32), np.arange(64) % 2 == 0)
    restored = CTRN(config)
    restored.load_state_dict(model.state_dict())
    assert torch.equal(restored.idf, model.idf) and torch.equal(restored.stopword, model.stopword)
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    out = model(ids, ids != 0, ids.flip(1), ids.flip(1) != 0)
    assert out.shape == (2, 2)
    out.sum().backward()
    assert not CTRN(CTRNConfig.tiny()).needs_word_statistics


def test_random_negatives_come_from_other_questions():
    from qa_models.batching import triplet_batch

    qids = ["a", "a", "a", "b", "b", "c"]
    labels = [1, 0, 0, 1, 0, 0]
    answers = [[10 + i] for i in range(6)]
    questions = [[1]] * 6
    own = triplet_batch(qids, questions, answers, labels, 8, seed=0, negatives="question")
    assert {int(x) for x in own["negative_ids"][:, 0]} <= {11, 12, 14}  # a's negatives for a, b's for b
    assert int(own["negative_ids"][0, 0]) in (11, 12) and int(own["negative_ids"][1, 0]) == 14
    for seed in range(20):
        drawn = triplet_batch(qids, questions, answers, labels, 8, seed=seed, negatives="random")
        assert int(drawn["negative_ids"][0, 0]) in (13, 14, 15)  # an answer to b or c, whatever its label
        assert int(drawn["negative_ids"][1, 0]) in (10, 11, 12, 15)


def test_ggsa_separate_encoders_read_the_answer_with_their_own_blocks():
    from qa_models.ggsa import GGSA, IGGSA, GGSAConfig, IGGSAConfig

    shared = GGSA(GGSAConfig.tiny())
    assert not any(k.startswith("answer_") for k in shared.state_dict())  # old checkpoints keep loading
    for model_class, config in (
        (GGSA, GGSAConfig.tiny()),
        (IGGSA, IGGSAConfig(**{**GGSAConfig.tiny().__dict__, "interaction": True})),
    ):
        apart = model_class(dataclasses.replace(config, shared_encoder=False))
        assert any(k.startswith("answer_blocks.") for k in apart.state_dict())
        q = torch.tensor([[5, 6, 7, 0]])
        a = torch.tensor([[8, 9, 10, 11]])
        out = apart(q, q != 0, a, a != 0)
        out.sum().backward()
        unused = [n for n, p in apart.named_parameters() if p.requires_grad and p.grad is None]
        assert not unused, unused  # data-parallel training needs every parameter used


def test_dynsan_counts_each_passages_positions_from_its_own_start():
    from qa_models.dynsan import DynSAN, DynSANConfig, within_passage

    passage = torch.tensor([[0, 0, 0, 1, 1, 2, 0]])
    mask = torch.tensor([[True] * 6 + [False]])
    assert within_passage(passage, mask, 4).tolist() == [[0, 1, 2, 0, 1, 0, 0]]
    torch.manual_seed(0)
    model = DynSAN(DynSANConfig.tiny()).eval()
    # the second passage's embedded tokens are the same after a first passage of 2 tokens or of 5
    ids = torch.tensor([[5, 6, 9, 10, 11, 0, 0, 0], [5, 6, 7, 8, 7, 9, 10, 11]])
    chars = torch.zeros(2, 8, 3, dtype=torch.long)
    chars[..., 0] = ids
    mask = torch.tensor([[True] * 5 + [False] * 3, [True] * 8])
    passage = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        x = model._embed(ids, chars, mask, within_passage(passage, mask, 4))
    torch.testing.assert_close(x[0, 2:5], x[1, 5:8])


def test_a_recipe_checks_its_own_fields():
    with pytest.raises(ValueError, match="schedule"):
        TrainingRecipe(schedule="cosine")
    with pytest.raises(ValueError, match="ema_decay"):
        TrainingRecipe(ema_decay=1.0)
    assert TrainingRecipe(lr=1.0).with_overrides(lr=None, batch_size=8).batch_size == 8

"""GGSA, iGGSA and the baselines of their tables: the block's equations by hand, padding invariance, finite
gradients, determinism, the interaction residual, and the pairwise/pointwise objectives."""

import math

import pytest
import torch

from qa_models import MODELS
from qa_models.attention import MultiHeadAttention, sinusoidal_positions
from qa_models.batching import triplet_batch
from qa_models.ggsa import GGSA, GGSABlock, GGSAConfig
from qa_models.matching import Composition, pairwise_hinge, similarity


def _inputs(seed=0, batch=4, lq=7, la=13):
    g = torch.Generator().manual_seed(seed)
    q, a = torch.randint(4, 64, (batch, lq), generator=g), torch.randint(4, 64, (batch, la), generator=g)
    qm, am = torch.ones(batch, lq, dtype=torch.bool), torch.ones(batch, la, dtype=torch.bool)
    qm[1, 4:], am[1, 6:], am[2, 9:] = False, False, False
    return q * qm, qm, a * am, am


def _padded(ids, mask, extra):
    return (
        torch.cat([ids, torch.zeros(ids.size(0), extra, dtype=ids.dtype)], 1),
        torch.cat([mask, torch.zeros(mask.size(0), extra, dtype=torch.bool)], 1),
    )


@pytest.mark.parametrize("name", ["ggsa", "iggsa", "qa-lstm"])
@pytest.mark.parametrize(
    "composition,objective", [("attention", "pointwise"), ("multihop", "pairwise"), ("multihop", "pointwise")]
)
def test_every_composition_and_objective_is_padding_invariant_with_finite_gradients(name, composition, objective):
    """tests/qa_models/test_models.py checks each registered default; here the other compositions and objectives."""
    cls = MODELS[name]
    config = cls.config_class.tiny()
    config.composition, config.objective = composition, objective
    torch.manual_seed(0)
    model = cls(config)
    q, qm, a, am = _inputs()
    model.eval()
    with torch.no_grad():
        scores = model.score(model(q, qm, a, am))
        padded = model.score(model(*_padded(q, qm, 5), *_padded(a, am, 9)))
    torch.testing.assert_close(scores, padded, atol=1e-5, rtol=1e-5)
    model.train()
    if objective == "pairwise":
        loss = model.loss(model(q, qm, a, am, a.flip(0), am.flip(0)), torch.ones(4))
    else:
        loss = model.loss(model(q, qm, a, am), torch.tensor([1, 0, 1, 0]))
    loss.backward()
    for pname, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), pname


def test_ggsa_block_follows_equations_1_to_4():
    torch.manual_seed(0)
    config = GGSAConfig.tiny()
    block = GGSABlock(config).eval()
    x = torch.randn(2, 9, config.dim)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    expected = []
    for row in range(2):
        n = int(mask[row].sum())
        xs = x[row : row + 1, :n]  # the real words only
        x_bar = xs.mean(1)  # eq. 1
        gate = torch.sigmoid(xs * x_bar[:, None] @ block.gate.weight.T + block.gate.bias)
        c = block.attention(xs * gate, torch.ones(1, n, dtype=torch.bool))
        y = torch.nn.functional.layer_norm(xs + c, (config.dim,), block.norm.weight, block.norm.bias)  # eq. 2
        r = (
            torch.relu(y @ block.ffn.net[0].weight.T + block.ffn.net[0].bias) @ block.ffn.net[3].weight.T
            + block.ffn.net[3].bias
        )  # eq. 3
        expected.append(y + r)  # eq. 4: no last layer norm
    out = block(x, mask)
    torch.testing.assert_close(out[0:1, :9], expected[0])
    torch.testing.assert_close(out[1:2, :5], expected[1])
    assert (out[1, 5:] == 0).all()


def test_the_global_baseline_keeps_the_last_layer_norm_and_has_no_gate():
    block = GGSABlock(MODELS["global-sa"].config_class.tiny()).eval()
    assert block.gate is None and isinstance(block.attention, MultiHeadAttention) and block.attention.window is None
    out = block(torch.randn(2, 6, 12), torch.ones(2, 6, dtype=torch.bool))
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)  # normalised, unit affine
    assert MODELS["group-sa"].config_class.tiny().offsets() == [0, 0]
    assert GGSAConfig().offsets() == [0, 0, 0, 5, 5, 5]  # the paper: 6 heads, l = 10, offsets 0 and 5


def test_local_attention_sees_a_window_of_l_words_and_is_global_when_the_window_covers_the_sequence():
    torch.manual_seed(1)
    local = MultiHeadAttention(8, 2, window=4).eval()
    allowed = local.allowed(torch.ones(1, 7, dtype=torch.bool))[0, 0]
    assert allowed[3].tolist() == [False, False, True, True, True, True, False]  # j - i in [-1, 2]
    assert allowed.sum(1).tolist() == [3, 4, 4, 4, 4, 3, 2]
    wide = MultiHeadAttention(8, 2, window=20).eval()
    wide.load_state_dict(local.state_dict())
    full = MultiHeadAttention(8, 2).eval()
    full.load_state_dict(local.state_dict())
    x, mask = torch.randn(2, 7, 8), torch.ones(2, 7, dtype=torch.bool)
    torch.testing.assert_close(wide(x, mask), full(x, mask))


def test_fused_global_and_local_attention_equal_the_textbook_form():
    torch.manual_seed(2)
    for window in (None, 4):
        textbook = MultiHeadAttention(12, 3, window).eval()
        fused = MultiHeadAttention(12, 3, window, sdpa=True).eval()
        fused.load_state_dict(textbook.state_dict())
        x, mask = torch.randn(2, 9, 12), torch.ones(2, 9, dtype=torch.bool)
        mask[0, 5:] = False
        torch.testing.assert_close(fused(x, mask)[mask], textbook(x, mask)[mask], atol=1e-5, rtol=1e-5)


def test_sinusoidal_positions():
    table = sinusoidal_positions(3, 6)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert table[1, 0].item() == pytest.approx(math.sin(1.0))
    assert table[2, 3].item() == pytest.approx(math.cos(2.0 / 10000 ** (2 / 6)))


def test_iggsa_reads_the_answer_in_the_light_of_the_question():
    q, qm, a, am = _inputs()
    other_q = torch.randint(4, 64, q.shape, generator=torch.Generator().manual_seed(9)) * qm
    for name, depends in (("ggsa", False), ("iggsa", True)):
        torch.manual_seed(0)
        model = MODELS[name](MODELS[name].config_class.tiny()).eval()

        def c_q(ids, model=model):
            return model.encode(ids, qm).sum(1) / qm.sum(1, keepdim=True)

        with torch.no_grad():
            first = model.encode(a, am, c_q(q) if depends else None)
            second = model.encode(a, am, c_q(other_q) if depends else None)
        assert (not torch.allclose(first, second)) == depends


def test_multihop_composition_gives_hops_plus_one_pairs():
    torch.manual_seed(0)
    composition = Composition("multihop", 8, hops=3)
    h_q, h_a = torch.randn(2, 5, 8), torch.randn(2, 7, 8)
    pairs = composition(h_q, torch.ones(2, 5, dtype=torch.bool), h_a, torch.ones(2, 7, dtype=torch.bool))
    assert len(pairs) == 4 and all(v_q.shape == (2, 8) and v_a.shape == (2, 8) for v_q, v_a in pairs)
    torch.testing.assert_close(pairs[0][0], h_q.mean(1))  # hop 0: the question's mean


def test_pairwise_hinge_and_similarities_by_hand():
    positive, negative = torch.tensor([0.9, 0.2, 0.5]), torch.tensor([0.1, 0.25, 0.0])
    # max(0, 0.1 - 0.9 + 0.1) = 0, max(0, 0.1 - 0.2 + 0.25) = 0.15, the third row weighted out
    assert pairwise_hinge(positive, negative, torch.tensor([1.0, 1.0, 0.0]), 0.1).item() == pytest.approx(0.075)
    q, a = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    assert similarity(q, a).item() == pytest.approx(1 / math.sqrt(2))
    gesd = 1 / (1 + 1.0) * 1 / (1 + math.exp(-(1.0 + 1.0)))  # ||q - a|| = 1, q . a = 1
    assert similarity(q, a, "gesd").item() == pytest.approx(gesd)


def test_triplets_prefer_the_questions_own_negatives_and_are_seeded():
    qids = ["q1", "q1", "q1", "q2", "q2", "q3"]
    labels = [1, 0, 0, 1, 1, 0]
    answers = [[10 + i] for i in range(6)]
    questions = [[1], [1], [1], [2], [2], [3]]
    batch = triplet_batch(qids, questions, answers, labels, max_len=8, seed=0)
    assert batch["labels"].tolist() == [1.0, 1.0, 1.0]
    assert batch["answer_ids"][:, 0].tolist() == [10, 13, 14]
    negatives = batch["negative_ids"][:, 0].tolist()
    assert negatives[0] in (11, 12)  # q1's own negatives
    assert negatives[1] in (10, 11, 12, 15) and negatives[2] in (10, 11, 12, 15)  # q2 has none: other questions
    again = triplet_batch(qids, questions, answers, labels, max_len=8, seed=0)
    assert again["negative_ids"].tolist() == batch["negative_ids"].tolist()
    draws = {
        tuple(triplet_batch(qids, questions, answers, labels, 8, seed)["negative_ids"][:, 0].tolist())
        for seed in range(20)
    }
    assert len(draws) > 1
    filler = triplet_batch(["q1", "q2"], [[1], [2]], [[5], [6]], [0, 0], max_len=8)
    assert filler["labels"].tolist() == [0.0] and filler["negative_ids"].shape[0] == 1


def test_pairwise_training_moves_the_positive_above_the_negative():
    torch.manual_seed(0)
    model = GGSA(GGSAConfig.tiny())
    q, qm, a, am = _inputs()
    negative, negative_mask = a.roll(1, 0), am.roll(1, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = model.loss(model(q, qm, a, am, negative, negative_mask), torch.ones(4))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        positive, negative_sim = model(q, qm, a, am, negative, negative_mask)
    assert (positive > negative_sim + 0.05).all()

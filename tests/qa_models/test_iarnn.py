"""IARNN's GRU cell against the paper's equations (5)-(7) written out step by step, the word and context
attention weights, the Occam penalty (8), and which side each attention reaches."""

import pytest
import torch

from qa_models import MODELS
from qa_models.iarnn import IARNN, AttentiveGRUCell, IARNNConfig


def _reference(cell: AttentiveGRUCell, x, r_q, attention: str, reverse: bool = False):
    """One direction over an unpadded sequence x (L, n), straight from the equations, one step at a time."""
    hidden = cell.hidden
    W_x = cell.x_proj.weight  # (3h, n): rows z, f, h
    W_xz, W_xf, W_xh = W_x[:hidden], W_x[hidden : 2 * hidden], W_x[2 * hidden :]
    b_z, b_f, b_h = cell.bias[:hidden], cell.bias[hidden : 2 * hidden], cell.bias[2 * hidden :]
    W_hz, W_hf = cell.h_gates.weight[:hidden], cell.h_gates.weight[hidden:]
    W_hh = cell.h_candidate.weight
    h = torch.zeros(hidden)
    states, alphas = {}, {}
    for t in reversed(range(len(x))) if reverse else range(len(x)):
        x_t = x[t]
        if attention == "context":
            w_c = cell.context_h.weight @ h + cell.context_q.weight @ r_q  # eq. 6
            alphas[t] = torch.sigmoid(w_c @ x_t)
            x_t = alphas[t] * x_t
        q_z = cell.q_gates.weight[:hidden] @ r_q if attention == "gate" else 0.0
        q_f = cell.q_gates.weight[hidden:] @ r_q if attention == "gate" else 0.0
        z = torch.sigmoid(W_xz @ x_t + b_z + W_hz @ h + q_z)  # eq. 5 / 7
        f = torch.sigmoid(W_xf @ x_t + b_f + W_hf @ h + q_f)
        candidate = torch.tanh(W_xh @ x_t + b_h + W_hh @ (f * h))
        h = (1 - z) * h + z * candidate
        states[t] = h
    return torch.stack([states[t] for t in range(len(x))]), alphas


@pytest.mark.parametrize("attention", ["none", "context", "gate"])
@pytest.mark.parametrize("reverse", [False, True])
def test_cell_equals_the_equations_step_by_step(attention, reverse):
    torch.manual_seed(0)
    cell = AttentiveGRUCell(input_dim=5, hidden=4, question_dim=6, attention=attention)
    x = torch.randn(2, 7, 5)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    r_q = torch.randn(2, 6)
    states, alphas = cell(x, mask, r_q if attention != "none" else None, reverse=reverse)
    for row, length in ((0, 7), (1, 4)):
        expected, expected_alphas = _reference(cell, x[row, :length], r_q[row], attention, reverse)
        torch.testing.assert_close(states[row, :length], expected)
        assert (states[row, length:] == 0).all()
        if attention == "context":
            torch.testing.assert_close(alphas[row, :length], torch.stack([expected_alphas[t] for t in range(length)]))


def test_word_attention_scales_the_answer_words_by_the_question():
    torch.manual_seed(0)
    model = IARNN(IARNNConfig.tiny()).eval()
    ids = torch.randint(4, 64, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    r_q = torch.randn(2, 16)
    _, alpha = model._read(ids, mask, r_q)
    x = model.embed(ids)
    expected = torch.sigmoid(torch.einsum("bd,bld->bl", model.word_attention(r_q), x))  # eq. 4
    torch.testing.assert_close(alpha, expected)
    states, _ = model._read(ids, mask, r_q)
    plain, _ = model._read(ids, mask)
    assert not torch.allclose(states, plain)  # the question changed how the answer was read


def test_occam_penalty_is_max_of_projection_and_floor_times_the_attention_sum():
    torch.manual_seed(0)
    config = MODELS["iarnn-occam-context"].config_class.tiny()
    config.occam_floor = 100.0  # above any w_qp . r_q of a tiny model, so n_p is the floor
    model = MODELS["iarnn-occam-context"](config).eval()
    q, a = torch.randint(4, 64, (2, 5)), torch.randint(4, 64, (2, 8))
    qm, am = torch.ones(2, 5, dtype=torch.bool), torch.ones(2, 8, dtype=torch.bool)
    am[1, 5:] = False
    _, penalty = model.match(q, qm, a, am)
    h_q, _ = model._read(q, qm)
    _, alpha = model._read(a, am, h_q.mean(1))
    torch.testing.assert_close(penalty, 100.0 * alpha.sum(1))
    assert alpha[1, 5:].abs().sum() == 0
    with pytest.raises(ValueError, match="Occam"):
        IARNN(IARNNConfig(**{**IARNNConfig.tiny().__dict__, "attention": "gate", "occam": True}))


def test_the_baselines_pool_plain_states_by_mean_and_by_outer_attention():
    torch.manual_seed(0)
    q, a = torch.randint(4, 64, (2, 5)), torch.randint(4, 64, (2, 8))
    qm, am = torch.ones(2, 5, dtype=torch.bool), torch.ones(2, 8, dtype=torch.bool)
    am[0, 6:] = False
    for name in ("gru", "oarnn"):
        model = MODELS[name](MODELS[name].config_class.tiny()).eval()
        h_q, h_a = model._read(q, qm)[0], model._read(a, am)[0]
        r_q = h_q.mean(1)
        if name == "gru":
            r_a = h_a.sum(1) / am.sum(1, keepdim=True)
        else:  # eq. 2-3: s_t proportional to exp(w_ms . tanh(W_hm h_a(t) + W_qm r_q)), r_a = sum_t s_t h_a(t)
            m = torch.tanh(h_a @ model.outer.answer.weight.T + (r_q @ model.outer.question.weight.T)[:, None])
            s_t = (m @ model.outer.score.weight.T).squeeze(-1).masked_fill(~am, float("-inf")).softmax(-1)
            r_a = (s_t[..., None] * h_a).sum(1)
        expected = torch.nn.functional.cosine_similarity(r_q, r_a, dim=-1)
        torch.testing.assert_close(model(q, qm, a, am), expected)

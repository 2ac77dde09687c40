"""CTRN and its QRNN baseline: the aligned steps t*, the cells against a step-by-step computation, padding
invariance, gradients and determinism on the tiny configuration."""

import torch

from qa_models.ctrn import CTRN, CTRNConfig, aligned_steps
from qa_models.matching import masked_mean
from qa_models.scan import forget_mult_reference


def test_aligned_steps_golden():
    own = torch.tensor([2, 5, 3, 3, 4])
    partner = torch.tensor([5, 2, 7, 4, 4])
    steps = aligned_steps(own, partner, width=5).tolist()
    assert steps[0][:2] == [0, 3]  # shorter: t * ceil(5/2)
    assert steps[1] == [0, 0, 0, 1, 1]  # longer: t // ceil(5/2)
    assert steps[2][:3] == [0, 3, 6]  # ceil(7/3) = 3
    assert steps[3][:3] == [0, 2, 3]  # ceil(4/3) = 2, clamped to the partner's last step
    assert steps[4][:4] == [0, 1, 2, 3]  # equal lengths: step for step


def _batch(seed=0, batch=3, lq=5, la=8, vocab=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(4, vocab, (batch, lq), generator=g)
    a = torch.randint(4, vocab, (batch, la), generator=g)
    q_mask = torch.ones(batch, lq, dtype=torch.bool)
    a_mask = torch.ones(batch, la, dtype=torch.bool)
    q_mask[1, 3:] = False
    a_mask[2, 5:] = False
    return q.masked_fill(~q_mask, 0), q_mask, a.masked_fill(~a_mask, 0), a_mask


def test_cells_equal_the_step_by_step_equations():
    torch.manual_seed(0)
    model = CTRN(CTRNConfig.tiny()).eval()
    q, q_mask, a, a_mask = _batch()
    i = 0  # one full-length example: question 5 steps, answer 8 (ratio 2)
    zq, fq, oq = model._encode(q[i : i + 1])
    za, fa, oa = model._encode(a[i : i + 1])
    c_q = forget_mult_reference(fq, zq)
    steps = [min(t * 2, 7) for t in range(5)]  # t* = t * ceil(8 / 5)
    c_qx = forget_mult_reference(fa[:, steps], zq)
    expected_q = ((oq * c_q) * (oa[:, steps] * c_qx)).mean(1)  # (1, d)
    got = masked_mean(model._cells((zq, fq, oq), (za, fa, oa), q_mask[i : i + 1], a_mask[i : i + 1]), q_mask[i : i + 1])
    torch.testing.assert_close(got, expected_q)
    qrnn = CTRN(CTRNConfig.tiny()).eval()
    qrnn.config.cross = False
    torch.testing.assert_close(qrnn._cells((zq, fq, oq), None, q_mask[i : i + 1], None), oq * c_q)


def test_padding_does_not_change_scores_and_gradients_are_finite():
    for cross in (True, False):
        torch.manual_seed(1)
        cfg = CTRNConfig.tiny()
        cfg.cross = cross
        model = CTRN(cfg).eval()
        q, q_mask, a, a_mask = _batch()
        logits = model(q, q_mask, a, a_mask)

        def pad(x, n):
            return torch.cat([x, torch.zeros(x.size(0), n, dtype=x.dtype)], 1)

        padded = model(pad(q, 4), pad(q_mask, 4), pad(a, 7), pad(a_mask, 7))
        torch.testing.assert_close(logits, padded)
        model.train()
        loss = model.loss(model(q, q_mask, a, a_mask), torch.tensor([1, 0, 1]))
        loss.backward()
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        assert trainable and all(p.grad is not None and torch.isfinite(p.grad).all() for _, p in trainable)
        assert not model.embed.weight.requires_grad  # fixed embeddings, learned through the projection


def test_same_seed_same_model_and_scores():
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = CTRN(CTRNConfig.tiny()).eval()
        outs.append(CTRN.score(model(*_batch())))
    torch.testing.assert_close(outs[0], outs[1])
    assert ((outs[0] > 0) & (outs[0] < 1)).all()


def test_the_gates_are_the_causal_convolution_of_eq_1():
    """QuasiRecurrentGates applies its Conv1d's weights as matrix products over shifted copies of x: the same Z, F,
    O as the convolution itself (left-padded by k - 1, so step t sees steps t-k+1..t), for widths 1 to 3."""
    import torch.nn.functional as F

    from qa_models.ctrn import QuasiRecurrentGates

    torch.manual_seed(0)
    for k in (1, 2, 3):
        gates = QuasiRecurrentGates(16, 8, k).double()
        x = torch.randn(3, 7, 16, dtype=torch.double)
        h = gates.conv(F.pad(x.transpose(1, 2), (k - 1, 0))).transpose(1, 2)  # (B, L, 3d)
        z, f, o = h.chunk(3, dim=-1)
        for ours, expected in zip(gates(x), (torch.tanh(z), torch.sigmoid(f), torch.sigmoid(o))):
            torch.testing.assert_close(ours, expected)
            assert ours.is_contiguous()

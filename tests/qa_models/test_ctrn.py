"""CTRN and its QRNN baseline: the aligned steps t*, the cells against a step-by-step computation, padding
invariance, gradients and determinism on the tiny configuration; the fused CPU kernel of the cells and their
pooling against the cells composed from torch operations."""

import pytest
import torch

from qa_models import ctrn
from qa_models.ctrn import CTRN, CTRNConfig, aligned_steps
from qa_models.matching import masked_mean
from qa_models.scan import ctrn_cells, forget_mult_reference, fused_cells_for, native_library


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
    zq, fq, oq = model.gates(model.project(model.embed(q[i : i + 1])))
    za, fa, oa = model.gates(model.project(model.embed(a[i : i + 1])))
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


def test_the_gates_per_distinct_word_equal_the_convolution_over_the_projected_vectors():
    """word_pre_activations (the fused path's gates: each distinct word's products once, gathered to its steps)
    against the convolution over P e + b_p, for widths 1 to 3, two texts of different lengths sharing words,
    padding, and trainable word vectors: the same sums, and the same gradients for every parameter."""
    import torch.nn.functional as F

    from qa_models.ctrn import QuasiRecurrentGates
    from qa_models.encoders import word_embedding_table

    torch.manual_seed(0)
    for k in (1, 2, 3):
        embed = word_embedding_table(12, 10, freeze=False).double()
        project = torch.nn.Linear(10, 16).double()
        gates = QuasiRecurrentGates(16, 8, k).double()
        q = torch.randint(1, 6, (3, 5))  # five words over 15 steps: every one repeats
        a = torch.randint(1, 12, (3, 9))
        q[1, 3:], a[2, 6:] = 0, 0  # padding
        got = gates.word_pre_activations([q, a], embed, project)

        def convolved(ids, embed=embed, project=project, gates=gates, k=k):
            x = project(embed(ids)).transpose(1, 2)  # (B, m, L)
            return gates.conv(F.pad(x, (k - 1, 0))).transpose(1, 2)  # (B, L, 3d)

        expected = [convolved(q), convolved(a)]
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
        weights = [torch.randn_like(e) for e in expected]
        params = [*embed.parameters(), *project.parameters(), *gates.parameters()]
        grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights)), params)
        wanted = torch.autograd.grad(sum((e * w).sum() for e, w in zip(expected, weights)), params)
        for g, e in zip(grads, wanted):
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


needs_kernel = pytest.mark.skipif(native_library() is None, reason="no C compiler here: the cells are composed")


def _composed(model, gates_q, gates_a, q_mask, a_mask):
    """The cells as `CTRN._cells` composes them, then masked_mean: the definition the kernel is held to."""
    d = gates_q.size(-1) // 3

    def activated(g):
        return torch.tanh(g[..., :d]), torch.sigmoid(g[..., d : 2 * d]), torch.sigmoid(g[..., 2 * d :])

    q, a = activated(gates_q), activated(gates_a)
    return (
        masked_mean(model._cells(q, a, q_mask, a_mask), q_mask),
        masked_mean(model._cells(a, q, a_mask, q_mask), a_mask),
    )


@needs_kernel
@pytest.mark.parametrize("cross", [True, False])
def test_the_fused_cells_equal_the_composed_cells_and_their_gradients(cross):
    torch.manual_seed(0)
    d, (lq, la) = 5, (6, 11)
    model = CTRN(CTRNConfig.tiny()).double()
    model.config.cross = cross
    gates_q = torch.randn(4, lq, 3 * d, dtype=torch.float64, requires_grad=True)
    gates_a = torch.randn(4, la, 3 * d, dtype=torch.float64, requires_grad=True)
    lengths_q, lengths_a = torch.tensor([6, 3, 1, 6]), torch.tensor([11, 9, 2, 4])  # shorter, longer, both ways
    q_mask = torch.arange(lq)[None] < lengths_q[:, None]
    a_mask = torch.arange(la)[None] < lengths_a[:, None]
    steps_q, steps_a = aligned_steps(lengths_q, lengths_a, lq), aligned_steps(lengths_a, lengths_q, la)

    def fused(gq, ga):  # the kernel activates its gates in place: give it a product's fresh output, as CTRN does
        return ctrn_cells(gq * 1, ga * 1, q_mask, a_mask, steps_q, steps_a, cross)

    got, expected = fused(gates_q, gates_a), _composed(model, gates_q, gates_a, q_mask, a_mask)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    weights = [torch.randn_like(p) for p in got]
    grads = torch.autograd.grad(sum((p * w).sum() for p, w in zip(got, weights)), (gates_q, gates_a))
    wanted = torch.autograd.grad(sum((p * w).sum() for p, w in zip(expected, weights)), (gates_q, gates_a))
    for g, e in zip(grads, wanted):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    padded = grads[0].reshape(4, lq, 3, d)[~q_mask]  # a padded step's gates get nothing
    assert padded.abs().max() == 0
    assert torch.autograd.gradcheck(fused, (gates_q, gates_a))


@needs_kernel
def test_ctrn_trains_the_same_with_the_fused_kernel_as_with_composed_cells(monkeypatch):
    q, q_mask, a, a_mask = _batch(seed=4, lq=7, la=12)
    results = []
    for kernel in (fused_cells_for, lambda gates: None):
        monkeypatch.setattr(ctrn, "fused_cells_for", kernel)
        torch.manual_seed(2)
        model = CTRN(CTRNConfig.tiny())
        loss = model.loss(model(q, q_mask, a, a_mask), torch.tensor([1, 0, 1]))
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters() if p.requires_grad]))
    (loss, grads), (loss_composed, grads_composed) = results
    torch.testing.assert_close(loss, loss_composed)
    for g, e in zip(grads, grads_composed):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_the_fused_kernel_is_for_float_cpu_tensors_and_refuses_others():
    assert fused_cells_for(torch.zeros(1, 2, 3, dtype=torch.bfloat16)) is None  # composed: half precision
    if native_library() is None:
        return
    assert fused_cells_for(torch.zeros(1, 2, 3)) == "ctrn_cells_f32"
    mask, steps = torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="contiguous"):
        ctrn_cells(torch.zeros(1, 3, 2).transpose(1, 2), torch.zeros(1, 2, 3), mask, mask, steps, steps)
    with pytest.raises(ValueError, match=r"\(B, L, 3d\)"):
        ctrn_cells(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), mask, mask, steps, steps)
    with pytest.raises(ValueError, match=r"answer's aligned steps must lie in \[0, 2\)"):
        ctrn_cells(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), mask, mask, steps, steps + 2)
    with pytest.raises(ValueError, match=r"question's mask and steps must be \(1, 2\)"):
        ctrn_cells(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), mask[:, :1], mask, steps, steps)
    model = CTRN(CTRNConfig.tiny()).eval()  # scoring: no graph, the same kernel
    batch = _batch()
    with torch.inference_mode():
        scored = model(*batch)
    torch.testing.assert_close(scored, model(*batch).detach())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # half precision: the composed cells
        low = model(*batch)
    torch.testing.assert_close(low.float(), scored, rtol=0.05, atol=0.05)

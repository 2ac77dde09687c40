"""The QRNN/CTRN forget-mult recurrence: the in-place loop with a hand-written backward against the step-by-step
definition under autograd (values and every gradient), gradcheck in double precision, and padding."""

import torch

from qa_models.scan import forget_mult, forget_mult_reference, masked_forget


def _inputs(batch=3, length=7, dim=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    f = torch.sigmoid(torch.randn(batch, length, dim, generator=g, dtype=dtype)).requires_grad_()
    z = torch.tanh(torch.randn(batch, length, dim, generator=g, dtype=dtype)).requires_grad_()
    c0 = torch.randn(batch, dim, generator=g, dtype=dtype).requires_grad_()
    return f, z, c0


def test_forget_mult_equals_the_sequential_definition_values_and_gradients():
    f, z, c0 = _inputs()
    weights = torch.randn(3, 7, 5, dtype=torch.float64)
    fast = forget_mult(f, z, c0)
    slow = forget_mult_reference(f, z, c0)
    torch.testing.assert_close(fast, slow)
    fast_grads = torch.autograd.grad((fast * weights).sum(), (f, z, c0))
    slow_grads = torch.autograd.grad((slow * weights).sum(), (f, z, c0))
    for a, b in zip(fast_grads, slow_grads):
        torch.testing.assert_close(a, b)


def test_forget_mult_gradcheck_and_default_initial_state():
    f, z, c0 = _inputs(batch=2, length=4, dim=3)
    assert torch.autograd.gradcheck(forget_mult, (f, z, c0))
    torch.testing.assert_close(forget_mult(f, z), forget_mult_reference(f, z))
    # a hand-worked case: f = 0.5 everywhere, z = 1, c0 = 0 gives c_t = 1 - 0.5^t
    half = torch.full((1, 3, 1), 0.5)
    assert forget_mult(half, torch.ones(1, 3, 1)).flatten().tolist() == [0.5, 0.75, 0.875]


def test_padded_steps_carry_the_state_and_get_no_gradient():
    f, z, _ = _inputs(batch=2, length=6, dim=4)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    c = forget_mult(masked_forget(f, mask), z)
    torch.testing.assert_close(c[1, 4], c[1, 3])
    torch.testing.assert_close(c[1, 5], c[1, 3])
    short = forget_mult(f[1:, :4], z[1:, :4])
    torch.testing.assert_close(c[1, :4], short[0])
    (grad_z,) = torch.autograd.grad(c[:, 3].sum(), (z,))
    assert not grad_z[1, 4:].any()


def _native_or_skip():
    import pytest

    from qa_models.scan import native_library

    if native_library() is None:
        pytest.skip("no C compiler here (or QA_MODELS_NATIVE=0): the forget-mult C kernel was not built")


def test_the_c_kernel_equals_the_torch_loop_and_the_definition_in_both_precisions():
    _native_or_skip()
    for dtype, tolerance in ((torch.float64, {}), (torch.float32, {"rtol": 1e-5, "atol": 1e-6})):
        # 8 x 40 x 600 is split over threads; 2 x 5 x 3 runs on one
        for shape in ((2, 5, 3), (8, 40, 600)):
            f, z, c0 = _inputs(*shape, dtype=dtype)
            weights = torch.randn(shape, dtype=dtype)
            native = forget_mult(f, z, c0)
            loop = forget_mult(f, z, c0, kernel="torch")
            slow = forget_mult_reference(f, z, c0)
            torch.testing.assert_close(native, slow, **tolerance)
            torch.testing.assert_close(native, loop, **tolerance)
            grads = [torch.autograd.grad((c * weights).sum(), (f, z, c0)) for c in (native, loop, slow)]
            for native_grad, loop_grad, slow_grad in zip(*grads):
                torch.testing.assert_close(native_grad, slow_grad, **tolerance)
                torch.testing.assert_close(native_grad, loop_grad, **tolerance)


def test_the_c_kernel_passes_gradcheck_and_takes_non_contiguous_gradients():
    _native_or_skip()
    f, z, c0 = _inputs(batch=2, length=4, dim=3)
    assert torch.autograd.gradcheck(forget_mult, (f, z, c0))
    c = forget_mult(f, z, c0)
    # a gradient that is a broadcast view (stride 0) must be read as the values it stands for
    (grad_f,) = torch.autograd.grad(c, (f,), grad_outputs=torch.ones(1, 1, 1, dtype=c.dtype).expand_as(c))
    (expected,) = torch.autograd.grad(forget_mult_reference(f, z, c0).sum(), (f,))
    torch.testing.assert_close(grad_f, expected)


def test_other_dtypes_fall_back_to_the_torch_loop():
    f, z, c0 = _inputs(batch=2, length=5, dim=4, dtype=torch.bfloat16)
    torch.testing.assert_close(forget_mult(f, z, c0), forget_mult(f, z, c0, kernel="torch"))
    import pytest

    with pytest.raises(ValueError, match="kernel must be"):
        forget_mult(f, z, c0, kernel="cuda")


def _triton_or_skip():
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the forget-mult Triton kernel runs only on one")
    from qa_models.scan import _triton_kernel

    if _triton_kernel() is None:
        pytest.skip("Triton is not installed (or QA_MODELS_NATIVE=0): the forget-mult Triton kernel is not used")


def test_the_triton_kernel_equals_the_definition_on_cuda():
    _triton_or_skip()
    # 300 channels: a program's block of 128 runs past the end of the last one (masked); float64 keeps the loop
    from qa_models.scan import _native_for

    for shape in ((2, 5, 3), (16, 400, 300)):
        f, z, c0 = (t.detach().cuda().requires_grad_() for t in _inputs(*shape, dtype=torch.float32))
        assert _native_for(f, z, c0) == "triton"
        weights = torch.randn(shape, device="cuda")
        tolerance = {"rtol": 1e-5, "atol": 1e-5}
        kernel = forget_mult(f, z, c0)
        slow = forget_mult_reference(f, z, c0)
        torch.testing.assert_close(kernel, slow, **tolerance)
        for kernel_grad, slow_grad in zip(
            torch.autograd.grad((kernel * weights).sum(), (f, z, c0)),
            torch.autograd.grad((slow * weights).sum(), (f, z, c0)),
        ):
            torch.testing.assert_close(kernel_grad, slow_grad, **tolerance)
    # bf16 in and out (autocast), float32 arithmetic inside: within bf16's rounding of the float32 definition
    f, z, c0 = (t.detach().cuda() for t in _inputs(4, 64, 256, dtype=torch.float32))
    low = forget_mult(f.bfloat16(), z.bfloat16(), c0.bfloat16())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), forget_mult_reference(f, z, c0), rtol=2e-2, atol=2e-2)

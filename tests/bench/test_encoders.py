"""bench/encoders.py's cases: each builds the layer it names and takes a training step, and the cases of a plotted
family are the lines of the results page's efficiency plot (a case left unnamed there is dropped silently, and the
runner asks for a record of every line)."""

from __future__ import annotations

import pytest
import torch

from bench.encoders import BUILDERS, VARIANTS, _ratio
from experiments.rows import EFFICIENCY_PLOTS


@pytest.mark.parametrize("variant", VARIANTS["dynsan"])
def test_every_dynsan_case_takes_a_step_with_a_gradient_for_its_input(variant):
    torch.manual_seed(0)
    step, extra = BUILDERS["dynsan"](variant, 48)
    loss = step()
    loss.backward()
    assert extra == {"batch": 1} and torch.isfinite(loss)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(),
                reason="no CUDA device: the GPU cases (--device cuda) run where one is present",
            ),
        ),
    ],
)
@pytest.mark.parametrize("family", ["ggsa", "dynsan"])
def test_attention_cases_build_on_the_device_they_are_given(family, device):
    # --device cuda hands every family's builder the device (DynSAN's Table 4 is a GPU measure); a tensor left on
    # the CPU would fail there with torch's device mismatch, or time the CPU
    for variant in VARIANTS[family]:
        step, _ = BUILDERS[family](variant, 48, device)
        loss = step()
        loss.backward()
        assert loss.device.type == device and torch.isfinite(loss), variant


@pytest.mark.parametrize("family", sorted(EFFICIENCY_PLOTS))
def test_every_benchmarked_case_of_a_plotted_family_has_a_line_and_every_line_a_case(family):
    # the runner takes the plots' cases for the ones the benchmark measures (experiments.runner.efficiency_cases_due)
    assert set(VARIANTS[family]) == set(EFFICIENCY_PLOTS[family][1])


def test_a_ratio_is_theirs_over_ours_at_one_length():
    cases = [
        {"family": "dynsan", "variant": "dynsa", "length": 4096, "seconds": 0.05, "peak_mb": 100.0},
        {"family": "dynsan", "variant": "biblosa", "length": 4096, "seconds": 0.6, "peak_mb": 450.0},
        {"family": "dynsan", "variant": "biblosa", "length": 1024, "seconds": 0.1, "peak_mb": 90.0},
    ]
    assert _ratio(cases, "dynsan", 4096, "dynsa", "biblosa") == 12.0
    assert _ratio(cases, "dynsan", 4096, "dynsa", "biblosa", "peak_mb") == 4.5
    assert _ratio(cases, "dynsan", 2048, "dynsa", "biblosa") is None

"""Ports for the servers a private local Ray starts: free, and out of the way of what another Ray takes; GPU
requests that such a Ray could never place."""

from __future__ import annotations

import os
import socket

import pytest

from runtime import ray_env
from runtime.checks import UsageError


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_free_port_lies_between_rays_worker_ports_and_the_ephemeral_range():
    """A port from bind(0) is an ephemeral one, which another local Ray starting at the same moment took before Ray
    bound it (`Failed to bind to 127.0.0.1:35699 because it's already occupied`, a training test beside another
    job); ports between Ray's worker ports (to 19999) and the ephemeral range are taken only when asked for."""
    start = ray_env.ephemeral_start()
    ports = [ray_env.free_port() for _ in range(50)]
    assert all(ray_env.RAY_WORKER_PORTS_END < port < start for port in ports), (start, ports)
    assert len(set(ports)) > 40 and all(_bindable(port) for port in ports)  # drawn at random, and free


def test_a_port_in_use_is_passed_over(monkeypatch):
    import random

    first = ray_env.free_port()
    second = next(port for port in iter(ray_env.free_port, None) if port != first)
    draws = iter([first, second])

    class Drawn:  # the draws this test chooses: the taken port first
        def choice(self, _):
            return next(draws)

    monkeypatch.setattr(random, "SystemRandom", Drawn)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        assert ray_env.free_port() == second


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ray_env, "ephemeral_start", lambda: ray_env.RAY_WORKER_PORTS_END + 10)
    port = ray_env.free_port()
    assert _bindable(port)


@pytest.mark.parametrize(
    "gpus, per_unit, units, placed",
    [
        (0, 1.0, 1, False),
        (0, 0.25, 1, False),
        (1, 1.0, 1, True),
        (1, 0.5, 2, True),  # two halves share the GPU
        (1, 0.111, 9, True),  # the offline GPU runner's nine lanes
        (1, 0.5, 3, False),
        (2, 0.6, 3, False),  # 1.8 GPUs in all, but a GPU holds one 0.6 only
        (3, 0.6, 3, True),
        (2, 2.0, 1, True),  # more than one GPU: whole GPUs
        (2, 1.5, 1, True),
        (2, 1.5, 2, False),
    ],
)
def test_a_gpu_request_is_refused_where_a_local_ray_could_never_place_it(monkeypatch, gpus, per_unit, units, placed):
    """Measured before: train --use-gpu on a machine without a GPU waited for ever (Ray Train's worker group timed
    out and started again every minute, a traceback each time); score --num-gpus-per-actor 1 and build
    --mine-gpus 1 waited until killed. A local Ray has this machine's GPUs and no more."""
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    options = "--num-workers, --gpus-per-worker"
    if placed:
        ray_env.check_fits_local_ray("--use-gpu", units, "worker", options, gpus=per_unit)
        return
    with pytest.raises(UsageError) as refused:
        ray_env.check_fits_local_ray("--use-gpu", units, "worker", options, gpus=per_unit)
    said = str(refused.value)
    assert said.startswith("--use-gpu: ") and "(--num-workers, --gpus-per-worker) cannot be placed" in said
    assert (f"this machine has {gpus}," if gpus else "this machine has none that CUDA sees") in said


@pytest.mark.parametrize(
    "num_cpus, per_unit, units, placed",
    [
        (2, 1.0, 2, True),
        (2, 2.0, 1, True),
        (2, 3.0, 1, False),
        (2, 0.25, 9, False),
        (4, 0.25, 9, True),
        (None, 3, 1, None),
    ],
)
def test_a_cpu_request_is_refused_where_a_local_ray_could_never_place_it(
    monkeypatch, num_cpus, per_unit, units, placed
):
    """Measured before: train --cpus-per-worker 3 under a local Ray of 2 CPUs waited for ever, as --use-gpu did.
    Without --num-cpus the local Ray has what Ray counts on this machine."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if placed is None:  # every core: as Ray counts them
        from ray._private.utils import get_num_cpus

        assert ray_env.local_cpus(None) == get_num_cpus()
        placed = per_unit * units <= get_num_cpus()
    check = {"cpus": per_unit, "num_cpus": num_cpus}
    if placed:
        ray_env.check_fits_local_ray("--cpus-per-worker", units, "worker", "--num-workers, --cpus-per-worker", **check)
        return
    with pytest.raises(UsageError) as refused:
        ray_env.check_fits_local_ray("--cpus-per-worker", units, "worker", "--num-workers, --cpus-per-worker", **check)
    said = str(refused.value)
    assert said.startswith("--cpus-per-worker: ") and "CPU" in said and "cannot be placed" in said
    have = f"{num_cpus:g} CPUs (--num-cpus)" if num_cpus else f"{ray_env.local_cpus():g} CPUs (every core of this"
    assert f"the local Ray the job starts has {have}" in said


def test_a_request_stands_on_a_cluster_which_may_add_nodes(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ray_env.check_fits_local_ray("--use-gpu", 8, "worker", gpus=1.0, cpus=64.0)
    monkeypatch.delenv("RAY_ADDRESS")
    ray_env.check_fits_local_ray("--mine-gpus", gpus=0.0)  # nothing asked for
    with pytest.raises(UsageError, match=r"^--mine-gpus: one mining task of 1 GPU cannot be placed"):
        ray_env.check_fits_local_ray("--mine-gpus", unit="mining task", gpus=1.0)


def test_a_ray_address_where_nothing_answers_is_named_at_once():
    """ray.init retried RAY_ADDRESS=127.0.0.1:1 for ever, a warning every 40 s (a cluster taken down, the variable
    left set); nothing listening there is one line naming it."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(UsageError, match=rf"^RAY_ADDRESS={address}: no Ray cluster answers there"):
            ray_env.check_ray_address(address)
    with socket.socket() as listening:  # what a cluster's GCS (or Ray Client server) does: accept connections
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        ray_env.check_ray_address(f"127.0.0.1:{listening.getsockname()[1]}")
    for address in ("auto", "http://127.0.0.1:1", "local"):  # Ray's to read: it names these at once itself
        ray_env.check_ray_address(address)


def test_ray_datas_no_free_cpu_warning_stays_off_the_console(monkeypatch, capfd):
    """Ray Data says it as each materialisation ends, while the stage's own actor pool gives back its CPUs;
    pipelines.blocks.materialize says it where it is true (tests/pipelines/test_blocks.py)."""
    import logging

    from ray.data._internal import logging as data_logging

    monkeypatch.delenv(data_logging.RAY_DATA_LOGGING_CONFIG_ENV_VAR_NAME, raising=False)
    ray_env._quiet_ray_data_logging()
    log = logging.getLogger("ray.data.dataset")
    log.warning(
        "Warning: The Ray cluster currently does not have any available CPUs. The Dataset job will hang unless "
        "more CPUs are freed up."
    )
    log.warning("Ray Data's other warnings stay")
    err = capfd.readouterr().err
    assert "available CPUs" not in err
    assert "other warnings stay" in err


def test_ray_trains_preemption_watcher_is_off_on_a_private_instance_and_a_users_setting_wins(monkeypatch):
    """Ray Train reads the variable by this name and passes it from the driver to its controller (a rename in a
    Ray upgrade fails here, not silently); init_local_ray sets it off unless the user set it."""
    import ray
    from ray.train.v2._internal import constants as train_constants

    assert ray_env.PREEMPTION_WATCHER_ENV == train_constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR
    assert ray_env.PREEMPTION_WATCHER_ENV in train_constants.ENV_VARS_TO_PROPAGATE
    started = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.append(kwargs))
    for users, expected in ((None, "0"), ("1", "1")):
        environment = {k: v for k, v in os.environ.items() if k != ray_env.PREEMPTION_WATCHER_ENV}
        if users is not None:
            environment[ray_env.PREEMPTION_WATCHER_ENV] = users
        monkeypatch.setattr("os.environ", environment)
        ray_env.init_local_ray(num_cpus=1, include_dashboard=False)
        assert environment[ray_env.PREEMPTION_WATCHER_ENV] == expected
    assert [kwargs["address"] for kwargs in started] == ["local", "local"]

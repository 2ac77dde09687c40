"""Ports for the servers a private local Ray starts: free, and out of the way of what another Ray takes."""

from __future__ import annotations

import socket

from runtime import ray_env


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

"""Shared fixtures: the real data in ../shared/data, one local Ray per session, a loopback HTTP server."""
from __future__ import annotations

import logging
import os
import signal

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("QA_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))


@pytest.fixture(scope="session")
def shared_data() -> str:
    """`../shared/data` beside the clone (or $QA_SHARED_DATA); tests that need it skip where it is absent."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"real data not found at {SHARED_DATA} (clone next to shared/ or set QA_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def beer_dump(shared_data) -> str:
    path = os.path.join(shared_data, "stackexchange_dump_beer", "Posts.xml.gz")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray instance, started once per test session and shut down at its end."""
    import ray
    from ray.data import DataContext

    from runtime.ray_env import init_local_ray

    init_local_ray(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture
def http_server():
    """A real HTTP server on 127.0.0.1 (never the internet) with fault injection: see tests/fakeweb.py."""
    from tests.fakeweb import FakeWeb

    web = FakeWeb()
    yield web
    web.close()


def kill_session(session_id: int) -> None:
    """SIGKILL every process of a session: the driver and the Ray instance it started, like a crash."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id:
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            pass

"""Starting or joining Ray for a job, and stopping only what the job started.

Under `ray job submit` (RAY_ADDRESS is set) a job joins the cluster; run directly it starts a private local
instance and shuts it down on exit. `ray stop` would kill every Ray process on the machine, so it is never
used.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys


# Memory allocators for Ray workers. With Arrow's default (mimalloc) and glibc's arena per thread, a worker
# that has run a few large tasks keeps their memory while idle: measured on a 500k-post StackExchangeQA build
# (bench/stackexchangeqa.py), idle workers held 1,160 MB of heap; with these, 170 MB, and the build ran 8%
# faster. Variables a job already sets win.
WORKER_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}


# Ray settings of a private local instance (a laptop, a test), read by the raylet from its environment. Spill
# and restore workers: Ray's default is up to 4 of each, each a Python process; measured building StackExchangeQA
# from 1M posts with a 0.5 GB object store (bench/stackexchangeqa.py), they held 244 MB of heap at the peak, and
# 43 MB with one of each, and the build's heaps went from 1.28x to 1.06x those of a 100k-post build, at the same
# throughput. On one machine's disk, more spill workers do not spill faster. A cluster keeps its own setting.
LOCAL_RAY_ENV = {"RAY_max_io_workers": "1"}


def worker_env() -> dict[str, str]:
    """WORKER_ENV less what this process's environment (for a submitted job, its runtime env) already sets."""
    return {k: v for k, v in WORKER_ENV.items() if k not in os.environ}


def init_local_ray(**kwargs) -> None:
    """`ray.init` of a private local instance whose workers use WORKER_ENV (they inherit the raylet's
    environment, which is this process's).

    Always a new instance (address "local"): without it `ray.init` joins whatever cluster the last `ray start`
    or `ray.cluster_utils.Cluster` on this machine recorded in /tmp/ray/ray_current_cluster, even a dead one,
    and then refuses num_cpus."""
    import ray

    os.environ.update(worker_env())
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
    ray.init(address="local", **kwargs)


def forget_recorded_cluster(gcs_address: str) -> None:
    """Remove /tmp/ray/ray_current_cluster (Ray's temp dir) if it records the cluster at `gcs_address`: `ray start
    --head` and `ray.cluster_utils.Cluster` write it and leave it behind, and a later plain `ray.init()` would try
    to join the dead cluster. Matched by port, since the record names the node's IP where callers may know the
    cluster as 127.0.0.1; another cluster's record is left alone."""
    from ray._private.utils import get_ray_address_file

    path = get_ray_address_file(None)
    with contextlib.suppress(OSError):
        with open(path) as f:
            recorded = f.read().strip()
        if recorded.rsplit(":", 1)[-1] == gcs_address.rsplit(":", 1)[-1]:
            os.remove(path)


@contextlib.contextmanager
def ray_session(num_cpus: int | None = None, quiet: bool = True, state_api: bool = False):
    """Join the cluster named by RAY_ADDRESS, or start (and later stop) a private local Ray.

    `state_api`: start the local instance's dashboard, which serves Ray's State API. Ray Train needs it: its
    detached PlacementGroupCleaner asks the State API every second whether the training controller is alive,
    and without a dashboard each question fails with a warning ("Failed to query Ray Train Controller actor
    state"), dozens of lines a minute. Jobs that only use Ray Data leave it off (one process fewer)."""
    import ray
    from ray.data import DataContext

    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": state_api, "logging_level": logging.WARNING} if quiet else {}
        if os.environ.get("RAY_ADDRESS"):
            # Ray merges this with the submitted job's runtime env; worker_env() leaves out what the job set,
            # so the two never conflict.
            ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING,
                     runtime_env={"env_vars": worker_env()})
        else:
            init_local_ray(num_cpus=num_cpus, **kwargs)
            started = True
    context = DataContext.get_current()
    context.enable_progress_bars = sys.stderr.isatty()
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def unwrap(error: BaseException) -> BaseException:
    """The user's exception inside a Ray task error, so a job prints 'file: line: reason', not a stack of wrappers."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        cause = getattr(error, "cause", None) or error.__cause__
        if cause is None:
            break
        error = cause
    return error


def run_on_ray(job: str, work, num_cpus: int | None = None, state_api: bool = False):
    """Run `work()` inside `ray_session`; return (result, 0), or print one clear line and return (None, 1)."""
    try:
        with ray_session(num_cpus, state_api=state_api):
            return work(), 0
    except Exception as err:  # one line naming the file or row, not Ray's wrapped traceback
        print(f"{job}: error: {unwrap(err)}", file=sys.stderr)
        return None, 1

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


@contextlib.contextmanager
def ray_session(num_cpus: int | None = None, quiet: bool = True):
    import ray
    from ray.data import DataContext

    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "logging_level": logging.WARNING} if quiet else {}
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=num_cpus, **kwargs)
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


def run_on_ray(job: str, work, num_cpus: int | None = None):
    """Run `work()` inside `ray_session`; return (result, 0), or print one clear line and return (None, 1)."""
    try:
        with ray_session(num_cpus):
            return work(), 0
    except Exception as err:  # one line naming the file or row, not Ray's wrapped traceback
        print(f"{job}: error: {unwrap(err)}", file=sys.stderr)
        return None, 1

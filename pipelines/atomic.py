"""Outputs that appear whole or not at all: build in a sibling staging folder, then rename into place."""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid


@contextlib.contextmanager
def staged_dir(target: str):
    """Yield an empty staging folder beside `target`; on success it replaces `target`, on error it is removed.

    Staging folders left by a killed run are removed first. A previous `target` is moved aside before the
    swap and deleted after it, so a crash at any point leaves either the old or the new output.
    """
    target = os.path.abspath(target)
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    for stale in os.listdir(parent):
        if stale.startswith(name + ".partial-") or stale.startswith(name + ".old-"):
            shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
    staging = os.path.join(parent, f"{name}.partial-{uuid.uuid4().hex[:8]}")
    os.makedirs(staging)
    try:
        yield staging
        old = None
        if os.path.exists(target):
            old = os.path.join(parent, f"{name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(target, old)
        os.rename(staging, target)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)

"""Stopping a training run on a signal, with a checkpoint: SIGINT or SIGTERM to the job (Ctrl-C, `ray job stop`,
Kubernetes evicting the submitter) becomes a request in Ray's key-value store (kept by the GCS, which every
worker of the cluster reaches and which lives as long as the driver's head node), that rank 0 reads between steps.

No process of its own: a request costs one key, and rank 0 reads it at most once a second (a GCS round trip of
about a millisecond). The training loop decides what the request means (training/loop.py: a checkpoint at the
next step, then every worker stops)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from typing import Any

NAMESPACE = "qa-at-scale-stop"


def new_key() -> str:
    """The key of one run's stop request."""
    return uuid.uuid4().hex


def request_stop(key: str, reason: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, reason.encode(), overwrite=False, namespace=NAMESPACE)


def forget(key: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=NAMESPACE)


class StopWatch:
    """The worker's view of its run's stop request: read at most once every `every` seconds."""

    def __init__(self, key: str | None, every: float = 1.0):
        self.key, self.every, self.read_at = key, every, 0.0
        self.reason: str | None = None

    def requested(self) -> str | None:
        """The signal's name ("SIGINT", "SIGTERM") once the driver received one, else None."""
        if self.key is None or self.reason or time.time() - self.read_at < self.every:
            return self.reason
        from ray.experimental import internal_kv

        self.read_at = time.time()
        value = internal_kv._internal_kv_get(self.key, namespace=NAMESPACE)
        self.reason = value.decode() if value else None
        return self.reason


def fit_until_signalled(trainer, key: str, log) -> tuple[Any, str | None]:
    """`trainer.fit()`, with SIGINT and SIGTERM turned into a stop request under `key`: the workers save a
    checkpoint at their next step and return. A second signal stops at once, without one (KeyboardInterrupt, its
    `signum` set). Returns (result, the first signal's name or None).

    fit() runs in a thread of its own, so that the signals reach this (main) thread's handlers: Ray Train's own
    SIGINT handler, which it installs only from the main thread, aborts the workers without a checkpoint."""
    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        return trainer.fit(), None
    outcome: dict = {}
    received: list[str] = []

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    def on_signal(signum, frame) -> None:
        name = signal.Signals(signum).name
        if received:
            stop_now = KeyboardInterrupt(f"{name} again: stopped without a checkpoint")
            stop_now.signum = signum  # type: ignore[attr-defined]  # the exit status the job gives (128 + signum)
            raise stop_now
        received.append(name)
        log(f"[train] {name}: saving a checkpoint at the next step, then stopping ({name} again stops at once)")
        request_stop(key, name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=fit, name="train-fit", daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with contextlib.suppress(Exception):  # a request left behind is one key, named by a fresh uuid
            forget(key)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"], (received[0] if received else None)

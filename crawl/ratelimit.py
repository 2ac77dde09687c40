"""Request budgets shared by every crawler process: per-key minimum spacing and "not before" times.

A key is a host ("stackoverflow.com") or an API method ("api.stackexchange.com/questions"). `Schedule`
hands out start times: each call reserves the next free slot of its key, so N workers asking at once are
spread `1/rate` apart instead of all firing. `hold(key, until)` blocks a key, for example for the API's
`backoff` field or a 429's `Retry-After`.

On a cluster the schedule lives in one named Ray actor (`RateLimiterActor`), so the budget holds across all
workers of all nodes, not per worker; `SharedLimiter` is the client tasks carry. `LocalLimiter` is the same
schedule in-process, for use without Ray.
"""

from __future__ import annotations

import threading
import time


class Schedule:
    """Slots per key at least `1/rate` seconds apart, never before the key's hold."""

    def __init__(self, rates: dict[str, float] | None = None, default_rate: float = 1.0):
        if default_rate <= 0:
            raise ValueError(f"default_rate must be > 0, got {default_rate}")
        self.rates = dict(rates or {})
        self.default_rate = default_rate
        self.next_free: dict[str, float] = {}
        self.held_until: dict[str, float] = {}

    def rate(self, key: str) -> float:
        return self.rates.get(key, self.default_rate)

    def reserve(self, key: str, now: float) -> float:
        """The start time of the caller's request (>= now); the slot is taken."""
        start = max(now, self.next_free.get(key, now), self.held_until.get(key, now))
        self.next_free[key] = start + 1.0 / self.rate(key)
        return start

    def slow_down(self, key: str, rate: float) -> None:
        """Lower `key`'s rate (robots.txt Crawl-delay); never raises it."""
        if rate > 0:
            self.rates[key] = min(rate, self.rate(key))

    def hold(self, key: str, until: float) -> None:
        """No request on `key` starts before `until` (wall-clock seconds)."""
        self.held_until[key] = max(until, self.held_until.get(key, 0.0))


class LocalLimiter:
    """A `Schedule` for threads of one process."""

    def __init__(self, rates: dict[str, float] | None = None, default_rate: float = 1.0):
        self.schedule = Schedule(rates, default_rate)
        self.lock = threading.Lock()

    def wait(self, key: str) -> float:
        """Sleep until this caller may send a request on `key`; returns the seconds slept."""
        with self.lock:
            start = self.schedule.reserve(key, time.time())
        delay = max(0.0, start - time.time())
        if delay:
            time.sleep(delay)
        return delay

    def hold(self, key: str, seconds: float) -> None:
        with self.lock:
            self.schedule.hold(key, time.time() + seconds)

    def slow_down(self, key: str, rate: float) -> None:
        with self.lock:
            self.schedule.slow_down(key, rate)


class RateLimiterActor:
    """The schedule as a Ray actor (made remote in `shared_limiter`); wall clocks of one cluster agree
    closely enough at one-request-per-second budgets, and the actor compares its own clock only."""

    def __init__(self, rates: dict[str, float] | None = None, default_rate: float = 1.0):
        self.schedule = Schedule(rates, default_rate)
        self.granted = 0

    def reserve(self, key: str) -> float:
        """Seconds the caller must wait before sending."""
        now = time.time()
        self.granted += 1
        return self.schedule.reserve(key, now) - now

    def hold(self, key: str, seconds: float) -> None:
        self.schedule.hold(key, time.time() + seconds)

    def slow_down(self, key: str, rate: float) -> None:
        self.schedule.slow_down(key, rate)

    def stats(self) -> dict:
        return {"granted": self.granted, "rates": self.schedule.rates, "default_rate": self.schedule.default_rate}


class SharedLimiter:
    """Client of the named actor: picklable, so Ray tasks and actors can carry it."""

    def __init__(self, actor):
        self.actor = actor

    def wait(self, key: str) -> float:
        import ray

        delay = max(0.0, ray.get(self.actor.reserve.remote(key)))
        if delay:
            time.sleep(delay)
        return delay

    def hold(self, key: str, seconds: float) -> None:
        import ray

        ray.get(self.actor.hold.remote(key, seconds))

    def slow_down(self, key: str, rate: float) -> None:
        import ray

        ray.get(self.actor.slow_down.remote(key, rate))


def shared_limiter(name: str, rates: dict[str, float] | None = None, default_rate: float = 1.0) -> SharedLimiter:
    """The cluster-wide limiter called `name`, created on first use (later callers get the same actor)."""
    import ray

    # One request at a time: each reservation takes microseconds, and a serial actor needs no lock.
    actor_class = ray.remote(num_cpus=0)(RateLimiterActor)
    actor = actor_class.options(name=name, namespace="qa-crawl", get_if_exists=True).remote(rates, default_rate)
    return SharedLimiter(actor)

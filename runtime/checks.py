"""Range checks of a job's options, run in each config dataclass's `__post_init__`: a config is checked the same
way whether it comes from the command line, the experiments runner or Python, and a bad value is refused with
one line naming the option before any work starts.

`UsageError` is what a job reports with exit code 2 (a wrong option, a missing or refused path); failures of the
work itself (a malformed row, a worker that died) exit with 1."""

from __future__ import annotations

import math


class UsageError(ValueError):
    """An option value or path the job refuses before doing any work; the message names the option."""


class MissingInput(UsageError, FileNotFoundError):
    """An input path (file or folder) that does not exist; the message names the option and the path."""


def _number(option: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{option} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number, got {value}")
    return value


def at_least(option: str, value, minimum, allow_none: bool = False) -> None:
    """`value` is a finite number >= `minimum` (None passes where `allow_none`: the default applies)."""
    if value is None and allow_none:
        return
    if _number(option, value) < minimum:
        raise UsageError(f"{option} must be at least {minimum}, got {value}")


def whole(option: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{option} must be a whole number, got {value!r}")


def integer_at_least(option: str, value, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    whole(option, value)
    at_least(option, value, minimum)


def within(option: str, value, low, high, allow_none: bool = False, high_open: bool = False) -> None:
    """`low <= value <= high` (`< high` where `high_open`)."""
    if value is None and allow_none:
        return
    _number(option, value)
    if value < low or value > high or (high_open and value == high):
        bound = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise UsageError(f"{option} must be in {bound}, got {value}")


def one_of(option: str, value, choices) -> None:
    if value not in choices:
        raise UsageError(f"{option} must be one of {', '.join(map(str, choices))}; got {value!r}")


LARGEST_SEED = 2**32 - 1  # numpy's seeds (np.random.seed, default_rng's words) are unsigned 32-bit


def seed_in_range(option: str, value) -> None:
    """A whole number that every generator a run seeds takes: 0 to LARGEST_SEED (numpy refused --seed -1 inside a
    training worker after Ray had started, and in word_vectors as a failure, exit 1; --dry-run passed both)."""
    whole(option, value)
    if not 0 <= value <= LARGEST_SEED:
        raise UsageError(f"{option} must be in [0, {LARGEST_SEED}], got {value}")

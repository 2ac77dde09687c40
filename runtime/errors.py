"""How every job ends when something fails: one line on stderr, `JOB: error: <cause>`, whichever process raised
it (the job's own, a Ray Data task, a Ray Train worker), and the whole traceback in a log file that line names.

Exit codes, the same in every job: 2 for a usage error (an option or path refused before any work:
`runtime.checks.UsageError`), 1 for a failure of the work itself. Secrets in URLs (`key=`, `access_token=`) are
scrubbed from the line and the log."""

from __future__ import annotations

import os
import re
import sys

from runtime.checks import UsageError

# Query parameters whose values never reach a console, a log or a file.
SECRET_QUERY = re.compile(r"(?i)\b(key|access_token)=[^&\s'\"<>)]*")


def scrub(text: str) -> str:
    """`text` with the values of secret URL parameters replaced by ***."""
    return SECRET_QUERY.sub(lambda m: f"{m.group(1)}=***", text)


def unwrap(error: BaseException) -> BaseException:
    """The user's exception inside Ray's wrappers: a Ray task error's cause, a Ray Train worker group's failure
    (the lowest rank's) or controller failure, so a job prints 'file: line: reason', not a stack of wrappers.
    Only Ray's own exceptions are unwrapped: ours raised `from` a library's error carry the file and option the
    library's lack (`--embeddings F: not a .npy matrix (...)` printed numpy's message alone)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        failures = getattr(error, "worker_failures", None)
        if failures:
            error = failures[min(failures)]
            continue
        base = getattr(error, "_base_exc", None)  # Ray Train's wrapper of a worker's error
        if isinstance(base, BaseException):
            error = base
            continue
        if not type(error).__module__.startswith("ray."):
            break
        cause = getattr(error, "controller_failure", None) or getattr(error, "cause", None) or error.__cause__
        if not isinstance(cause, BaseException):
            break
        error = cause
    return error


def one_line(error: BaseException) -> str:
    """The error's first line (a Ray task error appends its traceback, Ray Data its retry advice), named by its
    class where that is not a builtin's (DumpError, SchemaMismatch, a torch error)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    name = type(error).__name__
    if type(error).__module__ == "builtins" or isinstance(error, UsageError):
        return scrub(first or name)
    return scrub(f"{name}: {first}" if first else name)


def exit_code(error: BaseException) -> int:
    return 2 if isinstance(error, UsageError) else 1


def traceback_log(job: str, error: BaseException) -> str | None:
    """Write the error's full traceback (Ray's task tracebacks included) to a file; its path, or None."""
    import tempfile
    import traceback

    path = os.path.join(tempfile.gettempdir(), f"{job}-error-{os.getpid()}.log")
    text = "".join(traceback.format_exception(error))
    for rank, failure in sorted((getattr(error, "worker_failures", None) or {}).items()):
        text += f"\n--- training worker of rank {rank} ---\n{failure}\n"  # its whole traceback (the above cuts it)
    try:
        with open(path, "w") as f:
            f.write(scrub(text))
    except OSError:
        return None
    return path


def fail(job: str, error: BaseException) -> int:
    """Print `JOB: error: <cause>` (with the traceback's log file for failures, not for usage errors) and return
    the exit code."""
    cause = unwrap(error)
    code = exit_code(cause)
    log = traceback_log(job, error) if code == 1 else None
    where = f" (traceback: {log})" if log else ""
    print(f"{job}: error: {one_line(cause)}{where}", file=sys.stderr, flush=True)
    return code

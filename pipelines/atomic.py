"""Outputs that appear whole or not at all, and never in place of something the user did not ask to replace.

A job's output folder is built in a sibling staging folder and renamed into place once complete. Before any
work, `check_output` refuses an output that would destroy something or be destroyed: an existing file (or a
path under one), a folder that is, holds or lies inside one of the job's inputs, or a non-empty folder that is
not an earlier output of the same job (recognised by the marker, `.qa-output.json`, that `staged_dir` writes
into every output it completes), or an earlier output that now holds files the job did not write (the marker lists
every file of the output; a file another job writes into it on purpose, such as word_vectors' embeddings.npy, is
added to that list by `add_derived_file` and goes with the output it was derived from). Replacing an earlier
output stays atomic: a crash at any point leaves the old output or the new one. A single-file output (per-question
results, a benchmark's figures) is checked by `check_output_file`: never in place of an input, and an existing file
there is replaced only when it is an earlier file of the same kind (`FileKind`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass

from runtime.checks import UsageError

MARKER = ".qa-output.json"  # written last into a completed output: which job wrote it, and when
STAGING_MARKER = ".qa-staging"  # in a staging folder from its creation: only such folders are cleaned up
# what an operating system leaves in a folder a person has looked at: no one's work, never a reason to refuse
SYSTEM_LITTER = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})


class OutputError(UsageError):
    """An output path the job refuses (the message names the path and why)."""


def real_path(path: str) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def within_folder(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies under it (both real paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def read_marker(folder: str) -> dict | None:
    """`folder`'s completion marker, or None (no marker, or not one of ours)."""
    try:
        with open(os.path.join(folder, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def output_job(folder: str) -> str | None:
    """The job named by `folder`'s completion marker, or None (no marker, or not one of ours)."""
    return (read_marker(folder) or {}).get("job")


def files_under(folder: str) -> list[str]:
    """Every file (and link) under `folder`, as sorted paths relative to it; the marker (and a rewrite of it a crash
    left) and SYSTEM_LITTER left out."""
    found = []
    for root, dirs, files in os.walk(folder):
        links = [name for name in dirs if os.path.islink(os.path.join(root, name))]  # os.walk does not enter them
        for name in files + links:
            if name not in SYSTEM_LITTER:
                found.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(path for path in found if path != MARKER and not path.startswith(MARKER + ".tmp-"))


def foreign_files(folder: str, marker: dict) -> list[str]:
    """The files under an earlier output (`marker`: its completion marker) that neither its job wrote nor another
    job added by `add_derived_file` (what replacing the output would delete though no job of ours made it: a user's
    notes, predictions, a run). An output whose marker lists no files (written before markers did) has none that
    can be told apart."""
    if "files" not in marker:
        return []
    known = set(marker["files"]) | set(marker.get("derived", []))
    return [path for path in files_under(folder) if path not in known]


def recognised_by(name: str, *keys: str):
    """A test for outputs written before completion markers existed: the folder holds the JSON file `name` (the
    job's stats or manifest, written last) with every one of `keys`."""

    def earlier_output(folder: str) -> bool:
        try:
            with open(os.path.join(folder, name)) as f:
                written = json.load(f)
        except (OSError, ValueError):
            return False
        return isinstance(written, dict) and all(key in written for key in keys)

    return earlier_output


def check_folder_can_be_made(folder: str, option: str) -> None:
    """Raise OutputError unless `folder` is a folder or can be made one: no file in its place or above it, and
    the nearest folder that exists above it writable by this user."""
    path = os.path.abspath(folder)
    while not os.path.isdir(path):
        if os.path.lexists(path):
            raise OutputError(f"{option}: {path} is an existing file, not a folder; name a folder")
        path = os.path.dirname(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"{option}: {path} is not writable by this user; name a folder it can write")


def check_output(target: str, job: str, inputs=(), legacy=None, option: str = "--output") -> None:
    """Raise OutputError if writing the folder `target` would destroy what the user did not ask to replace.

    Refused: `target` is an existing file (or anything but a folder), or lies under one (or under a folder this
    user cannot write: `check_folder_can_be_made`); `target` is one of `inputs`, holds one or
    lies inside an input folder (it would become part of that input, read with it by a job that searches the
    folder, and be deleted with it when that input, an earlier output of ours say, is replaced);
    `target` is a non-empty folder that is not an earlier output of `job` (its marker, or `legacy(target)`
    returning True for outputs written before markers existed), or an earlier output holding `foreign_files`.
    A missing or empty folder is fine."""
    real = real_path(target)
    if os.path.lexists(target) and not os.path.isdir(target):
        raise OutputError(f"{option} {target}: an existing file, not a folder; name a new folder")
    check_folder_can_be_made(os.path.dirname(os.path.abspath(target)), f"{option} {target}")
    for path in inputs:
        if path and "://" not in str(path) and within_folder(real_path(str(path)), real):
            what = "is" if real_path(str(path)) == real else "holds"
            raise OutputError(
                f"{option} {target}: {what} the input {path}; replacing it would delete that input "
                "(name another folder)"
            )
        if path and "://" not in str(path) and os.path.isdir(path) and within_folder(real, real_path(str(path))):
            raise OutputError(
                f"{option} {target}: lies inside the input folder {path}, so it would become part of that input "
                "and be deleted with it when that input is replaced (name a folder beside it)"
            )
    if not os.path.isdir(target) or not os.listdir(target):
        return
    marker = read_marker(target) or {}
    other = marker.get("job")
    if other == job:
        foreign = foreign_files(target, marker)
        if foreign:
            them = "them" if len(foreign) > 1 else "it"
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise OutputError(
                f"{option} {target}: an earlier output of {job} that now also holds {shown}, which {job} did not "
                f"write; replacing it would delete {them} (move {them} out, or name a new folder)"
            )
        return
    if legacy is not None and other is None and legacy(target):
        return
    why = f"an output of {other}" if other else f"not an earlier output of {job} (no {MARKER})"
    raise OutputError(
        f"{option} {target}: a non-empty folder, {why}; replacing it would delete what it holds "
        "(name a new or empty folder)"
    )


@dataclass(frozen=True)
class FileKind:
    """What a single-file output writes, so that an existing file in its place is replaced only when it is an
    earlier one of these (a re-run's results), never a README or notes a typo named: a JSON object holding `key`
    (`layout` "json"), JSON lines whose first line is an object holding `key` ("jsonl"), or a NumPy array ("npy").
    `what` names it in the refusal."""

    what: str
    layout: str
    key: str | None = None

    def __post_init__(self):
        if self.layout not in ("json", "jsonl", "npy") or (self.layout != "npy" and not self.key):
            raise ValueError(f"FileKind: layout json or jsonl with a key, or npy; got {self.layout!r}, {self.key!r}")

    def written(self, path: str) -> bool:
        """Whether the file `path` is one of these (read up to its first line, or whole for a JSON file no larger
        than LARGEST_JSON_FILE; a file that cannot be read is not)."""
        try:
            with open(path, "rb") as f:
                if self.layout == "npy":
                    return f.read(6) == b"\x93NUMPY"
                if self.layout == "jsonl":
                    return self._holds_key(f.readline(LARGEST_JSON_FILE))
                return os.path.getsize(path) <= LARGEST_JSON_FILE and self._holds_key(f.read())
        except OSError:
            return False

    def _holds_key(self, text: bytes) -> bool:
        try:
            written = json.loads(text)
        except ValueError:  # UnicodeDecodeError too
            return False
        return isinstance(written, dict) and self.key in written


LARGEST_JSON_FILE = 64 * 2**20  # a results file of ours is far smaller; a larger "JSON" file is someone else's


def check_output_file(target: str, inputs=(), option: str = "--output", *, kind: FileKind) -> None:
    """Raise OutputError if the file `target` is a folder, lies under a file (or an unwritable folder), is one
    of the files `inputs` (a results file may live beside its data, but never in place of it), or is an existing
    file with something in it that is not an earlier file of `kind` (an empty file has nothing to lose)."""
    if os.path.isdir(target):
        raise OutputError(f"{option} {target}: a folder; name a file")
    check_folder_can_be_made(os.path.dirname(os.path.abspath(target)), f"{option} {target}")
    real = real_path(target)
    for path in inputs:
        if path and "://" not in str(path) and real_path(str(path)) == real:
            raise OutputError(
                f"{option} {target}: is the input {path}; writing it would destroy that input (name another file)"
            )
    if os.path.isfile(target) and os.path.getsize(target) and not kind.written(target):
        raise OutputError(
            f"{option} {target}: an existing file that is not {kind.what}; writing it would replace that file "
            "(name a new file, or move it away)"
        )
    if os.path.lexists(target) and not os.path.isfile(target):
        raise OutputError(f"{option} {target}: not a plain file (a broken link, a device); name a new file")


def _write_marker(folder: str, marker: dict) -> None:
    temporary = os.path.join(folder, f"{MARKER}.tmp-{uuid.uuid4().hex[:8]}")
    with open(temporary, "w") as f:
        json.dump(marker, f)
    os.replace(temporary, os.path.join(folder, MARKER))


def write_marker(folder: str, job: str) -> None:
    """The completion marker, written last: the job, the time, and every file the job wrote (`files_under`)."""
    completed = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    _write_marker(folder, {"job": job, "completed": completed, "files": files_under(folder)})


def add_derived_file(path: str) -> None:
    """Record `path`, a file just written into an earlier output (the nearest folder above it holding a marker), as
    derived from it: replacing that output deletes it with the output it was made from, and is not refused for it.
    A file outside every output of ours is left alone."""
    folder = os.path.dirname(real_path(path))
    while not os.path.exists(os.path.join(folder, MARKER)):
        if os.path.dirname(folder) == folder:
            return
        folder = os.path.dirname(folder)
    marker = read_marker(folder)
    if marker is None or "files" not in marker:
        return
    relative = os.path.relpath(real_path(path), folder)
    if relative not in marker["files"] and relative not in marker.get("derived", []):
        marker["derived"] = sorted(marker.get("derived", []) + [relative])
        _write_marker(folder, marker)


def swap_into_place(staging: str, target: str) -> None:
    """`staging`, a finished folder beside `target`, renamed to `target`; a folder already there is moved aside
    first (`TARGET.old-XXXXXXXX`) and deleted after, so a crash at any point leaves either the old or the new one."""
    old = None
    if os.path.exists(target):
        old = f"{target}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    os.rename(staging, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(target: str, job: str, inputs=(), legacy=None):
    """Yield an empty staging folder beside `target`; on success it replaces `target`, on error it is removed.

    `check_output(target, job, inputs, legacy)` runs first. Staging folders of a killed run of ours (they hold
    STAGING_MARKER) are removed; nothing else beside `target` is touched. An earlier output at `target` is
    moved aside just before the swap and deleted after it, so a crash at any point leaves either the old or the
    new output, and the new one carries the job's completion marker."""
    check_output(target, job, inputs, legacy)
    target = os.path.abspath(target)
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    for stale in os.listdir(parent):
        path = os.path.join(parent, stale)
        ours = os.path.exists(os.path.join(path, STAGING_MARKER)) or output_job(path) == job
        if ours and stale.startswith((name + ".partial-", name + ".old-")):
            shutil.rmtree(path, ignore_errors=True)
    staging = os.path.join(parent, f"{name}.partial-{uuid.uuid4().hex[:8]}")
    os.makedirs(staging)
    open(os.path.join(staging, STAGING_MARKER), "w").close()
    try:
        yield staging
        os.remove(os.path.join(staging, STAGING_MARKER))
        write_marker(staging, job)
        swap_into_place(staging, target)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)

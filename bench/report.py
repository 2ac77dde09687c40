"""What every benchmark starts and ends with: its --json checked before any work (`check_result_file`), and its
figures written there whole and printed as the last line (`write_result`)."""

from __future__ import annotations

import argparse
import json
import os

from pipelines.atomic import FileKind, OutputError, check_output_file


def check_result_file(parser: argparse.ArgumentParser, path: str, key: str, inputs=()) -> None:
    """Refuse --json `path` before the benchmark runs (one line, exit 2), not after its minutes or hours: a
    folder, a path under a file or an unwritable folder, one of the benchmark's `inputs`, or an existing file that
    is not this benchmark's figures (a JSON object holding `key`, a figure every run of it writes)."""
    kind = FileKind(f"{parser.prog}'s earlier figures (a JSON object with {key})", "json", key)
    try:
        check_output_file(path, inputs, option="--json", kind=kind)
    except OutputError as error:
        parser.error(str(error))


def write_result(result: dict, path: str) -> None:
    """`result` as JSON at `path`, whole (temporary file, then rename: a crash leaves the earlier figures), and on
    stdout as one line."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    staged = f"{path}.partial-{os.getpid()}"
    try:
        with open(staged, "w") as f:
            json.dump(result, f, indent=2)
        os.replace(staged, path)
    finally:
        if os.path.exists(staged):
            os.remove(staged)
    print(json.dumps(result))

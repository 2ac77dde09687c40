"""What every benchmark ends with: its figures written to a JSON file and printed as the last line."""

from __future__ import annotations

import json
import os


def write_result(result: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))

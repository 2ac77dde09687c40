"""experiments/rerun.py: a ledger record re-runs from its commit and stored arguments, writing only under its own
folder, and its figures are set against the record's."""

import json
import os
import subprocess
import sys

import pytest

from experiments import machine, rerun
from experiments.ledger import Ledger
from experiments.plan import REPO
from tests.conftest import make_tokenised

HEAD = subprocess.run(
    ["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
).stdout.strip()
needs_git = pytest.mark.skipif(not HEAD, reason="not a git checkout: records name commits")


def _record(commit=HEAD, argv=None, **fields):
    argv = argv or [
        "jobs/train.py",
        "--model",
        "qrnn",
        "--data",
        "out/results/data/trecqa",
        "--storage-path",
        "out/results/runs",
        "--name",
        "run",
        "--test-split",
        "test",
        "--test-output",
        "out/results/predictions/run.jsonl",
    ]
    return {"row": "trecqa/qrnn", "argv": [argv], "commit": commit, "device": "cpu", "test": {"map": 0.5}, **fields}


def test_a_rerun_writes_only_under_its_own_folder():
    argv = _record()["argv"][0]
    moved = rerun.redirected(argv, "/scratch", "run")
    assert moved[moved.index("--storage-path") + 1] == "/scratch/runs"
    assert moved[moved.index("--test-output") + 1] == "/scratch/predictions/run.jsonl"
    unchanged = [
        i for i, arg in enumerate(argv) if arg not in ("out/results/runs", "out/results/predictions/run.jsonl")
    ]
    assert [moved[i] for i in unchanged] == [argv[i] for i in unchanged]
    zero_shot = ["jobs/zero_shot.py", "--data", "d", "--output", "out/results/predictions/z.jsonl"]
    assert rerun.redirected(zero_shot, "/s", "z")[-1] == "/s/predictions/z.jsonl"


@needs_git
def test_records_that_cannot_rerun_here_say_why():
    known = rerun.commit_in_clone
    assert rerun.why_not_here("r", _record(), gpu_here=False, commit_known=known) is None
    cases = [
        (_record(commit=HEAD + "-dirty"), "ran from uncommitted code"),
        (_record(commit="0000000"), "its commit 0000000 is not in this clone"),
        (_record(device="cuda: NVIDIA H100 80GB HBM3"), "same kind of device, and none is here"),
        ({k: v for k, v in _record().items() if k != "argv"}, "argument lists that ran (argv)"),
        ({k: v for k, v in _record().items() if k != "test"}, "not a run record with test figures"),
    ]
    for record, fragment in cases:
        assert fragment in rerun.why_not_here("r", record, gpu_here=False, commit_known=known)
    gpu_argv = [*_record()["argv"][0], "--use-gpu", "--gpus-per-worker", "0.5"]
    assert rerun.why_not_here("r", _record(argv=gpu_argv, device="cpu"), False, known) is not None
    assert rerun.why_not_here("r", _record(argv=gpu_argv), gpu_here=True, commit_known=known) is None


EPYC = {"processor": "AMD EPYC (family 25, model 17)", "kernels": "AVX512"}
XEON = {"processor": "Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143)", "kernels": "AVX512"}


@needs_git
def test_a_cpu_record_reruns_on_its_own_kind_of_cpu():
    """Kernels of another width or processor round differently, and training amplifies it: a CPU record that names
    its CPU re-runs (is drawn, is run without --other-cpu) only on that kind; one that names none, anywhere."""
    known = rerun.commit_in_clone
    assert rerun.why_not_here("r", _record(cpu=EPYC), False, known, cpu_here=EPYC) is None
    assert rerun.why_not_here("r", _record(), False, known, cpu_here=EPYC) is None  # recorded before CPUs were named
    other = rerun.why_not_here("r", _record(cpu=XEON), False, known, cpu_here=EPYC)
    assert "ran on Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143), AVX512 kernels" in other
    assert "same kind of CPU, and this is AMD EPYC (family 25, model 17), AVX512 kernels" in other
    assert other.endswith("(--other-cpu runs it anyway)")
    narrower = rerun.why_not_here("r", _record(cpu=dict(EPYC, kernels="AVX2")), False, known, cpu_here=EPYC)
    assert narrower.endswith("(--other-cpu runs it anyway; ATEN_CPU_CAPABILITY=avx2 selects its kernels here)")
    assert rerun.why_not_here("r", _record(cpu=XEON), False, known) is None  # --other-cpu
    gpu = _record(cpu=XEON, device="cuda: NVIDIA H100 80GB HBM3")  # a GPU record's host CPU is not its device
    assert rerun.why_not_here("r", gpu, True, known, cpu_here=EPYC) is None


def test_a_check_that_differs_says_whether_it_ran_on_the_records_kind_of_cpu():
    check = {"recorded_device": "cpu", "cpu": EPYC, "recorded_cpu": EPYC}
    assert rerun.cpu_caveat(check) == ""
    assert "does not name the CPU it ran on" in rerun.cpu_caveat(dict(check, recorded_cpu=None))
    assert rerun.cpu_caveat(dict(check, recorded_cpu=XEON)) == (
        "; it ran on Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143), AVX512 kernels, not this kind of CPU"
    )
    assert rerun.cpu_caveat(dict(check, recorded_device="cuda: NVIDIA H100 80GB HBM3", recorded_cpu=XEON)) == ""


def test_a_record_names_the_kind_of_cpu_it_ran_on(monkeypatch):
    cpu = machine.cpu_kind()
    assert cpu["processor"] and cpu["kernels"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256", "SVE")
    # the kernels are torch's, which ATEN_CPU_CAPABILITY can lower: a subprocess, since torch reads it once
    lowered = subprocess.run(
        [sys.executable, "-c", "from experiments.machine import cpu_kind; print(cpu_kind()['kernels'])"],
        cwd=REPO,
        env=dict(os.environ, ATEN_CPU_CAPABILITY="default", PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        check=True,
    )
    assert lowered.stdout.strip() == "DEFAULT"
    # a setting that fixes MKL's code path makes another kind (measured: an AMD record re-ran to -0.0035 on an Intel
    # CPU with the same AVX512 kernels, and to -0.0001 there with MKL_CBWR=AVX2)
    monkeypatch.delenv("MKL_CBWR", raising=False)
    plain = machine.cpu_kind()
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    fixed = machine.cpu_kind()
    assert "MKL_CBWR" not in plain and fixed == dict(plain, MKL_CBWR="AVX2")
    assert machine.describe_cpu(fixed) == f"{plain['processor']}, {plain['kernels']} kernels, MKL_CBWR=AVX2"


def test_the_figure_compared_is_the_records_first(tmp_path):
    assert rerun.primary_figure({"map": 0.5, "mrr": 0.6}) == "map"
    assert rerun.primary_figure({"em": 0.5, "f1": 0.6}) == "f1"
    with pytest.raises(SystemExit, match="hold none of"):
        rerun.primary_figure({"questions": 3})


def test_an_out_folder_over_the_runs_inputs_or_the_results_is_refused(tmp_path):
    from pipelines.atomic import OutputError

    record = _record()
    for folder in ("out/results", "out/results/data", "out/results/runs/x", "out"):
        with pytest.raises(OutputError, match="overlaps"):
            rerun.check_scratch(os.path.join(REPO, folder), record)
    rerun.check_scratch(str(tmp_path / "rerun"), record)
    rerun.check_scratch(os.path.join(REPO, "out", "rerun"), record)


def test_a_ledger_that_is_missing_or_not_a_ledger_is_named_in_one_line(tmp_path, capsys):
    page = tmp_path / "results.md"
    page.write_text("# Results: our figures beside the papers'\n")
    for ledger, message in (
        (page, f"--ledger {page}: not a run ledger: not JSON"),
        (tmp_path / "none.json", "no such"),
    ):
        with pytest.raises(SystemExit) as refused:
            rerun.main(["--ledger", str(ledger), "--pick-random", "--no-record", "--out", str(tmp_path / "rerun")])
        assert refused.value.code == 2 and message in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["results.md"]


def test_a_record_name_that_is_not_in_the_ledger_is_a_usage_error_naming_the_nearest(tmp_path, capsys):
    # it was exit 1, "not a run of LEDGER", with no hint of the name meant
    for name, hint in (
        ("full-trecqa-qrnn-sed2", "did you mean full-trecqa-qrnn-seed2"),
        ("nosuch", "the page's 'Every run' lists them"),
    ):
        with pytest.raises(SystemExit) as refused:
            rerun.main(["--record", name, "--no-record", "--out", str(tmp_path / "rerun")])
        error = capsys.readouterr().err
        assert refused.value.code == 2 and f"--record {name}: not a run of" in error and hint in error
    assert not os.listdir(tmp_path)


@needs_git
def test_a_draw_is_repeatable_and_only_among_records_that_can_rerun(tmp_path, monkeypatch):
    monkeypatch.setattr(rerun, "cuda_here", lambda: False)
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for i in range(6):
        ledger.add(f"ok-{i}", _record(seconds=100 + i))
    ledger.add("long", _record(seconds=10_000))
    ledger.add("dirty", _record(commit=HEAD + "-dirty", seconds=1))
    ledger.add("gpu", _record(device="cuda: NVIDIA H100 80GB HBM3", seconds=1))
    missing_source = [*_record()["argv"][0], "--init-from", str(tmp_path / "no-such-run")]
    ledger.add("orphan", _record(argv=missing_source, seconds=1))
    ledger.add("data:trecqa", {"command": "python jobs/tokenize_corpora.py", "seconds": 1})
    drawn = {rerun.pick(ledger, seed, max_seconds=1000) for seed in range(40)}
    assert {name for name, _ in drawn} == {f"ok-{i}" for i in range(6)} and {n for _, n in drawn} == {6}
    assert rerun.pick(ledger, 7, None) == rerun.pick(ledger, 7, None)
    assert rerun.pick(ledger, 7, None)[1] == 7
    with pytest.raises(SystemExit, match="no record of the ledger can re-run here"):
        rerun.pick(ledger, 0, max_seconds=10)
    # with the CPU here named, a record of another kind of CPU is not drawn; one of this kind, or of none, is
    ledger.add("other-cpu", _record(seconds=1, cpu=XEON))
    ledger.add("this-cpu", _record(seconds=1, cpu=EPYC))
    drawn = {rerun.pick(ledger, seed, max_seconds=1000, cpu_here=EPYC) for seed in range(60)}
    assert {name for name, _ in drawn} == {f"ok-{i}" for i in range(6)} | {"this-cpu"} and {n for _, n in drawn} == {7}


@needs_git
def test_a_draw_that_finds_nothing_says_why_by_kind_of_reason(tmp_path, monkeypatch):
    """A reviewer on another machine learns from the one line why nothing can re-run there, and what to do."""
    monkeypatch.setattr(rerun, "cuda_here", lambda: False)
    ledger = Ledger(str(tmp_path / "ledger.json"))
    for i in range(3):
        ledger.add(f"xeon-{i}", _record(seconds=1, cpu=XEON))
    ledger.add("gpu", _record(device="cuda: NVIDIA H100 80GB HBM3", seconds=1))
    ledger.add("dirty", _record(commit=HEAD + "-dirty", seconds=1))
    ledger.add("long", _record(seconds=10_000, cpu=EPYC))
    with pytest.raises(SystemExit) as refused:
        rerun.pick(ledger, 0, max_seconds=1000, cpu_here=EPYC)
    message = str(refused.value.code)
    assert message.startswith("rerun: no record of the ledger can re-run here, of 6 run records: "), message
    assert (
        f"3 ran on another kind of CPU ({machine.describe_cpu(XEON)}; this is {machine.describe_cpu(EPYC)}): "
        "--other-cpu draws among them too" in message
    )
    for part in ("1 ran on a GPU", "1 ran from uncommitted code", "1 took longer than --max-seconds: raise it"):
        assert part in message
    assert rerun.pick(ledger, 0, max_seconds=None, cpu_here=EPYC) == ("long", 1)


@needs_git
def test_a_fine_tuning_record_needs_the_checkpoint_it_started_from(tmp_path):
    from pipelines.shards import sha256_file
    from tests.jobs.test_safety import _checkpoint

    source = _checkpoint(tmp_path / "source", make_tokenised(tmp_path / "tokenised"))
    argv = [*_record()["argv"][0], "--init-from", str(source)]

    right = sha256_file(os.path.join(source, "state.pt"))
    assert rerun.source_checkpoint_problem("r", _record(argv=argv, init_checkpoint_sha256=right)) is None
    wrong = rerun.source_checkpoint_problem("r", _record(argv=argv, init_checkpoint_sha256="0" * 64))
    assert "is not the one it fine-tuned (sha256 differs)" in wrong


def test_a_record_whose_data_or_word_vectors_changed_since_it_ran_is_not_rerun(tmp_path):
    """A record keeps the sha256 of its data's manifest and of the word vectors it started from (none for an
    encoder, whose weights bring their own); a file here with other content refuses the re-run and the draw."""
    import numpy as np

    from experiments.runner import inputs_read
    from pipelines.shards import path_free_sha256

    data = make_tokenised(tmp_path / "tokenised")
    vectors, manifest = os.path.join(data, "embeddings.npy"), os.path.join(data, "manifest.json")
    np.save(vectors, np.zeros((3, 4), np.float32))
    read = inputs_read({"model": "qrnn", "data": data, "embeddings": "auto"})
    assert set(read) == {manifest, vectors}
    assert set(inputs_read({"model": "gsamn", "data": data, "embeddings": "auto", "encoder_path": "minilm"})) == {
        manifest
    }
    record = _record(inputs_sha256=read)
    assert rerun.inputs_problem("r", record) is None
    np.save(vectors, np.ones((3, 4), np.float32))  # the data step's vectors built again, otherwise
    rerun._sha256.cache_clear()
    problem = rerun.inputs_problem("r", record)
    assert problem and f"read {vectors} with sha256 {read[vectors][:12]}" in problem and "differs" in problem
    assert "another kind of CPU" not in problem and "another folder" not in problem  # the vectors, not the manifest
    # a CPU record of another kind of CPU: its word vectors, trained there, may be what differs
    other = rerun.inputs_problem("r", dict(record, cpu=XEON), cpu_here=EPYC)
    assert other and f"ran on the record's kind of CPU ({machine.describe_cpu(XEON)})" in other
    assert "word vectors trained on another kind of CPU are other bytes where OpenBLAS ran other kernels" in other
    assert "; here" not in other  # no statistics beside the vectors: the kernels that trained them are unknown
    with open(os.path.join(data, "embeddings.json"), "w") as f:  # as jobs/word_vectors.py writes them
        json.dump({"blas_kernels": {"libscipy_openblas": "Haswell", "libscipy_openblas64_": "Haswell"}}, f)
    assert "Haswell with AVX2 alone; here Haswell)" in rerun.inputs_problem("r", dict(record, cpu=XEON), cpu_here=EPYC)
    assert "another kind of CPU" not in rerun.inputs_problem("r", dict(record, cpu=EPYC), cpu_here=EPYC)
    os.remove(vectors)  # not here: prepared by the data steps first, and checked after them
    assert rerun.inputs_problem("r", record) is None

    # the same rows built from a folder elsewhere: the manifest keeps that path, and the refusal names it
    with open(manifest) as f:
        built = json.load(f)
    built["config"] = {"input": "/elsewhere/shared/data/wikiqa"}
    with open(manifest, "w") as f:
        json.dump(built, f)
    rerun._sha256.cache_clear()
    problem = rerun.inputs_problem("r", record)
    assert problem and f"read {manifest} with sha256" in problem
    assert "ran from another folder here than on the record's machine" in problem
    assert "(here /elsewhere/shared/data/wikiqa)" in problem
    # once the ledger knows the record's manifest without its paths (a data step here named it), the same rows
    # built from elsewhere are what it read; other rows are refused without blaming the folder
    on_records_machine = dict(built, config={"input": "/work/shared/data/wikiqa"})
    known = {record["inputs_sha256"][manifest]: path_free_sha256(on_records_machine)}
    assert rerun.inputs_problem("r", record, known=known) is None
    built["splits"]["train"]["rows"] += 1
    with open(manifest, "w") as f:
        json.dump(built, f)
    rerun._sha256.cache_clear()
    problem = rerun.inputs_problem("r", record, known=known)
    assert problem and f"read {manifest} with sha256" in problem and "another folder" not in problem


def test_word_vectors_a_record_read_without_naming_them_are_prepared_or_the_re_run_refused(tmp_path, monkeypatch):
    """A record trained with `--embeddings auto` read its data folder's embeddings.npy without naming it: where the
    folder is here and the vectors are not, the re-run trained embeddings from scratch and still passed for a check
    of the record (wikiqa-iggsa-seed2: MAP 0.5936 against 0.5017, inputs 'checked'). Its data steps run first now."""
    data = os.path.join(str(tmp_path), "out", "data", "trecqa")
    os.makedirs(data)
    manifest, vectors = os.path.join(data, "manifest.json"), os.path.join(data, "embeddings.npy")
    with open(manifest, "w") as f:
        f.write("{}")
    argv = ["jobs/train.py", "--model", "qrnn", "--data", data, "--name", "run", "--test-split", "test"]
    record = _record(argv=argv, inputs_sha256={manifest: "aa" * 32, vectors: "bb" * 32})
    prepared: list[tuple[str, set]] = []

    def steps(out, env, ledger, only, lanes, write=True):
        prepared.append((out, set(only)))
        if write:
            with open(vectors, "wb") as f:
                f.write(b"vectors")
        return 0.0

    monkeypatch.setattr(rerun, "prepare_data", steps)
    rerun.prepare_inputs(record, {})
    assert prepared == [(os.path.join(str(tmp_path), "out"), {"trecqa", "trecqa-vectors"})]
    rerun.prepare_inputs(record, {})  # everything it read is here: nothing to prepare
    assert len(prepared) == 1
    os.remove(vectors)
    monkeypatch.setattr(rerun, "prepare_data", lambda *a: steps(*a, write=False))
    with pytest.raises(rerun.RerunRefused, match=r"embeddings.npy: read by the record, and not written here"):
        rerun.prepare_inputs(record, {})


def test_the_weights_fingerprint_is_of_the_scored_weights_not_of_the_file(tmp_path):
    """`weights_sha256`: the same for two state.pt files that differ only beside the weights (the seconds trained),
    other for one bit or another dtype of the same bytes; of the moving average where a run kept one (the weights
    its figures were scored with); a hand-computed value for a one-tensor state."""
    import hashlib
    import struct

    import torch

    from pipelines.shards import sha256_file
    from training.checkpoints import STATE_FILE, checkpoint_weights_sha256, weights_sha256

    one = {"model": {"b": torch.tensor([1.0])}}
    golden = hashlib.sha256(b"b\0torch.float32\0(1,)\0" + struct.pack("<f", 1.0)).hexdigest()
    assert weights_sha256(one) == golden

    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor(0.5)}
    folders = []
    for seconds in (10.0, 11.0):
        folder = tmp_path / f"checkpoint-{seconds:.0f}"
        folder.mkdir()
        torch.save({"model": dict(weights), "trained_seconds": seconds}, folder / STATE_FILE)
        folders.append(str(folder))
    assert sha256_file(os.path.join(folders[0], STATE_FILE)) != sha256_file(os.path.join(folders[1], STATE_FILE))
    assert checkpoint_weights_sha256(folders[0]) == checkpoint_weights_sha256(folders[1])
    assert rerun.same_weights(folders[0], folders[1]) is True
    assert rerun.same_weights(None, folders[1]) is None  # the recorded checkpoint is not on this machine

    flipped = weights["w"].clone()
    flipped.view(torch.int32)[0, 0] ^= 1  # the last bit of one float
    assert weights_sha256({"model": dict(weights, w=flipped)}) != weights_sha256({"model": weights})
    as_ints = weights["w"].view(torch.int32)  # the same bytes, read as another dtype
    assert weights_sha256({"model": dict(weights, w=as_ints)}) != weights_sha256({"model": weights})

    averaged = {"model": weights, "weight_average": {"decay": 0.9, "updates": 3, "shadow": {"b": torch.tensor(0.25)}}}
    assert weights_sha256(averaged) == weights_sha256({"model": dict(weights, b=torch.tensor(0.25))})


@pytest.mark.ray
@pytest.mark.slow
@needs_git
def test_a_recorded_training_run_reruns_from_its_commit_to_the_same_figures(tmp_path):
    """A real record: a small GSAMN run of jobs/train.py at HEAD, recorded as experiments/results.py records one;
    rerun.py runs its argv again from `git archive HEAD` and finds the same test MAP and the same weights, by the
    record's `weights_sha256` (the record names no checkpoint file it could compare with)."""
    from experiments.runner import run_job
    from training.checkpoints import checkpoint_weights_sha256

    status = subprocess.run(
        ["git", "status", "--porcelain", "--", "training", "qa_models", "jobs", "pipelines"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if status.strip():
        pytest.skip("the training code differs from HEAD: a record of it would not name the code that ran")
    tiny = make_tokenised(tmp_path / "tokenised", questions=8)
    argv = ["jobs/train.py", "--model", "gsamn", "--data", tiny, "--storage-path", str(tmp_path / "runs")]
    argv += ["--name", "tiny", "--dim", "16", "--batch-size", "4", "--max-steps", "6", "--num-cpus", "2"]
    argv += ["--seed", "3", "--test-split", "test", "--test-output", str(tmp_path / "predictions" / "tiny.jsonl")]
    env = dict(os.environ, RAY_ADDRESS="local")
    with open(tmp_path / "original.log", "w") as log:
        summary = run_job(argv, env, log)
    checkpoint = summary["test"]["checkpoint"]
    ledger_path = str(tmp_path / "ledger.json")
    record = {
        "row": "wikiqa/gsamn",
        "argv": [argv],
        "commit": HEAD,
        "device": "cpu",
        "test": summary["test"]["metrics"],
        "checkpoint": os.path.relpath(checkpoint, tmp_path),
        "weights_sha256": checkpoint_weights_sha256(checkpoint),
        "seconds": 30,
    }
    Ledger(ledger_path).add("tiny", record)
    before = sorted(os.listdir(tmp_path / "runs" / "tiny"))

    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "experiments", "rerun.py"), "--record", "tiny"]
        + ["--ledger", ledger_path, "--out", str(tmp_path / "rerun")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    check = json.loads(done.stdout.strip().splitlines()[-1])
    assert check["same"] and check["difference"] == 0.0 and check["weights_identical"], check
    assert check["weights_sha256"] == record["weights_sha256"]
    assert check["inputs_checked"] is False  # the record keeps no sha256 of its data: the check says so
    assert os.path.isdir(tmp_path / "rerun" / f"code-{HEAD}" / "training")
    assert os.path.exists(tmp_path / "rerun" / "predictions" / "tiny.jsonl")
    assert sorted(os.listdir(tmp_path / "runs" / "tiny")) == before  # the recorded run is left as it was
    assert Ledger(ledger_path).records["rerun:tiny"]["rerun"] == record["test"]["map"]
    # what the re-run wrote, outside the repository, is named OUT: no machine path in the ledger
    rerun_argv = Ledger(ledger_path).records["rerun:tiny"]["argv"][0]
    assert rerun_argv[rerun_argv.index("--storage-path") + 1] == "OUT/runs"
    assert rerun_argv[rerun_argv.index("--test-output") + 1] == "OUT/predictions/tiny.jsonl"
    assert "the same within 0.002" in done.stderr


def test_the_page_lists_each_check_and_marks_one_that_differs(tmp_path):
    from experiments.report import rerun_section

    ledger = Ledger(str(tmp_path / "ledger.json"))
    assert "No record has been checked by `rerun.py` yet." in rerun_section(ledger)
    check = {"commit": "37900c6", "device": "cpu", "finished": "2026-11-27", "figure": "map", "recorded": 0.55}
    ledger.add("rerun:a", dict(check, rerun=0.55, difference=0.0, same=True, weights_identical=True))
    ledger.add("rerun:b", dict(check, rerun=0.56, difference=0.01, same=False, drawn={"seed": 4, "eligible": 21}))
    lines = rerun_section(ledger)
    a = next(line for line in lines if line.startswith("| a |"))
    b = next(line for line in lines if line.startswith("| b |"))
    assert "| 0.5500 | 0.5500 | +0.0000 | the same weights | named |" in a
    assert "+0.0100 (**not the same**)" in b and "--seed 4, of 21" in b
    assert not any("since replaced" in line for line in lines)  # neither record is in this ledger to compare
    # a record as it was checked is not marked; one that ran again after its check is
    ledger.add("a", {"commit": "37900c6", "test": {"map": 0.55}})
    ledger.add("b", {"commit": "f370a2e", "test": {"map": 0.57}})
    lines = rerun_section(ledger)
    assert next(line for line in lines if line.startswith("| a")).startswith("| a | 37900c6 |")
    assert next(line for line in lines if line.startswith("| b")).startswith("| b (record since replaced) | 37900c6 |")
    assert any(line.startswith('A record marked "since replaced"') for line in lines)
    # a check that differs where the record kept no sha256 of its inputs says so: other inputs may explain it
    assert not any("inputs unrecorded" in line.lower() for line in lines)
    ledger.add("rerun:c", dict(check, rerun=0.50, difference=-0.05, same=False, inputs_checked=False))
    ledger.add("rerun:d", dict(check, rerun=0.50, difference=-0.05, same=False, inputs_checked=True))
    lines = rerun_section(ledger)
    assert "(**not the same**; inputs unrecorded)" in next(line for line in lines if line.startswith("| c |"))
    assert "(**not the same**) |" in next(line for line in lines if line.startswith("| d |"))
    assert any(line.startswith('"Inputs unrecorded"') for line in lines)
    # a CPU check that differs says whether the record named another kind of CPU, or none
    ledger.add("rerun:e", dict(check, rerun=0.50, difference=-0.05, same=False, cpu=EPYC, recorded_cpu=XEON))
    ledger.add("rerun:f", dict(check, rerun=0.50, difference=-0.05, same=False, cpu=EPYC, recorded_cpu=None))
    ledger.add("rerun:g", dict(check, rerun=0.55, difference=0.0, same=True, cpu=EPYC, recorded_cpu=EPYC))
    lines = rerun_section(ledger)
    e, f, g = (next(line for line in lines if line.startswith(f"| {k} |")) for k in "efg")
    assert "(**not the same**; another CPU)" in e and "(**not the same**; CPU unnamed)" in f
    assert "| cpu: AMD EPYC (family 25, model 17), AVX512 kernels (2026-11-27) |" in g and "not the same" not in g
    # the checks on another kind of CPU than their record's are counted, and those that came back the same named
    ledger.add("rerun:h", dict(check, rerun=0.55, difference=0.0, same=True, cpu=EPYC, recorded_cpu=XEON))
    text = " ".join(rerun_section(ledger))
    # those that came back other are named with their differences (it named only the same ones), and where they
    # ran the record's vector kernels on another processor, the page says the processor counts
    assert (
        "2 of these checks ran on another kind of CPU than their record (`--other-cpu`): 1 to the same figures (h), "
        "1 to others (e -0.0500). All of those that differ ran the same vector kernels as their record on another "
        "processor: the processor counts" in text
    )
    avx2 = dict(EPYC, kernels="AVX2")
    ledger.add("rerun:i", dict(check, rerun=0.50, difference=-0.05, same=False, cpu=avx2, recorded_cpu=XEON))
    h = dict(check, rerun=0.55, difference=0.0, same=True, cpu=EPYC, recorded_cpu=XEON)
    ledger.add("rerun:h", dict(h, earlier=[h]))  # checked twice: one name, its count
    text = " ".join(rerun_section(ledger))
    assert (
        "4 of these checks ran on another kind of CPU than their record (`--other-cpu`): 2 to the same figures "
        "(h (2 checks)), 2 to others (e -0.0500, i -0.0500). 1 of those that differ" in text
    )
    ledger.add("rerun:e", dict(check, rerun=0.55, difference=0.0, same=True, cpu=EPYC, recorded_cpu=XEON))
    ledger.add("rerun:i", dict(check, rerun=0.55, difference=0.0, same=True, cpu=EPYC, recorded_cpu=XEON))
    assert "processor counts" not in " ".join(rerun_section(ledger))  # only where a check says so


def test_a_new_check_keeps_the_earlier_ones_and_the_page_lists_them_all(tmp_path):
    """Checking a record again (on another kind of CPU, or after the record ran again) used to replace its check in
    the ledger, so the page lost what the first showed (the same weights, on the record's own kind of CPU)."""
    from experiments.report import rerun_section

    check = {"commit": "f370a2e", "device": "cpu", "figure": "map", "recorded": 0.55, "rerun": 0.55}
    first = dict(check, finished="2026-11-28", same=True, weights_identical=True, cpu=EPYC, recorded_cpu=EPYC)
    second = dict(check, commit="3ebacef", finished="2026-12-01", same=True, cpu=XEON, recorded_cpu=EPYC)
    assert rerun.with_earlier_checks(first, None) == first
    kept = rerun.with_earlier_checks(second, first)
    assert kept["earlier"] == [first] and {k: v for k, v in kept.items() if k != "earlier"} == second
    third = rerun.with_earlier_checks(dict(second, finished="2026-12-02"), kept)
    assert third["earlier"] == [first, second]  # oldest first, none nested in another
    ledger = Ledger(str(tmp_path / "ledger.json"))
    ledger.add("r", {"commit": "3ebacef", "test": {"map": 0.55}})
    ledger.add("rerun:r", kept)
    rows = [line for line in rerun_section(ledger) if line.startswith("| r ")]
    assert len(rows) == 2 and "(record since replaced) | f370a2e |" in rows[0] and "the same weights" in rows[0]
    assert "| r | 3ebacef |" in rows[1]
    assert "1 of these checks ran on another kind of CPU than their record" in " ".join(rerun_section(ledger))


def test_the_page_says_on_which_kind_of_cpu_the_runs_ran():
    from experiments.report import hardware_sentence

    runs = {
        "a": {"device": "cpu", "cpu": EPYC},
        "b": {"device": "cpu", "cpu": EPYC},
        "c": {"device": "cpu"},  # recorded before records named their CPU
        "d": {"device": "cuda: NVIDIA H200", "cpu": XEON},  # a GPU run is counted by its GPU
    }
    assert hardware_sentence(runs).startswith(
        "From their records, the runs ran on CPUs (AMD EPYC (family 25, model 17), AVX512 kernels): 2 runs; "
        "CPUs (processor not recorded): 1 run; one NVIDIA H200: 1 run (each run's device is in the ledger"
    )
    assert hardware_sentence({}) == "No run is recorded yet."

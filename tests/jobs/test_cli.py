"""The command-line contracts: flags present, --dry-run, and clear errors before Ray starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CONTRACTS = {
    "build_stackexchangeqa.py": ["--dump", "--output", "--min-score", "--negatives", "--seed"],
    "tokenize_corpora.py": ["--dataset", "--input", "--output"],
    "word_vectors.py": ["--data", "--vectors", "--dim", "--epochs"],
    "train.py": [
        "--model",
        "--data",
        "--storage-path",
        "--name",
        "--max-steps",
        "--checkpoint-every",
        "--num-workers",
        "--seed",
    ],
    "evaluate.py": ["--checkpoint", "--data", "--split", "--output"],
    "zero_shot.py": ["--data", "--encoder-path", "--split", "--output"],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A small real tokenised folder (tests/conftest.make_tokenised): what train.py's checks read."""
    from tests.conftest import make_tokenised

    return make_tokenised(tmp_path_factory.mktemp("tiny") / "tokenised")


def _posts_xml(folder) -> str:
    """A two-post Posts.xml in the dump's format."""
    path = folder / "Posts.xml"
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<posts>\n'
        '  <row Id="1" PostTypeId="1" Score="3" Title="Which hops?" Body="&lt;p&gt;Which hops for a '
        'stout?&lt;/p&gt;" Tags="&lt;hops&gt;" CreationDate="2014-01-21T20:26:05.383" />\n'
        '  <row Id="2" PostTypeId="2" ParentId="1" Score="4" Body="&lt;p&gt;Fuggles.&lt;/p&gt;" '
        'CreationDate="2014-01-21T21:00:00.000" />\n</posts>\n'
    )
    return str(path)


def _job(name, *args):
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", name), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("job", sorted(CONTRACTS))
def test_help_documents_contract_flags(job):
    result = _job(job, "--help")
    assert result.returncode == 0
    for flag in CONTRACTS[job] + ["--dry-run"]:
        assert flag in result.stdout, f"{job} --help lacks {flag}"


@pytest.mark.slow
@pytest.mark.parametrize("job", ["zero_shot.py", "word_vectors.py"])
def test_one_process_jobs_that_load_an_encoder_draw_no_library_progress_bar(job, tmp_path):
    """transformers 5 draws a "Loading weights" bar on stderr each time it loads an encoder: the Ray jobs quiet it,
    and these jobs, which start no Ray, printed it before their own lines (evaluate.py too)."""
    from tests.conftest import make_tokenised

    data = make_tokenised(tmp_path / "tokenised")
    options = {"zero_shot.py": [], "word_vectors.py": ["--from-encoder", "minilm", "--output", str(tmp_path / "v.npy")]}
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", job), "--data", data, *options[job]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # the figures line on stderr (zero_shot.py) or nothing there (word_vectors.py: its report is on stdout)
    figures = ["minilm zero-shot (cosine), test: MAP"] if job == "zero_shot.py" else []
    assert [line[:36] for line in done.stderr.splitlines()] == figures, done.stderr[-2000:]


@pytest.mark.slow
def test_dry_run_prints_resolved_config(tmp_path, tiny):
    dump = _posts_xml(tmp_path)
    result = _job("build_stackexchangeqa.py", "--dump", dump, "--output", str(tmp_path / "out"), "--dry-run")
    cfg = json.loads(result.stdout)
    assert cfg["min_score"] == 2 and cfg["negatives"] == 15.71 and cfg["dumps"] == [dump]
    result = _job("train.py", "--model", "gsamn", "--data", tiny, "--dry-run")
    cfg = json.loads(result.stdout)
    assert cfg["lr"] == 1e-3 and cfg["model_config"]["hops"] == 2
    assert cfg["warmup"] == 0.1 and cfg["weight_decay"] == 0.01
    result = _job("train.py", "--model", "ctrn", "--data", tiny, "--model-option", "mlp_layers=2", "--dry-run")
    model = json.loads(result.stdout)["model_config"]
    # the paper's dropout; embeddings trained, since there are no word vectors to keep fixed
    assert model["dropout"] == 0.5 and not model["freeze_embeddings"] and model["mlp_layers"] == 2
    result = _job(
        "train.py",
        "--model",
        "ggsa",
        "--data",
        tiny,
        "--dropout",
        "0.2",
        "--model-option",
        "offset=none",
        "--model-option",
        "composition=multihop",
        "--dry-run",
    )
    model = json.loads(result.stdout)["model_config"]
    assert model["dropout"] == 0.2 and model["offset"] is None and model["composition"] == "multihop"
    assert model["heads"] == 6 and model["group"] == 10 and model["margin"] == 0.1
    result = _job("train.py", "--model", "ggsa", "--data", tiny, "--model-option", "heads=six", "--dry-run")
    assert result.returncode == 2 and "heads=six" in result.stderr


@pytest.mark.slow
def test_training_precision_accumulation_and_selection_options(tiny, tmp_path):
    cfg = json.loads(
        _job(
            "train.py",
            "--model",
            "gsamn",
            "--data",
            tiny,
            "--grad-accumulation",
            "4",
            "--precision",
            "bf16",
            "--eval-every",
            "100",
            "--select-metric",
            "mrr",
            "--dry-run",
        ).stdout
    )
    assert (cfg["grad_accumulation"], cfg["precision"], cfg["eval_every"], cfg["select_metric"]) == (
        4,
        "bf16",
        100,
        "mrr",
    )
    assert json.loads(_job("train.py", "--model", "gsamn", "--data", tiny, "--dry-run").stdout)["precision"] == "auto"
    result = _job("train.py", "--model", "gsamn", "--data", tiny, "--precision", "fp16", "--dry-run")
    assert result.returncode == 2 and "fp16 needs --use-gpu" in result.stderr
    result = _job("train.py", "--model", "gsamn", "--data", tiny, "--grad-accumulation", "0", "--dry-run")
    assert result.returncode == 2 and "at least 1" in result.stderr
    result = _job("evaluate.py", "--checkpoint", str(tmp_path / "runs" / "x"), "--data", tiny, "--dry-run")
    assert result.returncode == 2 and "no such checkpoint or run folder" in _last_line(result)
    cfg = json.loads(
        _job(
            "train.py",
            "--model",
            "gsamn",
            "--data",
            tiny,
            "--test-split",
            "test",
            "--test-output",
            str(tmp_path / "p.jsonl"),
            "--dry-run",
        ).stdout
    )
    assert cfg["test_split"] == "test"
    result = _job("train.py", "--model", "gsamn", "--data", tiny, "--test-output", "p.jsonl", "--dry-run")
    assert result.returncode == 2 and "--test-output needs --test-split" in result.stderr


def test_crawl_sources_options_and_their_errors(tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("# questions\nhttps://stackoverflow.com/questions/1\n\nhttps://beer.stackexchange.com/q/2\n")
    result = _job(
        "build_stackexchangeqa.py",
        "--source",
        "pages",
        "--urls",
        str(urls),
        "--output",
        str(tmp_path / "o"),
        "--api-key",
        "SEKRIT",
        "--dry-run",
    )
    cfg = json.loads(result.stdout)
    assert cfg["urls"] == "2 URLs" and cfg["api_key"] == "***" and "SEKRIT" not in result.stdout
    urls.write_text("https://stackoverflow.com/questions/1\nftp://x/y\n")
    result = _job("build_stackexchangeqa.py", "--source", "pages", "--urls", str(urls), "--output", "o")
    assert result.returncode == 2 and f"{urls}: line 2: not an http(s) URL" in result.stderr
    result = _job("build_stackexchangeqa.py", "--source", "api", "--output", "o")
    assert result.returncode == 2 and "--sites is required" in result.stderr
    result = _job("build_stackexchangeqa.py", "--download", "all", "--output", "o")
    assert result.returncode == 2 and "--sites-xml" in result.stderr


def test_missing_dump_is_a_clear_error(tmp_path):
    result = _job("build_stackexchangeqa.py", "--dump", str(tmp_path / "Posts.xml"), "--output", str(tmp_path / "o"))
    assert result.returncode == 2
    missing = tmp_path / "Posts.xml"
    assert _last_line(result) == f"build_stackexchangeqa: error: --dump {missing}: no such file or folder"
    assert not (tmp_path / "o").exists()


def test_train_without_tokenised_data_is_a_clear_error(tmp_path):
    result = _job("train.py", "--model", "gsamn", "--data", str(tmp_path), "--storage-path", str(tmp_path / "r"))
    assert result.returncode == 2 and "manifest.json: not found" in result.stderr


def test_http_fixture_serves_a_real_saved_page(http_server, shared_data):
    """The loopback server the crawler tests use, serving a real saved Stack Exchange page."""
    import gzip

    import requests
    from bs4 import BeautifulSoup

    folder = os.path.join(shared_data, "stackexchange_html", "pages")
    pages = sorted(f for f in os.listdir(folder) if f.endswith((".html", ".html.gz")))
    if not pages:
        pytest.skip(f"no saved pages in {folder}")
    raw = Path(os.path.join(folder, pages[0])).read_bytes()
    body = gzip.decompress(raw) if pages[0].endswith(".gz") else raw
    http_server.route("/questions/1", body)
    response = requests.get(http_server.url("/questions/1"), timeout=10)
    assert response.status_code == 200 and http_server.requests == ["/questions/1"]
    assert BeautifulSoup(response.content, "lxml").title.get_text().strip()


def test_word_vectors_without_a_tokenised_folder_is_a_clear_error(tmp_path):
    result = _job("word_vectors.py", "--data", str(tmp_path))
    assert result.returncode == 2 and "no manifest.json" in result.stderr


def test_tokenize_corpora_accepts_every_contract_dataset():
    result = _job("tokenize_corpora.py", "--help")
    for name in (
        "wikiqa",
        "trecqa",
        "insuranceqa",
        "yahooqa",
        "semeval-ql",
        "stackexchangeqa",
        "searchqa",
        "quasart",
        "wikihop",
        "squad",
    ):
        assert name in result.stdout


@pytest.mark.slow
def test_word_vectors_in_the_data_folder_set_the_embedding_width_and_are_checked(tmp_path):
    import numpy as np

    from tests.conftest import make_tokenised

    make_tokenised(tmp_path)  # a vocabulary of 10
    np.save(tmp_path / "embeddings.npy", np.zeros((10, 7), np.float32))
    result = _job("train.py", "--model", "ctrn", "--data", str(tmp_path), "--dry-run")
    cfg = json.loads(result.stdout)
    assert cfg["embeddings_file"] == str(tmp_path / "embeddings.npy")
    assert cfg["model_config"]["embed_dim"] == 7 and cfg["model_config"]["freeze_embeddings"]  # fixed, as the paper
    cfg = json.loads(_job("train.py", "--model", "ggsa", "--data", str(tmp_path), "--dry-run").stdout)
    assert cfg["model_config"]["dim"] == 7  # GGSA's width is its embeddings'
    cfg = json.loads(
        _job("train.py", "--model", "ctrn", "--data", str(tmp_path), "--embeddings", "none", "--dry-run").stdout
    )
    assert cfg["embeddings_file"] is None and cfg["model_config"]["embed_dim"] == 300
    result = _job("train.py", "--model", "ggsa", "--data", str(tmp_path), "--dim", "16", "--dry-run")
    assert result.returncode == 2 and "--dim 16 conflicts with the 7-d word vectors" in result.stderr
    np.save(tmp_path / "other.npy", np.zeros((12, 7), np.float32))
    result = _job(
        "train.py", "--model", "ctrn", "--data", str(tmp_path), "--embeddings", str(tmp_path / "other.npy"), "--dry-run"
    )
    assert result.returncode == 2 and "other.npy: 12 rows for a vocabulary of 10" in result.stderr
    result = _job(
        "train.py", "--model", "ctrn", "--data", str(tmp_path), "--embeddings", str(tmp_path / "no.npy"), "--dry-run"
    )
    assert result.returncode == 2 and "no.npy: no such file" in result.stderr


@pytest.mark.ray
def test_a_job_run_directly_starts_its_own_ray_even_where_a_cluster_address_is_recorded():
    """`ray start` and `ray.cluster_utils.Cluster` record their address in <ray temp dir>/ray_current_cluster and
    leave it behind; a plain `ray.init()` would try to join that (dead) cluster and refuse num_cpus."""
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        os.makedirs(os.path.join(temp, "ray"))
        with open(os.path.join(temp, "ray", "ray_current_cluster"), "w") as f:
            f.write("127.0.0.1:9")
        code = (
            "import ray\nfrom runtime.ray_env import ray_session\n"
            "with ray_session(num_cpus=1):\n    print(int(ray.cluster_resources()['CPU']))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": temp}
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split()[-1] == "1"
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.ray
@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "verbose"])
def test_the_state_api_inside_ray_finds_its_own_instance_beside_another(quiet):
    """Ray Train's PlacementGroupCleaner asks the State API from inside Ray every second; with a second Ray on the
    machine (another job, a `ray start`), its search for a cluster failed ("Found multiple active Ray instances")
    and it printed that traceback every second. A --verbose job (quiet=False) met it after the quiet ones no
    longer did."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ray, sys\nray.init(address='local', num_cpus=1, "
            "include_dashboard=False)\nprint('up', flush=True)\nsys.stdin.read()\n",
        ],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "up"
        code = (
            "import ray\nfrom runtime.ray_env import ray_session\n"
            f"with ray_session(num_cpus=1, quiet={quiet}, state_api=True):\n"
            "    @ray.remote\n    def actors():\n        from ray.util.state import list_actors\n"
            "        return len(list_actors())\n"
            "    print('actors', ray.get(actors.remote()))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert "multiple active Ray instances" not in result.stderr
        assert result.stdout.split()[-2] == "actors"
    finally:
        other.stdin.close()
        other.wait(timeout=120)


# Corrupt inputs that fail inside Ray tasks: each job ends with one line naming the job, the file and the problem,
# exit code 1, the traceback in a log file that line names, and no output left looking complete.
def _last_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _beer_posts(shared_data) -> bytes:
    import gzip

    path = os.path.join(shared_data, "stackexchange_dump_beer", "Posts.xml.gz")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found (the beer dump of ../shared/data)")
    with gzip.open(path, "rb") as f:
        return f.read()


def _check_one_line_error(result, job: str, *fragments: str) -> str:
    last = _last_line(result)
    assert result.returncode == 1, result.stderr[-3000:]
    assert last.startswith(f"{job}: error: "), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in last, last
    log = last.rsplit("(traceback: ", 1)[-1].rstrip(")")
    assert os.path.exists(log) and "Traceback" in Path(log).read_text(), last
    return last


@pytest.mark.ray
@pytest.mark.parametrize("corruption", ["truncated gzip", "not XML"])
def test_build_from_a_corrupt_dump_fails_in_one_line(tmp_path, shared_data, corruption):
    import gzip

    posts = _beer_posts(shared_data)
    if corruption == "truncated gzip":
        dump = tmp_path / "Posts.xml.gz"
        whole = gzip.compress(posts)
        dump.write_bytes(whole[: len(whole) // 2])
        expected = ("Posts.xml.gz", "truncated or corrupt gzip")
    else:
        # well-formed rows first (the job's own check before Ray starts reads the first), then what is no XML
        dump = tmp_path / "Posts.xml"
        dump.write_bytes(posts[:200_000].rsplit(b"\n", 1)[0] + b"\n<html><body>\x00 not xml")
        expected = ("Posts.xml", "malformed XML")
    output = tmp_path / "out"
    result = _job("build_stackexchangeqa.py", "--dump", str(dump), "--output", str(output), "--num-cpus", "2")
    _check_one_line_error(result, "build_stackexchangeqa", *expected)
    assert not (output / "stats.json").exists() and not (output / "train").exists()


@pytest.mark.ray
def test_tokenize_a_malformed_tsv_row_fails_in_one_line(tmp_path, shared_data):
    source = os.path.join(shared_data, "wikiqa")
    if not os.path.isdir(source):
        pytest.skip(f"{source} not found")
    corrupt = tmp_path / "wikiqa"
    corrupt.mkdir()
    import gzip

    for split in ("train", "dev", "test"):
        with gzip.open(os.path.join(source, f"WikiQA-{split}.tsv.gz"), "rt", encoding="utf-8", newline="") as f:
            lines = f.read().splitlines(keepends=True)
        if split == "train":
            lines.insert(5, "Q999\tonly two fields\r\n")
        (corrupt / f"WikiQA-{split}.tsv").write_text("".join(lines), encoding="utf-8", newline="")
    output = tmp_path / "tokenised"
    result = _job(
        "tokenize_corpora.py",
        "--dataset",
        "wikiqa",
        "--input",
        str(corrupt),
        "--output",
        str(output),
        "--num-cpus",
        "2",
    )
    _check_one_line_error(result, "tokenize_corpora", "WikiQA-train", "line 6")
    assert not (output / "manifest.json").exists()


def test_a_job_refuses_a_ray_address_where_no_cluster_answers(tmp_path):
    """A RAY_ADDRESS left set after its cluster was taken down: the job waited for it for ever (ray.init retrying,
    a warning every 40 s); now one line, exit 2, before anything is written."""
    import socket

    from tests.conftest import make_tokenised

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    data = make_tokenised(tmp_path / "data")
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", "train.py"), "--model", "gsamn", "--data", data],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, RAY_ADDRESS=address),
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert _last_line(result) == (
        f"train: error: RAY_ADDRESS={address}: no Ray cluster answers there (Connection refused); start it "
        "(infra/local_cluster.py up), or unset RAY_ADDRESS to run on a local Ray of this machine"
    )
    assert sorted(os.listdir(tmp_path)) == ["data"]


@pytest.mark.slow
def test_train_on_a_missing_manifest_or_an_unknown_model_fails_in_one_line(tmp_path):
    result = _job("train.py", "--model", "gsamn", "--data", str(tmp_path), "--storage-path", str(tmp_path / "r"))
    assert result.returncode == 2 and "manifest.json: not found" in _last_line(result)
    assert not (tmp_path / "r").exists() or not os.listdir(tmp_path / "r")
    result = _job("train.py", "--model", "no-such-model", "--data", str(tmp_path))
    assert result.returncode == 2 and "invalid choice: 'no-such-model'" in _last_line(result)

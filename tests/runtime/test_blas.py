"""OpenBLAS's kernels pinned by instruction set (runtime/blas.py): which set a CPU gets, that an inherited
OPENBLAS_CORETYPE is replaced unless asked to keep it, and, in the word-vectors job, that the vectors are the bytes
of the pinned kernels, by golden sha256 values measured under each kernel set."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.schemas import TOKENISED_PAIRS
from pipelines.vocabulary import Vocabulary
from runtime.blas import BLAS_KERNEL_CHOICES, cpu_flags, kernels_for, pin_openblas_kernels
from tests.conftest import REPO

AVX2 = frozenset({"fpu", "sse2", "avx", "avx2", "fma", "bmi2"})
AVX512 = AVX2 | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}


def test_the_kernels_follow_the_instruction_set_not_the_processor_model():
    assert kernels_for(AVX512, "x86_64") == "SkylakeX"  # Zen 4, Zen 5, Skylake-SP and later Xeons alike
    assert kernels_for(AVX2, "x86_64") == "Haswell"  # Haswell and later cores, Zen 1-3
    assert kernels_for(AVX512 - {"avx512bw"}, "x86_64") == "Haswell"  # Xeon Phi: AVX-512F without BW, DQ, VL
    assert kernels_for(frozenset({"avx", "sse2"}), "x86_64") is None  # Sandy Bridge: OpenBLAS's own choice
    assert kernels_for(AVX512, "aarch64") is None
    assert {"skylakex", "haswell", "neoversen1"} <= set(BLAS_KERNEL_CHOICES)


def test_auto_replaces_an_inherited_coretype_and_environment_keeps_it():
    inherited = {"OPENBLAS_CORETYPE": "Haswell"}  # what the measured AVX-512 machine's environment sets
    assert pin_openblas_kernels("auto", inherited, AVX512) == "SkylakeX"
    assert inherited == {"OPENBLAS_CORETYPE": "SkylakeX"}
    kept = {"OPENBLAS_CORETYPE": "Haswell"}
    assert pin_openblas_kernels("environment", kept, AVX512) == "Haswell" and kept == {"OPENBLAS_CORETYPE": "Haswell"}
    assert pin_openblas_kernels("environment", {}, AVX512) is None  # OpenBLAS picks by processor model
    named: dict[str, str] = {}
    assert pin_openblas_kernels("zen", named, AVX512) == "zen" and named == {"OPENBLAS_CORETYPE": "zen"}
    old: dict[str, str] = {}
    assert pin_openblas_kernels("auto", old, frozenset({"avx"})) is None and old == {}  # nothing pinned for it


def test_cpu_flags_read_the_first_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t: x\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "fma"}
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


# sha256 of embeddings.npy for the corpus below (--dim 300 --epochs 1 --seed 1), measured on 2026-12-01 on an AMD
# EPYC of family 26 model 2 with each kernel set forced: the two differ, so the file says which kernels trained it.
GOLDEN_VECTORS = {
    "SkylakeX": "a8552f2d577ceb9af67e13d0b9ba137156c2f306efed0695c026ee682e42073b",
    "Haswell": "6cf2b2dfd22ed229796f7abfa8cc2344caea92743d08d0d368af0f0c6ec1d24e",
}


def _corpus(folder) -> str:
    """20 question-answer pairs over 40 words, enough for the kernels' sums to round apart (a toy of 6 words is not)."""
    os.makedirs(folder / "train")
    words = ["<pad>", "<unk>", "<sep>", "<cls>"] + [f"w{i}" for i in range(40)]
    Vocabulary(words).save(str(folder / "vocab.json"))
    questions = [[4 + (i * 7 + j * 3) % 40 for j in range(8)] for i in range(20)]
    answers = [[4 + (i * 5 + j * 11) % 40 for j in range(8)] for i in range(20)]
    rows = [
        {"qid": f"q{i}", "aid": f"a{i}", "label": 1, "question": "", "answer": "", "question_ids": q, "answer_ids": a}
        for i, (q, a) in enumerate(zip(questions, answers))
    ]  # the columns jobs/tokenize_corpora.py writes; the vectors read the ids alone
    pq.write_table(pa.Table.from_pylist(rows, TOKENISED_PAIRS), folder / "train" / "part-0.parquet")
    manifest = {"schema": "tokenised_pairs", "splits": {"train": {"files": [{"path": "train/part-0.parquet"}]}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(folder)


def _vectors(data: str, *options: str) -> tuple[str, dict, str]:
    """The job in a process of its own, under the measured machine's environment (OPENBLAS_CORETYPE=Haswell)."""
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell")
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", "word_vectors.py"), "--data", data, "--dim", "300"]
        + ["--epochs", "1", "--seed", "1", *options],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    with open(os.path.join(data, "embeddings.npy"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(data, "embeddings.json")) as f:
        kernels = json.load(f)["blas_kernels"]
    return digest, kernels, result.stderr


@pytest.mark.slow
def test_word_vectors_are_the_pinned_kernels_bytes_whatever_the_environment_says(tmp_path):
    pytest.importorskip("gensim")
    pinned = kernels_for(cpu_flags())
    if pinned is None:
        pytest.skip("no pinned OpenBLAS kernels for this CPU (neither x86 AVX2 nor AVX-512)")
    data = _corpus(tmp_path / "data")
    digest, kernels, said = _vectors(data)
    assert set(kernels.values()) == {pinned}, kernels  # scipy's OpenBLAS (gensim's) and numpy's
    assert digest == GOLDEN_VECTORS[pinned]
    if pinned != "Haswell":  # the inherited value was replaced, and the job said so
        assert "not the environment's OPENBLAS_CORETYPE=Haswell" in said
    digest, kernels, said = _vectors(data, "--blas-kernels", "environment")
    assert set(kernels.values()) == {"Haswell"} and digest == GOLDEN_VECTORS["Haswell"] and not said
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell")
    dry = subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", "word_vectors.py"), "--data", data, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert json.loads(dry.stdout)["blas_kernels"] == pinned  # the resolved configuration names them

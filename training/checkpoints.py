"""Checkpoints of jobs/train.py: a folder with state.pt (weights, optimiser, schedule, data position, dev history:
tensors and plain containers only), config.json (the run's and the model's configuration) and checksums.json (the
sha256 of every other file, written last); resolved from a run folder (best by dev metric, or latest), read on
the CPU, local or on a pyarrow filesystem URI, and files published so that they appear whole.

Checkpoints are data, never code: state.pt is read with `torch.load(weights_only=True)`, which refuses any pickled
object but tensors and plain containers, and every load first checks the files against checksums.json. A damaged
checkpoint (a truncated upload, a flipped bit, a file missing) is reported by name; a resume falls back to the
newest intact checkpoint before it (`usable_checkpoint`)."""

from __future__ import annotations

import json
import math
import os
import re
from typing import TYPE_CHECKING

import torch

from pipelines.shards import sha256_file
from runtime.checks import MissingInput, UsageError
from training.optim import evaluation_weights

if TYPE_CHECKING:
    from training.config import TrainConfig


STATE_FILE = "state.pt"
CONFIG_FILE = "config.json"
CHECKSUMS_FILE = "checksums.json"
# a word-vector model's vocabulary (its training data's), kept in each checkpoint: what turns text into its input
VOCAB_FILE = "vocab.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: damaged, incomplete, not ours, or holding more than data."""


SCORE = "select_score"  # the reported metric Ray Train ranks checkpoints by


# The score of a checkpoint with no dev evaluation: below every metric (all lie in [0, 1]), and finite, because
# Ray Train's saved run state is JSON, where -inf comes back as null (and a resumed run then fails to rank).
NO_SCORE = -1.0


def select_score(score: float | None, earlier: list[float]) -> float:
    """What Ray Train ranks a checkpoint by: its dev `score`, one float step below where an `earlier` evaluation
    of the run reached the same score. Ray Train ranks a tie above the checkpoints before it and drops the earlier
    ones first; the run's best is the first to reach its highest score, as --patience counts (a tie is no
    improvement), so a later tie ranks below it. The step (about 1e-16) changes no figure shown."""
    if score is None:
        return NO_SCORE
    rank = float(score)
    for _ in range(sum(1 for value in earlier if value == score)):
        rank = math.nextafter(rank, -math.inf)
    return rank


def best_scored(result) -> tuple | None:
    """(checkpoint, metrics) of a Ray Train result's best kept checkpoint by dev (the highest `select_score`: the
    first to reach the run's highest figure), or None where no kept checkpoint was evaluated on dev."""
    scored = [(c, m) for c, m in result.best_checkpoints or [] if m.get(SCORE) is not None and m[SCORE] > NO_SCORE]
    return max(scored, key=lambda pair: pair[1][SCORE]) if scored else None


def resolve_checkpoint(path: str, which: str = "best") -> str:
    """A checkpoint folder: `path` itself (it holds state.pt, or is a URI), or the best or latest checkpoint of
    the run folder `path` (STORAGE/NAME of jobs/train.py)."""
    return choose_checkpoint(path, which)[0]


def choose_checkpoint(path: str, which: str = "best") -> tuple[str, str]:
    """`resolve_checkpoint`'s checkpoint, and why it was chosen, in words a job prints beside its figures: the
    best by dev metric (its value and step), the latest, or the latest where `which` asked for the best of a run
    that no dev evaluation ranked."""
    if "://" not in path:  # Ray Train reads a run folder as a URI, and a relative path is not one
        path = os.path.abspath(path)
    if "://" in path or os.path.exists(os.path.join(path, STATE_FILE)):
        return path, "the checkpoint named"
    if not os.path.exists(os.path.join(path, "checkpoint_manager_snapshot.json")):
        raise MissingInput(
            f"{path}: neither a checkpoint (no {STATE_FILE}) nor a run folder of jobs/train.py "
            "(no checkpoint_manager_snapshot.json)"
        )
    result = run_result(path)
    best = best_scored(result)
    if which == "latest" or best is None:
        if result.checkpoint is None:
            raise MissingInput(f"{path}: the run has no checkpoint yet")
        why = f"the run's latest checkpoint (step {(result.metrics or {}).get('step', '?')})"
        if which != "latest":
            why += ": no dev evaluation ranked the run's checkpoints, so none is its best"
        return result.checkpoint.path, why
    checkpoint, metrics = best
    dev = metrics.get("dev") or {}
    # a run reported before its reports named the metric: the dev figure its score was (the first, on a tie)
    metric = metrics.get("select_metric") or next((n for n, v in dev.items() if v == metrics[SCORE]), None)
    value = dev.get(metric, metrics[SCORE])
    ranked_by = f"dev {metric.upper() if metric else 'score'} {value:.4f}"
    return checkpoint.path, f"the run's best checkpoint by {ranked_by} (step {metrics.get('step', '?')})"


def run_result(run: str):
    """Ray Train's record of the run folder `run` (its latest and best checkpoints), read without Ray running and
    without Ray Train's notice that it found a snapshot (a job reading a run is not resuming it)."""
    import logging

    import ray.train

    quiet = logging.getLogger("ray.train.v2._internal.execution.checkpoint.checkpoint_manager")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        return ray.train.Result.from_path(run)
    finally:
        quiet.setLevel(level)


def checkpoint_summary(path: str) -> dict:
    """A checkpoint's config.json (train config, model config, vocabulary size and checksum), local or remote,
    after checking the checkpoint's files against their checksums and that its state loads as data."""
    import ray.train

    with ray.train.Checkpoint(path).as_directory() as directory:
        _verify_or_raise(directory, path)
        load_state_file(os.path.join(directory, STATE_FILE), mmap=True)  # data only, or refused here already
        return _with_local_encoder(_read_json(os.path.join(directory, CONFIG_FILE), path))


def checkpoint_config(path: str) -> dict:
    """A checkpoint's config.json alone, read without the checks `checkpoint_summary` makes (its files' sha256, its
    state loading as data), which the run makes where it loads the checkpoint: what a command line reads to choose
    its defaults, without a second pass over the weights or a download of them."""
    import pyarrow.fs

    filesystem, root = pyarrow.fs.FileSystem.from_uri(path if "://" in path else os.path.abspath(path))
    with filesystem.open_input_stream(f"{root}/{CONFIG_FILE}") as f:
        config = json.loads(f.read())
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: {CONFIG_FILE} is not a checkpoint's configuration")
    return _with_local_encoder(config)


def _with_local_encoder(summary: dict) -> dict:
    """A checkpoint's config.json with its encoder folder (train and model configuration) as this machine has it:
    a checkpoint trained on a cluster names the shipped MiniLM in the nodes' site-packages, which a laptop reading
    the checkpoint has elsewhere (`qa_models.encoders.local_encoder`)."""
    from qa_models.encoders import local_encoder

    for section in ("train", "model_config"):
        values = summary.get(section)
        if isinstance(values, dict) and values.get("encoder_path"):
            values["encoder_path"] = local_encoder(values["encoder_path"])
    return summary


def _read_json(file: str, path: str) -> dict:
    if not os.path.exists(file):
        raise CheckpointError(f"{path}: no {CONFIG_FILE} (not a checkpoint of jobs/train.py)")
    try:
        with open(file) as f:
            return json.load(f)
    except ValueError as error:
        raise CheckpointError(f"{file}: damaged ({error})") from None


def pretrained_config(cfg: TrainConfig, manifest: dict) -> tuple[str, dict, str]:
    """The checkpoint --init-from names, its model config and why it was chosen (`choose_checkpoint`: a run's
    best), after checking it fits this run: the same model and, for word-id models, the same vocabulary (by
    checksum) as --data."""
    if not cfg.init_from:
        raise ValueError("pretrained_config needs --init-from")
    path, chosen = choose_checkpoint(cfg.init_from, "best")
    summary = checkpoint_summary(path)
    trained = summary["train"]["model"]
    if trained != cfg.model:
        raise UsageError(f"--init-from {path}: a {trained} checkpoint, this run trains {cfg.model}")
    config = summary.get("model_config")
    if config is None:
        raise CheckpointError(f"--init-from {path}: a checkpoint without its model configuration (an older run)")
    check_vocabulary_fits(summary, manifest, cfg.data, path, "--init-from's checkpoint")
    return path, config, chosen


def check_vocabulary_fits(summary: dict, manifest: dict, data: str, checkpoint: str, whose: str) -> None:
    """Raise UsageError unless `data` (its `manifest`) holds the vocabulary that `checkpoint` (its config.json,
    `summary`; `whose` names it in the message) was trained with: word ids mean words only under the vocabulary
    they were made with. By vocab.json's sha256 where both record it (the same size is no proof: two vocabularies
    capped by --max-vocab have the same size and other words), else by size. A pretrained encoder's checkpoint
    reads its own tokenizer's ids. evaluate.py (--dry-run too) and --init-from check with it."""
    if (summary.get("model_config") or {}).get("encoder_path") or summary["train"].get("encoder_path"):
        return
    advice = f"tokenise it with tokenize_corpora.py --vocab {summary['train']['data']}"
    ours, theirs = manifest.get("vocab_sha256"), summary.get("vocab_sha256")
    if ours and theirs and ours != theirs:
        raise UsageError(
            f"{data}: tokenised with another vocabulary than {whose} ({checkpoint}; vocab.json sha256 "
            f"{ours[:12]} here, {theirs[:12]} there), so its word ids name other words; {advice}"
        )
    size, trained = manifest.get("vocab_size"), summary.get("vocab_size")
    if size and trained and size != trained:
        raise UsageError(f"{data}: {size} word ids in its vocabulary, {trained} in {whose} ({checkpoint}); {advice}")


def write_checkpoint(directory: str, state: dict, summary: dict) -> None:
    """A checkpoint in the empty local folder `directory`: state.pt (tensors and plain containers: what
    weights_only=True reads back), config.json (`summary`: train and model configuration, vocabulary, step,
    dev figures), then checksums.json over every file there (files the caller put there first included)."""
    torch.save(state, os.path.join(directory, STATE_FILE))
    with open(os.path.join(directory, CONFIG_FILE), "w") as f:
        json.dump(summary, f, indent=2)
    write_checksums(directory)  # last: a checkpoint with it is whole


def write_checksums(directory: str) -> None:
    """checksums.json: the sha256 of every other file of the checkpoint folder `directory` (written last)."""
    files = sorted(
        name
        for name in os.listdir(directory)
        if name != CHECKSUMS_FILE and os.path.isfile(os.path.join(directory, name))
    )
    with open(os.path.join(directory, CHECKSUMS_FILE), "w") as f:
        json.dump({"sha256": {name: sha256_file(os.path.join(directory, name)) for name in files}}, f, indent=1)


def weights_sha256(state: dict) -> str:
    """A fingerprint of the weights a state.pt's figures were scored with (`evaluation_weights`): sha256 over each
    tensor's name, dtype, shape and bytes, in name order. Two runs that trained to the same weights, bit for bit,
    share it though their state.pt files differ (a file also carries the seconds trained)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(evaluation_weights(state).items()):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}\0{flat.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def checkpoint_weights_sha256(directory: str) -> str:
    """`weights_sha256` of the local checkpoint folder `directory`'s state.pt."""
    return weights_sha256(load_state_file(os.path.join(directory, STATE_FILE)))


def state_sha256(path: str) -> str | None:
    """The sha256 of the checkpoint `path`'s state.pt (what a record calls its checkpoint_sha256), from its
    checksums.json where it has one (checked by every load), else hashed; None for a checkpoint at a URI."""
    if "://" in path:
        return None
    try:
        with open(os.path.join(path, CHECKSUMS_FILE)) as f:
            return json.load(f)["sha256"][STATE_FILE]
    except (OSError, ValueError, KeyError, TypeError):
        return sha256_file(os.path.join(path, STATE_FILE))


def checkpoint_problem(directory: str) -> str | None:
    """Why the local checkpoint folder `directory` cannot be trusted (a file missing, or not the bytes its
    checksum says), or None. A checkpoint written before checksums were recorded is checked for its files only."""
    for name in (STATE_FILE, CONFIG_FILE):
        if not os.path.isfile(os.path.join(directory, name)):
            return f"{name} is missing"
    listed = os.path.join(directory, CHECKSUMS_FILE)
    if not os.path.exists(listed):
        return None
    try:
        with open(listed) as f:
            expected = json.load(f)["sha256"]
    except (ValueError, KeyError, TypeError) as error:
        return f"{CHECKSUMS_FILE} is damaged ({error})"
    for name, digest in sorted(expected.items()):
        file = os.path.join(directory, name)
        if not os.path.isfile(file):
            return f"{name} is missing"
        if sha256_file(file) != digest:
            return f"{name} does not match its sha256 in {CHECKSUMS_FILE} (truncated or altered)"
    return None


def _verify_or_raise(directory: str, path: str) -> None:
    problem = checkpoint_problem(directory)
    if problem:
        raise CheckpointError(f"{path}: damaged checkpoint: {problem}")


def load_state_file(file: str, mmap: bool = False) -> dict:
    """A state.pt as tensors and plain containers (`weights_only=True`): nothing in it can run code. `mmap`: map
    the tensors' bytes instead of reading them (a check that the file loads, at the cost of its pickle only)."""
    import pickle

    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        # torch's message: advice, then what was refused ("... unsupported GLOBAL posix.system whose module ..."),
        # then a link; the middle is the part that names the object
        found = re.search(r"(?i)(unsupported (?:global|operand)\s+\S+)", str(error))
        what = found.group(1) if found else "an object outside weights_only's allowed types"
        raise CheckpointError(
            f"{file}: refused: it holds Python objects beyond tensors and plain containers, "
            f"which loading would run as code ({what})"
        ) from None
    except (RuntimeError, EOFError, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{file}: damaged ({first[:160]})") from None


def read_state(path: str) -> dict:
    """The state.pt of a checkpoint folder, local or on a pyarrow filesystem URI, on the CPU, after checking its
    files against their checksums."""
    import ray.train

    with ray.train.Checkpoint(path).as_directory() as directory:
        _verify_or_raise(directory, path)
        return load_state_file(os.path.join(directory, STATE_FILE))


def run_checkpoints(run: str) -> list[tuple[int, str]]:
    """(step, path) of the checkpoint folders of the run folder `run` (local or a URI), newest first: by the step
    their config.json records, then by name (Ray Train names them by time). A folder whose config.json cannot be
    read counts as step -1."""
    import pyarrow.fs

    filesystem, root = pyarrow.fs.FileSystem.from_uri(run if "://" in run else os.path.abspath(run))
    try:
        infos = filesystem.get_file_info(pyarrow.fs.FileSelector(root, allow_not_found=True))
    except OSError:
        return []
    found = []
    for info in infos:
        if info.type != pyarrow.fs.FileType.Directory or not info.base_name.startswith("checkpoint_"):
            continue
        if info.base_name.startswith("checkpoint_tmp"):
            continue
        step = -1
        try:
            with filesystem.open_input_stream(f"{info.path}/{CONFIG_FILE}") as f:
                step = int(json.loads(f.read()).get("step", -1))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        path = info.path if "://" not in run else run.rstrip("/") + "/" + info.base_name
        found.append((step, info.base_name, path))
    return [(step, path) for step, _, path in sorted(found, reverse=True)]


def usable_checkpoint(path: str, log=None) -> str:
    """`path` where it is intact, else the newest intact checkpoint of its run folder older than it (logging each
    damaged one through `log`); CheckpointError naming every damaged one when none is intact."""
    import ray.train

    run, name = path.rstrip("/").rsplit("/", 1)
    newest = run_checkpoints(run)
    steps = {p.rstrip("/"): step for step, p in newest}
    limit = steps.get(path.rstrip("/"), -1)

    def older(step: int, other: str) -> bool:  # by step where the damaged one's is readable, else by name (time)
        return step <= limit if limit >= 0 else other.rstrip("/").rsplit("/", 1)[-1] < name

    candidates = [path] + [p for step, p in newest if p.rstrip("/") != path.rstrip("/") and older(step, p)]
    damaged: list[str] = []
    for candidate in candidates:
        with ray.train.Checkpoint(candidate).as_directory() as directory:
            problem = checkpoint_problem(directory)
            if problem is None:
                try:
                    load_state_file(os.path.join(directory, STATE_FILE), mmap=True)
                except CheckpointError as error:
                    problem = str(error).split(": ", 1)[-1]
        if problem is None:
            if damaged and log:
                log(f"[train] resuming from {candidate} instead (step {steps.get(candidate.rstrip('/'), '?')})")
            return candidate
        damaged.append(f"{candidate}: {problem}")
        if log:
            log(f"[train] damaged checkpoint {candidate}: {problem}")
    raise CheckpointError(
        f"every checkpoint of {run} is damaged ({'; '.join(damaged[:3])}); remove the run folder "
        "or train under another --name"
    )


def load_pretrained(model, path: str) -> None:
    state = evaluation_weights(read_state(path))  # the weights its figures were scored with
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"--init-from {path}: its weights do not fit this model ({error})") from None


def run_dir(cfg: TrainConfig) -> str:
    storage = os.path.abspath(cfg.storage_path) if "://" not in cfg.storage_path else cfg.storage_path
    return storage.rstrip("/") + "/" + cfg.name


def publish(local_path: str, destination: str) -> None:
    """Put a finished local file at `destination` (a path or a pyarrow filesystem URI), or a folder on object
    storage, so that it appears whole: a rename on local and shared file systems, one upload per file on object
    storage."""
    import shutil

    import pyarrow.fs

    if "://" in destination:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(destination)
        pyarrow.fs.copy_files(local_path, path, destination_filesystem=filesystem)
        return
    if os.path.isdir(local_path):  # folders are written in place on local storage (training.progress.Scalars)
        raise ValueError(f"publish: {local_path} is a folder; only object storage takes one (got {destination})")
    os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
    staged = f"{destination}.partial-{os.getpid()}"
    shutil.copyfile(local_path, staged)
    os.replace(staged, destination)


def predictions_name(split: str) -> str:
    return f"{split}_predictions.jsonl"


def load_checkpoint(directory: str, device):
    """(model in eval mode, TrainConfig, state, config.json) of a jobs/train.py checkpoint."""
    import ray.train

    from qa_models import MODELS
    from training.config import TrainConfig

    with ray.train.Checkpoint(directory).as_directory() as local:
        _verify_or_raise(local, directory)
        summary = _with_local_encoder(_read_json(os.path.join(local, CONFIG_FILE), directory))
        state = load_state_file(os.path.join(local, STATE_FILE))
    if "model_config" not in summary:
        raise CheckpointError(
            f"{directory}: a checkpoint without its model configuration (written before "
            "jobs/train.py recorded it); retrain or resume it once to rewrite it"
        )
    cfg = TrainConfig.from_saved(summary["train"])
    if cfg.model not in MODELS:
        raise CheckpointError(f"{directory}: a checkpoint of {cfg.model!r}, which this version does not know")
    model_class = MODELS[cfg.model]
    model = model_class(model_class.config_class(**summary["model_config"]))
    try:
        model.load_state_dict(evaluation_weights(state))  # the moving average where the run kept one
    except RuntimeError as error:
        raise CheckpointError(
            f"{directory}: its weights do not fit its own model configuration ({str(error).splitlines()[0][:160]})"
        ) from None
    return model.to(device).eval(), cfg, state, summary


def write_jsonl(records: list[dict], path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    staged = f"{path}.partial-{os.getpid()}"
    with open(staged, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(staged, path)

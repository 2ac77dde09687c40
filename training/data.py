"""What a run reads: the tokenised folder's manifest, word vectors, model inputs from numpy batches (`Batcher`),
and the evaluation batches of a split, read straight from Parquet in a fixed, length-sorted order."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.checks import MissingInput, UsageError

if TYPE_CHECKING:
    from training.config import TrainConfig


# The config field that is the width of a model's word embeddings, in the order looked for (GGSA and GSAMN have
# one width for embeddings and model; CTRN, IARNN and DynSAN project from their own embedding width).
EMBEDDING_WIDTH_FIELDS = ("embed_dim", "word_dim", "dim")


def embeddings_path(cfg: TrainConfig) -> str | None:
    """The word-vector file the model starts from (jobs/word_vectors.py's embeddings.npy), or None."""
    if cfg.embeddings == "none" or cfg.encoder_path or cfg.init_from:
        if cfg.embeddings not in ("auto", "none"):
            other = "--encoder-path" if cfg.encoder_path else "--init-from"
            raise UsageError(
                f"--embeddings {cfg.embeddings} and {other} exclude each other: the pretrained "
                "weights bring their own token embeddings"
            )
        return None
    if cfg.embeddings == "auto":
        path = os.path.join(cfg.data, "embeddings.npy")
        return path if os.path.exists(path) else None
    if not os.path.exists(cfg.embeddings):
        raise MissingInput(f"--embeddings {cfg.embeddings}: no such file (write one with jobs/word_vectors.py)")
    return cfg.embeddings


def embeddings_shape(path: str, vocab_size: int | None) -> tuple[int, int]:
    """(rows, width) of a word-vector file, checked against the vocabulary without reading the matrix."""
    try:
        matrix = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as error:
        said = str(error).split(". ")[0]  # numpy's first sentence; it calls any other file pickled data
        raise UsageError(f"{path}: not a .npy matrix of jobs/word_vectors.py (numpy: {said})") from None
    if matrix.ndim != 2 or not np.issubdtype(matrix.dtype, np.floating):
        raise UsageError(f"{path}: expected a float (vocab, dim) matrix, got {matrix.dtype} {matrix.shape}")
    if vocab_size and matrix.shape[0] != vocab_size:
        raise UsageError(
            f"{path}: {matrix.shape[0]} rows for a vocabulary of {vocab_size} (vectors written for "
            "another tokenisation? rerun jobs/word_vectors.py on this --data)"
        )
    return matrix.shape


def check_data_fits_model(cfg: TrainConfig, manifest: dict) -> None:
    from qa_models import MODELS

    passages = MODELS[cfg.model].inputs == "passages"
    schema = manifest.get("schema", "tokenised_pairs")
    if passages and schema != "tokenised_passages":
        raise UsageError(
            f"{cfg.data}: {schema} shards; --model {cfg.model} reads reading-comprehension passages "
            "(tokenize_corpora.py --dataset searchqa|quasart|wikihop|squad)"
        )
    if not passages and schema != "tokenised_pairs":
        raise UsageError(
            f"{cfg.data}: {schema} shards; --model {cfg.model} trains on answer-selection pairs (tokenised_pairs)"
        )


class Batcher:
    """Numpy batches from Ray Data to model inputs (the keyword arguments of the model's forward) and labels,
    for the vocabulary or a transformer's tokenizer, in the layout the model reads (`Model.inputs`); training
    batches of a pairwise model (`Model.objective`) are triplets with a negative answer per positive. Passage
    models get their inputs and targets (answer occurrences, candidate mentions) from `passage_batch`, the
    context cut at --max-len tokens (default: what the shards were capped at, 5,000 when not said)."""

    def __init__(
        self,
        cfg: TrainConfig,
        inputs: str = "joint",
        objective: str | None = None,
        max_len: int | None = None,
        max_context: int | None = None,
    ):
        from qa_models.batching import TransformerPairs
        from training.config import PAD_MULTIPLE_COMPILED

        self.max_context = cfg.max_len or max_context or 5000
        self.max_len = max_len or cfg.max_len or 256
        self.inputs, self.seed, self.negatives = inputs, cfg.seed, cfg.negatives
        self.pairwise = objective == "pairwise"
        pad_multiple = PAD_MULTIPLE_COMPILED if cfg.compile != "none" else None  # a few shapes: a few graphs
        self.transformer = TransformerPairs(cfg.encoder_path, self.max_len, pad_multiple) if cfg.encoder_path else None

    def length_key(self, batch: dict) -> np.ndarray:
        """What padding follows from, per row: the context (passages), or question and answer, capped as the
        model reads them. Pairwise models sort by question length, then question, so that a question's rows
        stay together (its negatives for the triplets come from its own rows)."""
        if self.inputs == "passages":
            return np.minimum(row_lengths(batch["context_ids"]), self.max_context)
        questions = np.minimum(row_lengths(batch["question_ids"]), self.max_len)
        if self.pairwise:
            _, question_rank = np.unique(batch["qid"], return_inverse=True)
            return questions * (len(batch["qid"]) + 1) + question_rank.reshape(-1)
        return np.minimum(questions + row_lengths(batch["answer_ids"]), self.max_len)

    def __call__(self, batch: dict, train: bool = False) -> tuple[dict, Any]:
        from qa_models.batching import pair_batch, passage_batch, separate_batch, triplet_batch

        if self.inputs == "passages":
            encoded = passage_batch(batch, max_context=self.max_context)
            return encoded, encoded.pop("targets")
        if train and self.pairwise:
            encoded = triplet_batch(
                batch["qid"],
                batch["question_ids"],
                batch["answer_ids"],
                batch["label"],
                self.max_len,
                self.seed,
                self.negatives,
            )
        elif self.transformer is not None:
            encoded = self.transformer(batch["question"], batch["answer"], batch["label"])
        elif self.inputs == "separate":
            encoded = separate_batch(batch["question_ids"], batch["answer_ids"], batch["label"], self.max_len)
        else:
            encoded = pair_batch(batch["question_ids"], batch["answer_ids"], batch["label"], self.max_len)
        labels = encoded.pop("labels")
        return encoded, labels


def row_lengths(column) -> np.ndarray:
    return np.fromiter((len(x) for x in column), dtype=np.int64, count=len(column))


def to_device(value, device):
    """A tensor, or a dict of them (reading-comprehension targets), on `device`. To a GPU the copy goes from
    pinned memory without waiting, so the host builds the next batch while this one travels and trains."""
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if torch_device_type(device) == "cuda" and value.device.type == "cpu":
        # the training loop's prefetch thread has pinned its batches already (`pinned`)
        return (value if value.is_pinned() else value.pin_memory()).to(device, non_blocking=True)
    return value.to(device)


def pinned(value):
    """A tensor, or a dict of them, in page-locked memory (what a copy to a GPU can read without waiting)."""
    if isinstance(value, dict):
        return {k: pinned(v) for k, v in value.items()}
    return value.pin_memory()


def prefetched(items, prepare, depth: int = 2):
    """`prepare(item)` for each of `items`, in order, computed in a thread up to `depth` items ahead of the
    consumer: the host reads, tokenises, pads and pins the next batches while the device trains on this one. An
    exception in the thread is raised to the consumer where it happened; closing the generator stops the thread."""
    import queue
    import threading

    done = object()
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put((prepare(item), None)):
                    return
            put((done, None))
        except BaseException as error:  # handed to the consumer, raised there
            put((None, error))

    thread = threading.Thread(target=work, name="prefetch-batches", daemon=True)
    thread.start()
    try:
        while True:
            value, error = ready.get()
            if error is not None:
                raise error
            if value is done:
                return
            yield value
    finally:
        stop.set()


def torch_device_type(device) -> str:
    """The type ("cuda", "cpu", ...) of a torch.device or a device string."""
    return getattr(device, "type", str(device).split(":")[0])


def parquet_batches(paths: list[str], batch_size: int, columns: list[str]):
    """Numpy batches of Parquet files in file order: `batch_size` rows each across file boundaries, the last one
    short."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def numpy_batch(table: pa.Table) -> dict:
        # copies: Arrow's zero-copy arrays are read-only, which torch.as_tensor warns about
        return {name: np.array(table.column(name).to_numpy()) for name in columns}

    pending, rows = [], 0
    for path in paths:
        for record_batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns):
            pending.append(record_batch)
            rows += record_batch.num_rows
            while rows >= batch_size:
                table = pa.Table.from_batches(pending)
                yield numpy_batch(table.slice(0, batch_size))
                rest = table.slice(batch_size)
                pending, rows = rest.to_batches(), rest.num_rows
    if rows:
        yield numpy_batch(pa.Table.from_batches(pending))


ROW = "_row"  # the position in the split's files of each row of an evaluation batch


EVAL_POOL_BATCHES = 32  # evaluation batches sorted by length together: memory stays bounded on large splits


def eval_batches(paths: list[str], batch_size: int, columns: list[str], length_key=None):
    """Numpy batches of a split for scoring, the same in training's dev evaluation and in jobs/evaluate.py (a
    padded batch changes scores by rounding, and an undertrained model's near-tied spans flip on that). Pools of
    EVAL_POOL_BATCHES batches are sorted by `length_key` (stably), so that a batch pads to rows of like length: a
    transformer's scoring costs about a third less than in file order. Each batch carries ROW, which
    score_batches and read_batches put their results back in file order by."""
    offset = 0
    for pool in parquet_batches(paths, batch_size * EVAL_POOL_BATCHES, columns):
        rows = len(next(iter(pool.values())))
        order = np.argsort(length_key(pool), kind="stable") if length_key is not None else np.arange(rows)
        pool = {name: values[order] for name, values in pool.items()}
        pool[ROW] = order + offset
        offset += rows
        for start in range(0, rows, batch_size):
            yield {name: values[start : start + batch_size] for name, values in pool.items()}


def in_file_order(values: list, positions: list) -> list:
    """`values` of length-sorted evaluation batches back in the order of the files (as they are without ROW)."""
    if not positions:
        return values
    return [values[i] for i in np.argsort(positions, kind="stable")]

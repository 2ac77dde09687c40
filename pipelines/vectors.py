"""Word vectors aligned to a tokenised corpus's vocabulary: fastText trained on its training split (gensim's
subword skip-gram), published vectors loaded from a `.vec` / GloVe text file, or static vectors distilled from
a local pretrained transformer (`encoder_vectors`: each word's contextual states averaged over its occurrences
in the training split, Bommasani et al. 2020's pooled static embeddings), the offline stand-in for vectors
pre-trained on a large corpus when GloVe or word2vec cannot be downloaded.

The result is `embeddings.npy` (float32, one row per vocabulary id, row 0 `<pad>` zeros) and `embeddings.json`
(where the vectors came from, dimension, and how many vocabulary words they cover: the out-of-vocabulary rate,
by type and by training-token frequency). Words the vectors do not cover get small random vectors from a seeded
generator, the usual initialisation when embeddings are then trained or projected.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from pipelines.atomic import FileKind, add_derived_file, check_output_file
from pipelines.readers.common import open_text
from pipelines.shards import check_vocabulary, read_manifest, shard_paths, tokenised_files
from pipelines.vocabulary import PAD, RESERVED, Vocabulary
from runtime.blas import openblas_kernels
from runtime.checks import MissingInput, UsageError, integer_at_least, seed_in_range


class VectorsError(ValueError):
    """A vectors file that is not in the `.vec` / GloVe text format; the message names the file and line."""


# What --output and its report beside it hold, and so the only files a new matrix replaces
VECTORS = FileKind("an earlier word-vector matrix (.npy)", "npy")
VECTORS_REPORT = FileKind("an earlier word-vector report (JSON with oov_rate)", "json", "oov_rate")


# What trains fastText's vectors (train_fasttext), recorded beside them; the encoder's and the loaded vectors'
# options (encoder_batch, lowercase_fallback, ...) were listed there too, though no fastText run reads them.
FASTTEXT_OPTIONS = ("dim", "epochs", "window", "min_count", "min_n", "max_n", "workers", "seed")


@dataclass
class VectorsConfig:
    data: str  # a tokenise_corpora output folder
    vectors: str | None = None  # a .vec / GloVe .txt(.gz) file; None: train fastText on data's train split
    dim: int = 300
    epochs: int = 5
    window: int = 5
    min_count: int = 1
    min_n: int = 3  # character n-gram lengths of fastText's subwords
    max_n: int = 6
    # fastText threads: one gives the same vectors on every run (several race on the shared weights, so a data step
    # re-run elsewhere would give the word-vector rows other inputs); 0: every core of this machine
    workers: int = 1
    seed: int = 0
    lowercase_fallback: bool = True  # a word missing from cased vectors takes its lower-case form's vector
    encoder: str | None = None  # a local transformer ('minilm', 'mpnet-base' or a directory): distil its vectors
    encoder_layer: int = -1  # which hidden state (0: the input embeddings, -1: the last layer)
    encoder_batch: int = 64  # sentences per forward pass
    encoder_max_len: int = 128  # word pieces per sentence; longer sentences are cut
    output: str | None = None  # the .npy to write; None: DATA/embeddings.npy

    def __post_init__(self):
        """Every option range-checked here, before any work (the job's --dry-run runs the same checks)."""
        integer_at_least("--dim", self.dim, 1)
        integer_at_least("--epochs", self.epochs, 1)
        integer_at_least("--window", self.window, 1)
        integer_at_least("--min-count", self.min_count, 1)
        integer_at_least("--min-n", self.min_n, 1)
        integer_at_least("--max-n", self.max_n, self.min_n)
        integer_at_least("--workers", self.workers, 0)
        seed_in_range("--seed", self.seed)
        integer_at_least("encoder_batch", self.encoder_batch, 1)
        integer_at_least("encoder_max_len", self.encoder_max_len, 2)
        if self.vectors and self.encoder:
            raise UsageError("give either published vectors (--vectors) or an encoder to distil (--from-encoder)")
        if self.output is not None and not self.output.endswith(".npy"):
            raise UsageError(f"--output {self.output}: the matrix is written as .npy (name it so)")

    @property
    def target(self) -> str:
        return self.output or os.path.join(self.data, "embeddings.npy")

    def check_inputs(self) -> None:
        """The inputs exist and neither file written (the .npy and its .json report) replaces an input."""
        if not os.path.exists(os.path.join(self.data, "manifest.json")):
            raise MissingInput(f"--data {self.data}: no manifest.json (run jobs/tokenize_corpora.py first)")
        manifest = read_manifest(self.data)  # damaged, or not a manifest
        check_vocabulary(self.data, manifest)  # the rows' ids are this vocabulary's, and so the matrix's rows
        if "train" not in manifest["splits"]:  # fastText, distillation and the OOV rate by token read it
            raise UsageError(f"--data {self.data}: manifest.json has no 'train' split")
        shard_paths(self.data, "train")  # its shards are there, whole, as the manifest lists them
        if self.vectors and not os.path.exists(self.vectors):
            raise MissingInput(f"--vectors {self.vectors}: no such file")
        if self.vectors and os.path.isdir(self.vectors):
            raise UsageError(f"--vectors {self.vectors}: a folder; name the vectors file (.vec or GloVe .txt)")
        if self.vectors:
            try:
                check_vectors_file(self.vectors)
            except (OSError, VectorsError) as error:
                raise UsageError(f"--vectors {error}") from None
        if self.encoder:
            from qa_models.encoders import require_encoder

            try:
                require_encoder(self.encoder, self.encoder_max_len, "encoder_max_len")
            except (ImportError, FileNotFoundError, ValueError) as error:
                raise MissingInput(f"--from-encoder {self.encoder}: {error}") from None
        inputs = [path for path in tokenised_files(self.data) if not path.endswith("embeddings.npy")]
        inputs += [self.vectors] if self.vectors else []
        check_output_file(self.target, inputs, kind=VECTORS)
        report = self.target[: -len(".npy")] + ".json"
        check_output_file(report, inputs, option="--output (its .json report)", kind=VECTORS_REPORT)


class TrainSentences:
    """The training split's token sequences, re-read from the shards on every pass (gensim makes several),
    never held in memory. Ids are mapped back to their words (`<unk>` where the vocabulary had none)."""

    def __init__(self, data: str):
        manifest = read_manifest(data)
        self.files = [os.path.join(data, e["path"]) for e in manifest["splits"]["train"]["files"]]
        self.columns = (
            ["question_ids", "answer_ids"]
            if manifest["schema"] == "tokenised_pairs"
            else ["question_ids", "context_ids"]
        )
        self.words = Vocabulary.load(os.path.join(data, "vocab.json")).tokens
        self.pairs = manifest["schema"] == "tokenised_pairs"

    def __iter__(self) -> Iterator[list[str]]:
        seen_questions: set[str] = set()
        for file in self.files:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=4096, columns=["qid", *self.columns]):
                qids = batch.column("qid").to_pylist()
                questions = batch.column(self.columns[0]).to_pylist()
                others = batch.column(self.columns[1]).to_pylist()
                for qid, question, other in zip(qids, questions, others):
                    if not self.pairs or qid not in seen_questions:  # a question once, not once per candidate
                        seen_questions.add(qid)
                        yield [self.words[i] for i in question]
                    yield [self.words[i] for i in other]


def train_fasttext(cfg: VectorsConfig):
    from gensim.models import FastText

    sentences = TrainSentences(cfg.data)
    model = FastText(
        vector_size=cfg.dim,
        window=cfg.window,
        min_count=cfg.min_count,
        sg=1,
        min_n=cfg.min_n,
        max_n=cfg.max_n,
        workers=cfg.workers or os.cpu_count() or 1,
        seed=cfg.seed,
    )
    model.build_vocab(corpus_iterable=sentences)
    model.train(corpus_iterable=sentences, total_examples=model.corpus_count, epochs=cfg.epochs)
    return model.wv


def load_vectors(
    path: str, wanted: set[str] | None, limit: int | None = None
) -> tuple[dict[str, np.ndarray], int, int]:
    """Vectors of the `wanted` words (None: every word) from a fastText `.vec` (a `count dim` first line) or GloVe
    text file (no header), streamed so that only wanted words are kept; with `limit`, the first that many words
    only (`check_vectors_file`). Returns (vectors, dimension, words read)."""
    vectors: dict[str, np.ndarray] = {}
    dim = None
    count = 0
    with open_text(path) as f:
        try:
            for number, line in enumerate(f, start=1):
                parts = line.rstrip("\r\n").rstrip(" ").split(" ")
                if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                    dim = int(parts[1])  # fastText's header
                    continue
                if len(parts) < 2:
                    if not line.strip():
                        continue
                    raise VectorsError(f"{path}: line {number}: expected a word and its numbers")
                if dim is None:
                    dim = len(parts) - 1
                if len(parts) - 1 != dim:
                    raise VectorsError(
                        f"{path}: line {number}: {len(parts) - 1} numbers, expected {dim} (truncated "
                        "line, or a word with a space in it)"
                    )
                count += 1
                word = parts[0]
                if (wanted is None or word in wanted) and word not in vectors:
                    try:
                        vectors[word] = np.asarray(parts[1:], dtype=np.float32)
                    except ValueError:
                        raise VectorsError(f"{path}: line {number}: a value that is not a number") from None
                if limit is not None and count >= limit:
                    break
        except UnicodeDecodeError:
            raise VectorsError(
                f"{path}: not text (a .vec or GloVe .txt file; word2vec's binary .bin is not read)"
            ) from None
    if dim is None:
        raise VectorsError(f"{path}: no vectors in the file")
    return vectors, dim, count


def check_vectors_file(path: str, words: int = 5) -> None:
    """Raise VectorsError unless the first `words` vectors of `path` read as the run reads them, every value a
    number: a file of another kind is named before any work, while the run reads the whole file (GloVe's is
    gigabytes) only after the job has started."""
    load_vectors(path, None, limit=words)


def encoder_vectors(cfg: VectorsConfig, words: list[str]) -> tuple[dict[str, np.ndarray], int, dict]:
    """Static vectors from a pretrained transformer: every training sentence goes through the encoder once, each
    word's state (the mean of its word pieces' states at `encoder_layer`) is summed into its vocabulary row, and
    the row is the mean over the word's occurrences. A word the training split never shows in context (one the
    vocabulary took from another split, or one cut by `encoder_max_len`) is encoded alone, as `[CLS] word [SEP]`
    (the decontextualised form, weaker but never missing). Returns (vectors by word, dimension, statistics)."""
    import torch

    if not cfg.encoder:
        raise VectorsError("encoder_vectors needs --from-encoder")
    from transformers import AutoTokenizer

    from qa_models.encoders import load_transformer, resolve_encoder

    path = resolve_encoder(cfg.encoder)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)  # never the Hub, as every encoder here
    if not tokenizer.is_fast:
        raise VectorsError(f"{path}: a fast tokenizer is needed to map word pieces back to words")
    model = load_transformer(path).eval()
    dim = model.config.hidden_size
    index = {w: i for i, w in enumerate(words)}
    sums = np.zeros((len(words), dim), dtype=np.float64)
    counts = np.zeros(len(words), dtype=np.int64)

    def encode(batch: list[list[str]]) -> None:
        enc = tokenizer(
            batch,
            is_split_into_words=True,
            truncation=True,
            max_length=cfg.encoder_max_len,
            padding=True,
            return_tensors="pt",
        )
        with torch.inference_mode():
            states = model(**enc, output_hidden_states=True).hidden_states[cfg.encoder_layer]  # [B, T, dim]
        states = states.float().numpy()
        for b, sentence in enumerate(batch):
            pieces: dict[int, list[int]] = {}
            for t, w in enumerate(enc.word_ids(b)):
                if w is not None:
                    pieces.setdefault(w, []).append(t)
            for w, positions in pieces.items():
                row = index.get(sentence[w])
                if row is not None:
                    sums[row] += states[b, positions].mean(axis=0)
                    counts[row] += 1

    batch: list[list[str]] = []
    sentences = 0
    for sentence in TrainSentences(cfg.data):
        words_only = [w for w in sentence if w not in RESERVED]
        if words_only:
            batch.append(words_only)
        if len(batch) == cfg.encoder_batch:
            encode(batch)
            sentences += len(batch)
            batch = []
    if batch:
        encode(batch)
        sentences += len(batch)
    in_context = counts > 0
    alone = [w for i, w in enumerate(words) if not in_context[i] and w not in RESERVED]
    for start in range(0, len(alone), cfg.encoder_batch):
        encode([[w] for w in alone[start : start + cfg.encoder_batch]])
    vectors = {w: (sums[i] / counts[i]).astype(np.float32) for i, w in enumerate(words) if counts[i] > 0}
    stats = {
        "encoder": {"name": cfg.encoder, "path": str(path), "layer": cfg.encoder_layer, "max_len": cfg.encoder_max_len},
        "sentences": sentences,
        "words_in_context": int(in_context.sum()),
        "words_encoded_alone": len(alone),
    }
    return vectors, dim, stats


def _train_counts(data: str, size: int) -> np.ndarray:
    """How often each vocabulary id occurs in the training split (for the token-weighted OOV rate)."""
    sentences = TrainSentences(data)
    counts = np.zeros(size, dtype=np.int64)
    for file in sentences.files:
        for batch in pq.ParquetFile(file).iter_batches(batch_size=8192, columns=sentences.columns):
            for column in sentences.columns:
                ids = batch.column(column).flatten().to_numpy(zero_copy_only=False)
                counts += np.bincount(ids, minlength=size)[:size]
    return counts


def embedding_matrix(cfg: VectorsConfig) -> tuple[np.ndarray, dict]:
    vocab = Vocabulary.load(os.path.join(cfg.data, "vocab.json"))
    words = vocab.tokens
    rng = np.random.default_rng(cfg.seed)
    lookup: Callable[[str], np.ndarray | None]
    if cfg.encoder:
        found, dim, source = encoder_vectors(cfg, words)
        lookup = found.get
        composed = 0
    elif cfg.vectors:
        wanted = set(words) | ({w.lower() for w in words} if cfg.lowercase_fallback else set())
        found, dim, in_file = load_vectors(cfg.vectors, wanted)
        source = {"vectors": os.path.abspath(cfg.vectors), "words_in_file": in_file}

        def from_file(w: str) -> np.ndarray | None:
            return found.get(w, found.get(w.lower()) if cfg.lowercase_fallback else None)

        lookup = from_file
        composed = 0
    else:
        wv = train_fasttext(cfg)
        dim = cfg.dim
        source = {
            "fasttext": {k: getattr(cfg, k) for k in FASTTEXT_OPTIONS},
            "trained_words": len(wv.key_to_index),
            # what gensim's training arithmetic ran on: vectors differ, in the last bits, by these (runtime/blas.py)
            "blas_kernels": openblas_kernels(),
        }
        # fastText composes a vector for any word from its character n-grams; count the words it had to compose.
        composed = sum(w not in wv.key_to_index for w in words if w not in RESERVED)

        def composed_by_fasttext(w: str) -> np.ndarray:
            return wv[w]

        lookup = composed_by_fasttext
    matrix = rng.normal(0.0, 0.1, size=(len(words), dim)).astype(np.float32)
    covered = np.zeros(len(words), dtype=bool)
    for i, word in enumerate(words):
        if word in RESERVED:
            continue
        vector = lookup(word)
        if vector is not None:
            matrix[i], covered[i] = vector, True
    matrix[words.index(PAD)] = 0.0
    ordinary = np.array([w not in RESERVED for w in words])
    counts = _train_counts(cfg.data, len(words))
    missing = ordinary & ~covered
    stats = {
        **source,
        "dim": dim,
        "vocab_size": len(words),
        "covered": int(covered.sum()),
        "oov_words": int(missing.sum()),
        "oov_rate": round(float(missing.sum() / max(1, ordinary.sum())), 4),
        "oov_token_rate": round(float(counts[missing].sum() / max(1, counts[ordinary].sum())), 4),
        "unk_token_rate": round(float(counts[words.index(RESERVED[1])] / max(1, counts.sum())), 4),
    }
    if not cfg.vectors and not cfg.encoder:
        stats["composed_from_subwords"] = composed
    return matrix, stats


def write(cfg: VectorsConfig) -> dict:
    """The matrix (`cfg.output`, by default DATA/embeddings.npy) and its statistics beside it (the same name with
    .json), each written whole (temporary file, rename)."""
    cfg.check_inputs()
    matrix, stats = embedding_matrix(cfg)
    tag = uuid.uuid4().hex[:8]
    target = cfg.target
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    with open(f"{target}.tmp-{tag}", "wb") as f:
        np.save(f, matrix)
    os.replace(f"{target}.tmp-{tag}", target)
    report = target[: -len(".npy")] + ".json"
    with open(f"{report}.tmp-{tag}", "w") as f:
        json.dump(stats, f, indent=2)
    os.replace(f"{report}.tmp-{tag}", report)
    for path in (target, report):  # they go with the vocabulary they were made for, when the data is tokenised anew
        add_derived_file(path)
    return stats

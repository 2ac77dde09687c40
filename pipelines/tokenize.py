"""Tokenisation of QA pairs with spaCy, and a vocabulary counted over the training split, as Ray Data stages.

spaCy's blank English pipeline is only its rule-based tokenizer, so nothing is downloaded. Questions repeat
across their candidate answers, so each batch tokenises a distinct question once.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from pipelines.atomic import staged_dir
from pipelines.schemas import QA_PAIRS, ROW_GROUP_ROWS, TOKENISED_PAIRS, check_parquet_files, conform, parquet_files

PAD, UNK, SEP, CLS = "<pad>", "<unk>", "<sep>", "<cls>"
RESERVED = (PAD, UNK, SEP, CLS)  # ids 0..3 in every vocabulary


class SpacyTokenizer:
    """Adds `question_tokens` and `answer_tokens` (list<string>) from spaCy's `en` tokenizer.

    Texts already tokenised by this actor are looked up, not tokenised again: a question repeats over its
    candidates, and InsuranceQA's 24,981 answers fill 2.3 million pool rows. The cache holds at most
    `cache_tokens` tokens (about 60 bytes each) and starts over when full."""

    def __init__(self, lowercase: bool = True, batch_size: int = 256, cache_tokens: int = 2_000_000):
        import spacy

        self.nlp = spacy.blank("en")
        self.nlp.max_length = 10_000_000
        self.lowercase = lowercase
        self.batch_size = batch_size
        self.cache_tokens = cache_tokens
        self._cache: dict[str, list[str]] = {}
        self._cached = 0

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        out = []
        for doc in self.nlp.pipe(texts, batch_size=self.batch_size):
            words = [t.text for t in doc if not t.is_space]
            out.append([w.lower() for w in words] if self.lowercase else words)
        return out

    def tokenize_cached(self, texts: list[str]) -> list[list[str]]:
        if self._cached > self.cache_tokens:
            self._cache, self._cached = {}, 0
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        known = {t: self._cache[t] for t in texts if t in self._cache}
        for text, tokens in zip(new, self.tokenize(new)):
            known[text] = self._cache[text] = tokens
            self._cached += len(tokens)
        return [known[t] for t in texts]

    def __call__(self, batch: pa.Table) -> pa.Table:
        questions = self.tokenize_cached(batch.column("question").to_pylist())
        answers = self.tokenize_cached(batch.column("answer").to_pylist())
        batch = batch.append_column("question_tokens", pa.array(questions, pa.list_(pa.string())))
        return batch.append_column("answer_tokens", pa.array(answers, pa.list_(pa.string())))


def count_tokens(batch: pa.Table) -> pa.Table:
    """Token counts of one batch, questions counted once per distinct question."""
    counts: Counter = Counter()
    seen = set()
    for qid, q_tokens, a_tokens in zip(batch.column("qid").to_pylist(), batch.column("question_tokens").to_pylist(),
                                       batch.column("answer_tokens").to_pylist()):
        if qid not in seen:
            seen.add(qid)
            counts.update(q_tokens)
        counts.update(a_tokens)
    return counts_table(counts)


def counts_table(counts: dict[str, int]) -> pa.Table:
    """A batch's token counts in the shape `build_vocabulary` sums by token."""
    return pa.table({"token": pa.array(list(counts), pa.string()), "count": pa.array(list(counts.values()), pa.int64())})


@dataclass
class Vocabulary:
    """Word ids, and the character ids (`chars`, the same reserved ids first) of the same training counts."""

    tokens: list[str]
    chars: list[str] = field(default_factory=lambda: list(RESERVED))

    def __post_init__(self):
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.char_index = {c: i for i, c in enumerate(self.chars)}

    def char_ids(self, tokens: list[str], max_word_chars: int) -> list[list[int]]:
        unk = self.char_index[UNK]
        return [[self.char_index.get(c, unk) for c in t[:max_word_chars]] for t in tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, tokens: list[str]) -> list[int]:
        unk = self.index[UNK]
        return [self.index.get(t, unk) for t in tokens]

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            json.dump({"tokens": self.tokens, "chars": self.chars, "reserved": list(RESERVED)}, f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> "Vocabulary":
        with open(path) as f:
            saved = json.load(f)
        return cls(saved["tokens"], saved.get("chars", list(RESERVED)))

    @classmethod
    def from_counts(cls, counts: dict[str, int], min_count: int = 1, max_size: int | None = None) -> "Vocabulary":
        """Most frequent first, ties by token: the same ids from the same counts on any machine."""
        ranked = sorted(((t, n) for t, n in counts.items() if n >= min_count and t not in RESERVED),
                        key=lambda tn: (-tn[1], tn[0]))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(RESERVED))]
        return cls(list(RESERVED) + [t for t, _ in ranked])


class ToIds:
    """Maps token columns to `question_ids`/`answer_ids` (list<int32>) and conforms to TOKENISED_PAIRS."""

    def __init__(self, vocab_tokens: list[str]):
        self.vocab = Vocabulary(vocab_tokens)

    def __call__(self, batch: pa.Table) -> pa.Table:
        q = [self.vocab.ids(t) for t in batch.column("question_tokens").to_pylist()]
        a = [self.vocab.ids(t) for t in batch.column("answer_tokens").to_pylist()]
        table = pa.table({
            "qid": batch.column("qid"), "aid": batch.column("aid"), "label": batch.column("label"),
            "question": batch.column("question"), "answer": batch.column("answer"),
            "question_ids": pa.array(q, pa.list_(pa.int32())), "answer_ids": pa.array(a, pa.list_(pa.int32())),
        })
        return conform(table, TOKENISED_PAIRS, "tokenised pairs")


@dataclass
class TokenizeConfig:
    dataset: str
    input: str
    output: str
    min_count: int = 1
    max_vocab: int | None = 100_000
    lowercase: bool = True
    shard_mb: int = 128  # target size of a shard (in memory; zstd Parquet on disk is smaller)
    rows_per_shard: int | None = None  # overrides shard_mb
    min_char_count: int = 1
    max_chars: int = 1_000
    max_word_chars: int = 16  # characters kept per token for character ids (reading comprehension)
    max_context_tokens: int = 5_000  # reading comprehension: longer contexts are dropped and counted (DynSAN)
    quasart_contexts: str = "short"  # quasart: "short" or "long" passages
    clean: bool = True  # published sets: the papers' filtered splits (see pipelines/readers)
    on_error: str = "raise"  # published sets: "skip" counts bad records instead of stopping
    semeval_task: str = "A"  # semeval-ql: "A" (comments against their thread's question) or "C"
    vocab: str | None = None  # reuse this vocab.json (or a tokenised folder's) instead of counting train: fine-tuning


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def input_splits(cfg: TokenizeConfig) -> tuple[dict, dict]:
    """The pairs of every split as Ray datasets, and what the reader found (sizes against the published ones,
    records skipped, questions filtered); for StackExchangeQA, our own `{train,dev,test}/*.parquet`."""
    import ray.data

    if cfg.dataset == "stackexchangeqa":
        from pipelines.readers import ReaderError, stackexchangeqa_found

        splits = [s for s in ("train", "dev", "test") if os.path.isdir(os.path.join(cfg.input, s))]
        if "train" not in splits:
            raise FileNotFoundError(f"{cfg.input}: no train/ split (expected {{train,dev,test}}/*.parquet)")
        # what was read is what the build wrote (checked here), so the job's table of written splits says it all
        found = stackexchangeqa_found(cfg.input)
        if found["differences_from_build"]:
            raise ReaderError("; ".join(found["differences_from_build"]) + " (re-run the build, or pass a complete "
                              "output folder)")
        datasets = {}
        for split in splits:
            files = parquet_files(os.path.join(cfg.input, split))
            check_parquet_files(files, QA_PAIRS)
            datasets[split] = ray.data.read_parquet(files, schema=QA_PAIRS)
        return datasets, found
    from pipelines.readers import READERS

    if cfg.dataset not in READERS:
        raise ValueError(f"unknown dataset {cfg.dataset!r}: one of stackexchangeqa, {', '.join(READERS)}")
    options = {"task": cfg.semeval_task} if cfg.dataset == "semeval-ql" else {}
    corpus = READERS[cfg.dataset](cfg.input, clean=cfg.clean, on_error=cfg.on_error, **options)
    print(corpus.summary(), file=sys.stderr, flush=True)
    if "train" not in corpus.splits:
        raise FileNotFoundError(f"{cfg.input}: {cfg.dataset} has no train split (found {', '.join(corpus.splits)})")
    datasets = {}
    for split, table in corpus.splits.items():
        pieces = max(1, -(-table.num_rows // 4096))  # blocks of ~4k pairs, so the stage runs in parallel
        step = -(-table.num_rows // pieces)
        datasets[split] = ray.data.from_arrow([table.slice(i, step) for i in range(0, table.num_rows, step)]
                                              or [table])
    found = {"sizes": {s: {"questions": q, "pairs": n} for s, (q, n) in corpus.sizes().items()},
             "differences_from_published": corpus.check_sizes(), "clean": corpus.clean,
             "questions_filtered": corpus.dropped_by_filter, "skipped": corpus.skipped}
    return datasets, found


def tokenised_splits(cfg: TokenizeConfig, datasets: dict | None = None) -> dict:
    """Lazy tokenised datasets per split."""
    import ray.data

    if datasets is None:
        datasets, _ = input_splits(cfg)
    tokenised = {}
    for split, ds in datasets.items():
        tokenised[split] = ds.map_batches(SpacyTokenizer, batch_format="pyarrow", batch_size=1024,
                                          fn_constructor_kwargs={"lowercase": cfg.lowercase},
                                          compute=ray.data.ActorPoolStrategy(min_size=1, max_size=2))
    return tokenised


def _partitions() -> int:
    """Shuffle partitions: a few per CPU (Ray's default of 200 costs more than it saves on small corpora)."""
    import ray

    return max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))


def char_counts(word_counts: dict[str, int]) -> dict[str, int]:
    """Character counts implied by token counts (each character of a token, times the token's count)."""
    chars: Counter = Counter()
    for token, n in word_counts.items():
        for ch in token:
            chars[ch] += n
    return dict(chars)


def given_vocabulary(cfg: TokenizeConfig) -> Vocabulary:
    """The vocabulary of `cfg.vocab` (a vocab.json, or a tokenised folder holding one), checked to have been
    written with the same case folding (its manifest says) so that ids mean the same words."""
    path = os.path.join(cfg.vocab, "vocab.json") if os.path.isdir(cfg.vocab) else cfg.vocab
    if not os.path.exists(path):
        raise FileNotFoundError(f"--vocab {cfg.vocab}: no vocab.json there (a folder written by tokenize_corpora.py, "
                                "or its vocab.json)")
    manifest = os.path.join(os.path.dirname(os.path.abspath(path)), "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            lowercase = json.load(f).get("lowercase", cfg.lowercase)
        if lowercase != cfg.lowercase:
            raise ValueError(f"--vocab {path}: written {'lower-cased' if lowercase else 'cased'}, this run is "
                             f"{'lower-cased' if cfg.lowercase else 'cased (--cased)'}: ids would not match words")
    return Vocabulary.load(path)


def vocabulary_for(train, cfg: TokenizeConfig, counter=None) -> Vocabulary:
    return given_vocabulary(cfg) if cfg.vocab else build_vocabulary(train, cfg, counter)


def build_vocabulary(train, cfg: TokenizeConfig, counter=None) -> Vocabulary:
    """A distributed count: per-batch counters, summed by token in a shuffle; only the result reaches the driver.
    The character vocabulary comes from the same counts (`Vocabulary.chars`)."""
    counts = (train.map_batches(counter or count_tokens, batch_format="pyarrow")
              .groupby("token", num_partitions=_partitions()).sum("count").take_all())
    words = {r["token"]: r["sum(count)"] for r in counts}
    chars = Vocabulary.from_counts(char_counts(words), cfg.min_char_count, cfg.max_chars).tokens
    return Vocabulary(Vocabulary.from_counts(words, cfg.min_count, cfg.max_vocab).tokens, chars)


def rows_per_shard(ds, cfg: TokenizeConfig) -> int:
    """Rows per Parquet file for a `cfg.shard_mb` target, from the materialised dataset's bytes per row."""
    if cfg.rows_per_shard:
        return cfg.rows_per_shard
    rows = ds.count()
    per_row = max(1, (ds.size_bytes() or 1) // max(1, rows))
    return max(1, (cfg.shard_mb << 20) // per_row)


def write_shards(ds, staging: str, split: str, cfg: TokenizeConfig, size_from=None) -> list[dict]:
    """Parquet shards under `staging/split/`, with their rows, bytes and sha256. Rows per shard come from the bytes
    per row of `size_from` (a materialised dataset of about the same rows; by default `ds` itself)."""
    import pyarrow.parquet as pq

    directory = os.path.join(staging, split)
    ds.write_parquet(directory, min_rows_per_file=rows_per_shard(size_from or ds, cfg), compression="zstd",
                     row_group_size=ROW_GROUP_ROWS)
    files = sorted(f for f in os.listdir(directory) if f.endswith(".parquet")) if os.path.isdir(directory) else []
    return [{"path": f"{split}/{f}", "rows": pq.ParquetFile(os.path.join(directory, f)).metadata.num_rows,
             "bytes": os.path.getsize(os.path.join(directory, f)), "sha256": _sha256(os.path.join(directory, f))}
            for f in files]


def pair_counts(paths: list[str]) -> tuple[int, int, int]:
    """Questions (distinct qids), rows and positive rows of written pair shards, from their qid and label columns
    read back: exactly what was written, without the two shuffles a Ray Data groupby and aggregate cost (about
    10 s each per split on two cores)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    qids, rows, positive = set(), 0, 0
    for path in paths:
        table = pq.read_table(path, columns=["qid", "label"])
        rows += table.num_rows
        positive += int(pc.sum(table["label"]).as_py() or 0)
        qids.update(pc.unique(table["qid"]).to_pylist())
    return len(qids), rows, positive


def _manifest(cfg: TokenizeConfig, schema: str, vocab: Vocabulary, found: dict, staging: str) -> dict:
    """The manifest, with the vocabulary's checksum: training refuses a checkpoint of another vocabulary."""
    return {"dataset": cfg.dataset, "schema": schema, "tokenizer": "spacy.blank('en')", "lowercase": cfg.lowercase,
            "vocab": "vocab.json", "vocab_size": len(vocab), "char_vocab_size": len(vocab.chars),
            "vocab_sha256": _sha256(os.path.join(staging, "vocab.json")), "vocab_from": cfg.vocab,
            "reserved": list(RESERVED), "config": asdict(cfg), "reader": found, "splits": {}}


def write(cfg: TokenizeConfig) -> dict:
    """Tokenise every split, write shards, `vocab.json` and `manifest.json`; the output folder appears whole."""
    from ray.data import ActorPoolStrategy

    from pipelines.passages import PASSAGE_READERS, write_passages

    if cfg.dataset in PASSAGE_READERS:
        return write_passages(cfg)
    with staged_dir(cfg.output) as staging:
        datasets, found = input_splits(cfg)
        tokenised = {split: ds.materialize() for split, ds in tokenised_splits(cfg, datasets).items()}
        vocab = vocabulary_for(tokenised["train"], cfg)
        vocab.save(os.path.join(staging, "vocab.json"))
        manifest = _manifest(cfg, "tokenised_pairs", vocab, found, staging)
        for split, ds in tokenised.items():
            ids = ds.map_batches(ToIds, batch_format="pyarrow", fn_constructor_kwargs={"vocab_tokens": vocab.tokens},
                                 compute=ActorPoolStrategy(min_size=1, max_size=2)).materialize()
            files = write_shards(ids, staging, split, cfg)
            questions, rows, positive = pair_counts([os.path.join(staging, f["path"]) for f in files])
            manifest["splits"][split] = {"questions": questions, "rows": rows, "positive": positive, "files": files}
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    return manifest


class ShardError(ValueError):
    """A tokenised output folder whose shards differ from its manifest."""


def read_shards(data: str, split: str, verify: str = "size"):
    """A split of a tokenise_corpora output as a lazy Ray Dataset that streams (nothing is read until iterated).

    The files are exactly the manifest's: a missing, extra or changed shard is an error naming it. `verify`
    "size" compares rows (Parquet footer) and bytes, "sha256" also the checksum (reads every byte once), "none"
    skips the checks."""
    import ray.data

    paths, schema = shard_paths(data, split, verify)
    return ray.data.read_parquet(paths, schema=schema)


def shard_paths(data: str, split: str, verify: str = "size") -> tuple[list[str], pa.Schema]:
    """The Parquet files of a split and their schema, checked against the manifest as `read_shards` says."""
    import pyarrow.parquet as pq

    from pipelines.schemas import SCHEMAS

    with open(os.path.join(data, "manifest.json")) as f:
        manifest = json.load(f)
    if split not in manifest["splits"]:
        raise ShardError(f"{data}/manifest.json has no split {split!r} (has {', '.join(manifest['splits'])})")
    schema = SCHEMAS[manifest["schema"]]
    listed = manifest["splits"][split]["files"]
    paths = [os.path.join(data, entry["path"]) for entry in listed]
    directory = os.path.join(data, split)
    on_disk = {os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".parquet")} \
        if os.path.isdir(directory) else set()
    if verify != "none":
        extra = sorted(on_disk - set(paths))
        if extra:
            raise ShardError(f"{extra[0]}: a shard the manifest does not list ({len(extra)} such files)")
        for entry, path in zip(listed, paths):
            if not os.path.exists(path):
                raise ShardError(f"{path}: listed in {data}/manifest.json but missing")
            if "bytes" in entry and os.path.getsize(path) != entry["bytes"]:
                raise ShardError(f"{path}: {os.path.getsize(path):,} bytes, the manifest says {entry['bytes']:,}")
            if "rows" in entry and pq.ParquetFile(path).metadata.num_rows != entry["rows"]:
                raise ShardError(f"{path}: row count differs from the manifest")
            if verify == "sha256" and _sha256(path) != entry["sha256"]:
                raise ShardError(f"{path}: sha256 differs from the manifest (changed after it was written)")
    check_parquet_files(paths, schema)
    return paths, schema

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
from dataclasses import asdict, dataclass

import pyarrow as pa

from pipelines.atomic import staged_dir
from pipelines.schemas import QA_PAIRS, TOKENISED_PAIRS, check_parquet_files, conform, parquet_files

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
    return pa.table({"token": pa.array(list(counts), pa.string()), "count": pa.array(list(counts.values()), pa.int64())})


@dataclass
class Vocabulary:
    tokens: list[str]

    def __post_init__(self):
        self.index = {t: i for i, t in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, tokens: list[str]) -> list[int]:
        unk = self.index[UNK]
        return [self.index.get(t, unk) for t in tokens]

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            json.dump({"tokens": self.tokens, "reserved": list(RESERVED)}, f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> "Vocabulary":
        with open(path) as f:
            return cls(json.load(f)["tokens"])

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
    rows_per_shard: int = 100_000
    clean: bool = True  # published sets: the papers' filtered splits (see pipelines/readers)
    on_error: str = "raise"  # published sets: "skip" counts bad records instead of stopping
    semeval_task: str = "A"  # semeval-ql: "A" (comments against their thread's question) or "C"


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
        found = stackexchangeqa_found(cfg.input)
        for split, size in found["sizes"].items():
            print(f"stackexchangeqa {split}: {size['questions'] if size['questions'] is not None else '?'} questions,"
                  f" {size['pairs']:,} pairs", file=sys.stderr, flush=True)
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


def build_vocabulary(train, cfg: TokenizeConfig) -> Vocabulary:
    """A distributed count: per-batch counters, summed by token in a shuffle; only the result reaches the driver."""
    counts = (train.map_batches(count_tokens, batch_format="pyarrow")
              .groupby("token", num_partitions=_partitions()).sum("count").take_all())
    return Vocabulary.from_counts({r["token"]: r["sum(count)"] for r in counts}, cfg.min_count, cfg.max_vocab)


def write(cfg: TokenizeConfig) -> dict:
    """Tokenise every split, write shards, `vocab.json` and `manifest.json`; the output folder appears whole."""
    from ray.data import ActorPoolStrategy
    from ray.data.aggregate import Count, Sum

    with staged_dir(cfg.output) as staging:
        datasets, found = input_splits(cfg)
        tokenised = {split: ds.materialize() for split, ds in tokenised_splits(cfg, datasets).items()}
        vocab = build_vocabulary(tokenised["train"], cfg)
        vocab.save(os.path.join(staging, "vocab.json"))
        manifest = {"dataset": cfg.dataset, "schema": "tokenised_pairs", "tokenizer": "spacy.blank('en')",
                    "lowercase": cfg.lowercase, "vocab": "vocab.json", "vocab_size": len(vocab),
                    "reserved": list(RESERVED), "config": asdict(cfg), "reader": found, "splits": {}}
        for split, ds in tokenised.items():
            ids = ds.map_batches(ToIds, batch_format="pyarrow", fn_constructor_kwargs={"vocab_tokens": vocab.tokens},
                                 compute=ActorPoolStrategy(min_size=1, max_size=2)).materialize()
            directory = os.path.join(staging, split)
            ids.write_parquet(directory, min_rows_per_file=cfg.rows_per_shard, compression="zstd")
            files = sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))
            stats = ids.aggregate(Count(), Sum("label", alias_name="positive"))
            questions = ids.groupby("qid", num_partitions=_partitions()).count().count()
            manifest["splits"][split] = {
                "questions": questions, "rows": stats["count()"], "positive": int(stats["positive"] or 0),
                "files": [{"path": f"{split}/{f}", "sha256": _sha256(os.path.join(directory, f))} for f in files],
            }
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    return manifest

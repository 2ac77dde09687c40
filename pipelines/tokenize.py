"""Tokenisation of QA pairs with spaCy, and a vocabulary counted over the training split, as Ray Data stages.

spaCy's blank English pipeline is only its rule-based tokenizer, so nothing is downloaded. Questions repeat
across their candidate answers, so each batch tokenises a distinct question once.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa

from pipelines.atomic import check_output, staged_dir
from pipelines.blocks import materialize, materialize_saying_progress
from pipelines.schemas import QA_PAIRS, TOKENISED_PAIRS, check_parquet_files, conform, parquet_files
from pipelines.shards import JOB, earlier_tokenisation, manifest_for, say_progress, write_shards
from pipelines.vocabulary import RESERVED, Vocabulary, counts_table, vocabulary_for
from runtime.checks import MissingInput, UsageError, integer_at_least, one_of


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
    for qid, q_tokens, a_tokens in zip(
        batch.column("qid").to_pylist(),
        batch.column("question_tokens").to_pylist(),
        batch.column("answer_tokens").to_pylist(),
    ):
        if qid not in seen:
            seen.add(qid)
            counts.update(q_tokens)
        counts.update(a_tokens)
    return counts_table(counts)


class ToIds:
    """Maps token columns to `question_ids`/`answer_ids` (list<int32>) and conforms to TOKENISED_PAIRS."""

    def __init__(self, vocab_tokens: list[str]):
        self.vocab = Vocabulary(vocab_tokens)

    def __call__(self, batch: pa.Table) -> pa.Table:
        q = [self.vocab.ids(t) for t in batch.column("question_tokens").to_pylist()]
        a = [self.vocab.ids(t) for t in batch.column("answer_tokens").to_pylist()]
        table = pa.table(
            {
                "qid": batch.column("qid"),
                "aid": batch.column("aid"),
                "label": batch.column("label"),
                "question": batch.column("question"),
                "answer": batch.column("answer"),
                "question_ids": pa.array(q, pa.list_(pa.int32())),
                "answer_ids": pa.array(a, pa.list_(pa.int32())),
            }
        )
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

    def __post_init__(self):
        """Every option range-checked here, before any work (the job's --dry-run runs the same checks)."""
        integer_at_least("--min-count", self.min_count, 1)
        # the reserved ids (<pad>, <unk>, <sep>, <cls>) and at least one token
        integer_at_least("--max-vocab", self.max_vocab, len(RESERVED) + 1, allow_none=True)
        integer_at_least("--shard-mb", self.shard_mb, 1)
        integer_at_least("rows_per_shard", self.rows_per_shard, 1, allow_none=True)
        integer_at_least("--min-char-count", self.min_char_count, 1)
        integer_at_least("--max-chars", self.max_chars, len(RESERVED) + 1)
        integer_at_least("--max-word-chars", self.max_word_chars, 1)
        integer_at_least("--max-context-tokens", self.max_context_tokens, 1)
        one_of("--quasart-contexts", self.quasart_contexts, ("short", "long"))
        one_of("on_error", self.on_error, ("raise", "skip"))
        one_of("--semeval-task", self.semeval_task, ("A", "C"))

    def input_paths(self) -> list[str]:
        """What tokenisation reads, which its output must never hold."""
        return [self.input, *([self.vocab] if self.vocab else [])]

    def check_inputs(self) -> None:
        """The inputs exist and the output destroys nothing: what a run would refuse first, before any work."""
        if not os.path.exists(self.input):
            raise MissingInput(f"--input {self.input}: no such file or folder")
        if self.vocab and not os.path.exists(self.vocab):
            raise MissingInput(f"--vocab {self.vocab}: no such file or folder")
        if self.vocab:  # read whole here (it is small), not first after Ray has started and the splits are read
            from pipelines.vocabulary import given_vocabulary

            try:
                given_vocabulary(self)
            except (OSError, ValueError) as error:
                raise UsageError(str(error) if str(error).startswith("--vocab") else f"--vocab {error}") from None
        from pipelines.readers import ReaderError, splits_at

        try:  # the reader's files, found by name: another set's folder is named here, not after Ray starts
            splits = splits_at(self.dataset, self.input, self.clean, self.quasart_contexts)
        except (FileNotFoundError, ReaderError) as error:
            raise MissingInput(f"--input {error}") from None
        if "train" not in splits:
            found = f"found {', '.join(splits)}" if splits else "found none"
            raise MissingInput(
                f"--input {self.input}: {self.dataset} has no train split ({found}); tokenising needs it"
            )
        check_output(self.output, JOB, self.input_paths(), earlier_tokenisation)


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
            raise ReaderError(
                "; ".join(found["differences_from_build"]) + " (re-run the build, or pass a complete output folder)"
            )
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
        datasets[split] = ray.data.from_arrow([table.slice(i, step) for i in range(0, table.num_rows, step)] or [table])
    found = {
        "sizes": {s: {"questions": q, "pairs": n} for s, (q, n) in corpus.sizes().items()},
        "differences_from_published": corpus.check_sizes(),
        "clean": corpus.clean,
        "questions_filtered": corpus.dropped_by_filter,
        "skipped": corpus.skipped,
    }
    return datasets, found


def tokenised_splits(cfg: TokenizeConfig, datasets: dict | None = None) -> dict:
    """Lazy tokenised datasets per split."""
    import ray.data

    if datasets is None:
        datasets, _ = input_splits(cfg)
    tokenised = {}
    for split, ds in datasets.items():
        tokenised[split] = ds.map_batches(
            SpacyTokenizer,
            batch_format="pyarrow",
            batch_size=1024,
            fn_constructor_kwargs={"lowercase": cfg.lowercase},
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=2),
        )
    return tokenised


def pair_counts(paths: list[str]) -> tuple[int, int, int]:
    """Questions (distinct qids), rows and positive rows of written pair shards, from their qid and label columns
    read back: exactly what was written, without the two shuffles a Ray Data groupby and aggregate cost."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    qids, rows, positive = set(), 0, 0
    for path in paths:
        table = pq.read_table(path, columns=["qid", "label"])
        rows += table.num_rows
        positive += int(pc.sum(table["label"]).as_py() or 0)
        qids.update(pc.unique(table["qid"]).to_pylist())
    return len(qids), rows, positive


@contextlib.contextmanager
def in_input_order():
    """Ray Data hands blocks on in the input's order while inside (by default, as they finish): the same corpus
    then tokenises to the same shards row for row, so a training run from them reads the same batches. Seen
    without it: one of two tokenisations of the demo's build wrote its train split in 1,024-row batches 0, 3, 2,
    4, 1, and the demo trained on each scored dev MAP 0.901 and 0.919."""
    from ray.data import DataContext

    options = DataContext.get_current().execution_options
    before = options.preserve_order
    options.preserve_order = True
    try:
        yield
    finally:
        options.preserve_order = before


def write(cfg: TokenizeConfig) -> dict:
    """Tokenise every split, write shards, `vocab.json` and `manifest.json`, rows in the input's order; the output
    folder appears whole."""
    with in_input_order():
        return _write(cfg)


def _write(cfg: TokenizeConfig) -> dict:
    from ray.data import ActorPoolStrategy

    from pipelines.passages import write_passages
    from pipelines.readers.passages import PASSAGE_READERS

    if cfg.dataset in PASSAGE_READERS:
        return write_passages(cfg)
    with staged_dir(cfg.output, JOB, cfg.input_paths(), earlier_tokenisation) as staging:
        datasets, found = input_splits(cfg)
        pairs = {split: sizes.get("pairs") for split, sizes in found.get("sizes", {}).items()}
        tokenised = {
            split: materialize_saying_progress(ds, say_progress, split, pairs.get(split))
            for split, ds in tokenised_splits(cfg, datasets).items()
        }
        vocab = vocabulary_for(tokenised["train"], cfg, count_tokens)
        vocab.save(os.path.join(staging, "vocab.json"))
        manifest = manifest_for(cfg, "tokenised_pairs", vocab, found, staging)
        for split, ds in tokenised.items():
            ids = materialize(
                ds.map_batches(
                    ToIds,
                    batch_format="pyarrow",
                    fn_constructor_kwargs={"vocab_tokens": vocab.tokens},
                    compute=ActorPoolStrategy(min_size=1, max_size=2),
                )
            )
            files = write_shards(ids, staging, split, cfg)
            questions, rows, positive = pair_counts([os.path.join(staging, f["path"]) for f in files])
            manifest["splits"][split] = {"questions": questions, "rows": rows, "positive": positive, "files": files}
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    return manifest

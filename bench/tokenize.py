"""Tokenisation throughput: the Ray Data stage (pipelines/tokenize.SpacyTokenizer) against raw spaCy, shard write
and read-back throughput, and peak memory, on a real corpus replicated to at least --tokens tokens.

    python bench/tokenize.py [--wikiqa PATH] [--tokens 10000000] [--cpus 1,2] [--json OUT]

The corpus is WikiQA (every pair of the three original TSVs), copied until it holds --tokens tokens; each copy
adds a marker word to every text so that no text repeats across copies (the stage caches texts it has already
tokenised, which would otherwise flatter it). Raw spaCy tokenises, on one core in this process, exactly the texts
the stage must tokenise: each distinct question once and every answer. The stage runs on a fresh local Ray with
N CPUs for each N in --cpus (one tokenizer actor per CPU); its rate per core is tokens / wall seconds / N,
wall time counted from submitting the dataset to having every block materialised, actor start-up included.
Start-up (a fresh actor pool importing spaCy, measured on one block per actor just before) is reported
beside the rate; it is a fixed cost of seconds, not a per-token one. The last line is one JSON object with
`stage_vs_raw_spacy` (stage tokens/s per core on one CPU, start-up included, over raw spaCy's) and
`stage_vs_raw_spacy_after_startup`, also written to --json.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # Run as a script, this file's folder comes first on sys.path, where this file would stand in for the
    # standard library's `tokenize` (which pandas, linecache and others import): put the repository there.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse
import multiprocessing
import shutil
import tempfile
import time

from bench.report import check_result_file, write_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_WIKIQA = os.path.join(REPO, "..", "shared", "data", "wikiqa")


def corpus(wikiqa: str, tokens: int):
    """(pairs table, the texts the stage tokenises, token count of those texts) for >= `tokens` tokens."""
    import pyarrow as pa

    from pipelines.readers import read_wikiqa
    from pipelines.tokenize import SpacyTokenizer

    read = read_wikiqa(wikiqa, clean=False)
    base = pa.concat_tables(read.splits.values())
    counter = SpacyTokenizer(cache_tokens=0)
    questions = list(dict.fromkeys(base.column("question").to_pylist()))
    answers = base.column("answer").to_pylist()
    per_copy = sum(len(t) for t in counter.tokenize(questions + answers)) + len(questions) + len(answers)
    copies = max(1, -(-tokens // per_copy))
    tables, texts = [], []
    for k in range(copies):
        mark = f" copy{k}"
        tables.append(
            pa.table(
                {
                    "qid": [f"{q}-{k}" for q in base.column("qid").to_pylist()],
                    "question": [q + mark for q in base.column("question").to_pylist()],
                    "aid": [f"{a}-{k}" for a in base.column("aid").to_pylist()],
                    "answer": [a + mark for a in answers],
                    "label": base.column("label"),
                }
            )
        )
        texts += [q + mark for q in questions] + [a + mark for a in answers]
    return pa.concat_tables(tables), texts, per_copy * copies


def raw_spacy(texts: list[str]) -> dict:
    from pipelines.tokenize import SpacyTokenizer

    tokenizer = SpacyTokenizer(cache_tokens=0)
    started = time.perf_counter()
    produced = sum(len(t) for t in tokenizer.tokenize(texts))
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "tokens": produced, "tokens_per_s": round(produced / seconds)}


def read_shards_of(out_dir: str, files: list[dict]):
    """The written shards as a streaming dataset (the bench writes no manifest; read_shards needs one)."""
    import ray.data

    from pipelines.schemas import TOKENISED_PAIRS

    return ray.data.read_parquet([os.path.join(out_dir, f["path"]) for f in files], schema=TOKENISED_PAIRS)


def _stage_child(table_path: str, cpus: int, out_dir: str, queue) -> None:
    import logging

    import pyarrow.parquet as pq
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    from bench.stackexchangeqa import PeakMemory
    from pipelines.shards import write_shards
    from pipelines.tokenize import SpacyTokenizer, ToIds, TokenizeConfig, count_tokens
    from pipelines.vocabulary import build_vocabulary
    from runtime.ray_env import init_local_ray

    table = pq.read_table(table_path)
    with PeakMemory() as memory:
        init_local_ray(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        DataContext.get_current().enable_progress_bars = False
        step = 4096
        blocks = [table.slice(i, step) for i in range(0, table.num_rows, step)]

        def run(blocks):
            started = time.perf_counter()
            done = (
                ray.data.from_arrow(blocks)
                .map_batches(
                    SpacyTokenizer,
                    batch_format="pyarrow",
                    batch_size=1024,
                    compute=ActorPoolStrategy(min_size=cpus, max_size=cpus),
                )
                .materialize()
            )
            return done, time.perf_counter() - started

        # Start-up: a fresh pool (new actor processes importing spaCy) on one block per actor.
        _, startup_seconds = run(blocks[:cpus])
        tokenised, stage_seconds = run(blocks)
        cfg = TokenizeConfig(dataset="bench", input="", output=out_dir)
        vocab = build_vocabulary(tokenised, cfg, count_tokens)
        ids = tokenised.map_batches(
            ToIds,
            batch_format="pyarrow",
            fn_constructor_kwargs={"vocab_tokens": vocab.tokens},
            compute=ActorPoolStrategy(min_size=1, max_size=cpus),
        ).materialize()
        started = time.perf_counter()
        files = write_shards(ids, out_dir, "train", cfg)
        write_seconds = time.perf_counter() - started
        written = sum(f["bytes"] for f in files)
        started = time.perf_counter()
        rows = 0
        for batch in read_shards_of(out_dir, files).iter_batches(batch_size=4096, batch_format="pyarrow"):
            rows += batch.num_rows
        read_seconds = time.perf_counter() - started
        ray.shutdown()
    queue.put(
        {
            "cpus": cpus,
            "stage_seconds": round(stage_seconds, 2),
            "startup_seconds": round(startup_seconds, 2),
            "rows": table.num_rows,
            "shards": len(files),
            "shard_mb": round(written / 2**20, 1),
            "write_mb_per_s": round(written / 2**20 / write_seconds, 1),
            "write_rows_per_s": round(table.num_rows / write_seconds),
            "read_rows_per_s": round(rows / read_seconds),
            "read_mb_per_s": round(written / 2**20 / read_seconds, 1),
            "peak_mb": round(memory.peak / 2**20),
            "peak_heap_mb": round(memory.peak_heap / 2**20),
            "peak_store_mb": round(memory.peak_store / 2**20),
        }
    )


def stage(table_path: str, cpus: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    out_dir = tempfile.mkdtemp(prefix="bench-tokenize-")
    try:
        child = ctx.Process(target=_stage_child, args=(table_path, cpus, out_dir, queue))
        child.start()
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"the stage run on {cpus} CPUs failed with exit code {child.exitcode}")
        return queue.get()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wikiqa", default=DEFAULT_WIKIQA, help="the WikiQA TSV folder (the corpus to replicate)")
    p.add_argument("--tokens", type=int, default=10_000_000, help="tokens in the replicated corpus, at least")
    p.add_argument("--cpus", default="1,2", help="CPU counts for the stage runs, comma-separated")
    p.add_argument("--json", default=os.path.join(REPO, "bench", "tokenize.json"), help="where to write the figures")
    args = p.parse_args(argv)
    check_result_file(p, args.json, "stage_vs_raw_spacy")
    if not os.path.isdir(args.wikiqa):
        print(f"{args.wikiqa}: WikiQA not found (clone next to shared/ or pass --wikiqa)", file=sys.stderr)
        return 2
    import pyarrow.parquet as pq

    table, texts, tokens = corpus(args.wikiqa, args.tokens)
    print(f"corpus: {table.num_rows:,} pairs, {len(texts):,} texts to tokenise, {tokens:,} tokens", flush=True)
    raw = raw_spacy(texts)
    print(f"raw spaCy, one core: {raw['tokens_per_s']:,} tokens/s ({raw['seconds']} s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        table_path = os.path.join(tmp, "pairs.parquet")
        pq.write_table(table, table_path)
        runs = []
        for cpus in [int(c) for c in args.cpus.split(",")]:
            run = stage(table_path, cpus)
            run["tokens_per_s"] = round(raw["tokens"] / run["stage_seconds"])
            run["tokens_per_s_per_core"] = round(run["tokens_per_s"] / cpus)
            run["vs_raw_spacy_per_core"] = round(run["tokens_per_s_per_core"] / raw["tokens_per_s"], 2)
            steady = raw["tokens"] / max(1e-9, run["stage_seconds"] - run["startup_seconds"]) / cpus
            run["vs_raw_spacy_per_core_after_startup"] = round(steady / raw["tokens_per_s"], 2)
            runs.append(run)
            print(
                f"stage on {cpus} CPU(s): {run['tokens_per_s']:,} tokens/s, {run['tokens_per_s_per_core']:,} per "
                f"core ({run['vs_raw_spacy_per_core']}x raw spaCy per core; "
                f"{run['vs_raw_spacy_per_core_after_startup']}x without the {run['startup_seconds']} s start-up of "
                f"a fresh actor pool), {run['stage_seconds']} s; shards "
                f"{run['shard_mb']} MB written at {run['write_mb_per_s']} MB/s, read back at "
                f"{run['read_rows_per_s']:,} rows/s; peak {run['peak_mb']:,} MB (heaps {run['peak_heap_mb']:,}, "
                f"object store {run['peak_store_mb']:,})",
                flush=True,
            )
    one = next((r for r in runs if r["cpus"] == 1), runs[0])
    result = {
        "corpus": "WikiQA (all original pairs) replicated",
        "pairs": table.num_rows,
        "tokens": raw["tokens"],
        "raw_spacy_tokens_per_s": raw["tokens_per_s"],
        "stage": runs,
        "stage_vs_raw_spacy": one["vs_raw_spacy_per_core"],
        "stage_vs_raw_spacy_after_startup": one["vs_raw_spacy_per_core_after_startup"],
    }
    if len(runs) > 1:
        result["scaling"] = {f"{r['cpus']}_cpus_vs_1": round(r["tokens_per_s"] / one["tokens_per_s"], 2) for r in runs}
    write_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

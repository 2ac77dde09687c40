"""The pyarrow schemas of every dataset the project writes, checked on write and on read.

A schema names the columns a consumer may rely on. Writers conform their tables to it (extra columns are
an error, not silently dropped); readers check every file before use, so a shard written by an older or
foreign tool fails with the file named instead of deep inside a training step.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

# Rows per Parquet row group of tokenised shards: where a resumed training worker can start reading
# (training/rows.py), so what a resume reads again; large enough for zstd to compress well.
ROW_GROUP_ROWS = 8192

# One (question, candidate answer) pair; the output of jobs/build_stackexchangeqa.py.
QA_PAIRS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),  # "<site>:<post id>", unique across sites
        pa.field("question", pa.string(), nullable=False),  # title and body as clean text
        pa.field("aid", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),  # 1 positive, 0 sampled negative
        pa.field("score", pa.int32(), nullable=False),  # the answer's vote score
        pa.field("accepted", pa.bool_(), nullable=False),
        pa.field("site", pa.string(), nullable=False),
    ]
)

# A QA pair after tokenisation; texts are kept for models that bring their own tokenizer.
TOKENISED_PAIRS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("aid", pa.string(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("question_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("answer_ids", pa.list_(pa.int32()), nullable=False),
    ]
)

# A reading-comprehension question over ranked passages, concatenated in rank order (pipelines/passages.py).
# Token positions index the context; spans are inclusive; every occurrence of the answer is listed.
TOKENISED_PASSAGES = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("question_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("question_char_ids", pa.list_(pa.list_(pa.int32())), nullable=False),
        pa.field("context_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("context_char_ids", pa.list_(pa.list_(pa.int32())), nullable=False),
        pa.field("context_tokens", pa.list_(pa.string()), nullable=False),  # to read predicted spans back as text
        pa.field("passage_starts", pa.list_(pa.int32()), nullable=False),  # token offset of each passage
        pa.field("passage_ranks", pa.list_(pa.int32()), nullable=False),  # search rank of each passage
        pa.field("answers", pa.list_(pa.string()), nullable=False),
        pa.field("answer_starts", pa.list_(pa.int32()), nullable=False),  # empty: the answer occurs nowhere
        pa.field("answer_ends", pa.list_(pa.int32()), nullable=False),
        pa.field("candidates", pa.list_(pa.string()), nullable=False),  # multiple choice; empty otherwise
        pa.field("answer_index", pa.int32(), nullable=False),  # index of the answer in candidates, or -1
        pa.field("mention_starts", pa.list_(pa.int32()), nullable=False),  # candidate mentions (WikiHop)
        pa.field("mention_ends", pa.list_(pa.int32()), nullable=False),
        pa.field("mention_candidates", pa.list_(pa.int32()), nullable=False),  # index into candidates
    ]
)

SCHEMAS = {"qa_pairs": QA_PAIRS, "tokenised_pairs": TOKENISED_PAIRS, "tokenised_passages": TOKENISED_PASSAGES}


class SchemaMismatch(ValueError):
    """A table or file does not have the columns and types of the schema it claims."""


def _differences(actual: pa.Schema, expected: pa.Schema) -> list[str]:
    problems = []
    names = set(actual.names)
    for field in expected:
        if field.name not in names:
            problems.append(f"missing column {field.name!r} ({field.type})")
            continue
        got = actual.field(field.name).type
        if not got.equals(field.type):
            problems.append(f"column {field.name!r} is {got}, expected {field.type}")
    extra = [n for n in actual.names if n not in expected.names]
    if extra:
        problems.append(f"unexpected columns {extra}")
    return problems


def check_schema(actual: pa.Schema, expected: pa.Schema, where: str) -> None:
    """Raise SchemaMismatch naming `where` (a file, a dataset) if `actual` differs from `expected`."""
    problems = _differences(actual, expected)
    if problems:
        raise SchemaMismatch(f"{where}: schema mismatch: " + "; ".join(problems))


def conform(table: pa.Table, expected: pa.Schema, where: str) -> pa.Table:
    """Return `table` with exactly `expected`'s columns in order and types, or raise naming `where`.

    Only lossless casts are made (for example int64 labels to int8 when every value fits); a missing or extra
    column, a null in a non-nullable column, or a value that does not fit is an error.
    """
    missing = [f.name for f in expected if f.name not in table.column_names]
    extra = [n for n in table.column_names if n not in expected.names]
    if missing or extra:
        raise SchemaMismatch(f"{where}: schema mismatch: missing {missing}, unexpected {extra}")
    columns = []
    for field in expected:
        column = table.column(field.name)
        if not field.nullable and column.null_count:
            raise SchemaMismatch(f"{where}: column {field.name!r} has {column.null_count} null values")
        if not column.type.equals(field.type):
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise SchemaMismatch(f"{where}: column {field.name!r} cannot be stored as {field.type}: {err}") from err
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=expected)


def parquet_files(directory: str) -> list[str]:
    """The Parquet files directly under `directory`, sorted; an error naming it if there are none."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such directory")
    files = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".parquet"))
    if not files:
        raise FileNotFoundError(f"{directory}: no .parquet files")
    return files


def check_parquet_files(files: Iterable[str], expected: pa.Schema) -> None:
    """Check the schema of every Parquet file (footer only, no data read)."""
    for path in files:
        try:
            actual = pq.read_schema(path)
        except (OSError, pa.ArrowInvalid) as err:
            raise SchemaMismatch(f"{path}: not a readable Parquet file: {err}") from err
        check_schema(actual.remove_metadata(), expected, path)


def read_table(directory: str, expected: pa.Schema) -> pa.Table:
    """Read every shard under `directory` after checking each against `expected`."""
    files = parquet_files(directory)
    check_parquet_files(files, expected)
    return pa.concat_tables(pq.read_table(f, schema=expected) for f in files)

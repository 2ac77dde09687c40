"""Statistics of the training data that a model reads besides its inputs: the IDF of each word id and the
stop-word flags, for CTRN's word-overlap features on TrecQA (Severyn and Moschitti 2015's, which the CTRN paper
concatenates before its dense layers)."""

from __future__ import annotations

import json
import os

import numpy as np


def word_statistics(train_paths: list[str], vocab_path: str) -> tuple[np.ndarray, np.ndarray]:
    """(idf, stopword), each (V,) over the vocabulary of `vocab_path` (a tokenised folder's vocab.json). A document is
    each distinct question and each distinct answer of the train shards `train_paths` (a question repeats over its
    candidates and counts once); idf = log(documents / documents holding the word), a word in none taking the
    rarest value. Stop words are spaCy's English list."""
    import pyarrow.parquet as pq
    from spacy.lang.en.stop_words import STOP_WORDS

    if not os.path.exists(vocab_path):
        raise FileNotFoundError(f"{vocab_path}: not found; the overlap features need the tokenised folder's vocabulary")
    with open(vocab_path) as f:
        tokens = json.load(f)["tokens"]
    counts = np.zeros(len(tokens), dtype=np.float64)
    seen: set[bytes] = set()
    for path in train_paths:
        table = pq.read_table(path, columns=["question_ids", "answer_ids"])
        for column in ("question_ids", "answer_ids"):
            for ids in table.column(column).to_numpy(zero_copy_only=False):
                ids = np.asarray(ids, dtype=np.int64)
                key = ids.tobytes()
                if key in seen:
                    continue
                seen.add(key)
                words = np.unique(ids)
                counts[words[words < len(tokens)]] += 1
    documents = max(1, len(seen))
    idf = np.log(documents / np.maximum(counts, 1.0)).astype(np.float32)
    stopword = np.array([token.lower() in STOP_WORDS for token in tokens], dtype=bool)
    return idf, stopword

"""Tokenisation stages: the tokenizer's cache, vocabularies, span mapping, and the shards they are written to."""

import os

import pyarrow as pa

from pipelines.tokenize import SpacyTokenizer


def test_cached_tokenizer_gives_what_spacy_gives_across_cache_resets():
    texts = [
        "How do I brew a stout?",
        "Roast the barley.",
        "How do I brew a stout?",
        "Don't boil hops too long!",
        "Roast the barley.",
        "U.S. pale ale, 5.5% ABV",
    ] * 3
    plain = SpacyTokenizer(cache_tokens=0)
    reference = plain.tokenize(texts)
    small = SpacyTokenizer(cache_tokens=8)  # resets every call or two
    assert [small.tokenize_cached(texts[i : i + 4]) for i in range(0, len(texts), 4)] == [
        reference[i : i + 4] for i in range(0, len(texts), 4)
    ]
    batch = pa.table({"question": texts[:4], "answer": texts[2:6]})
    out = SpacyTokenizer()(batch)
    assert out.column("question_tokens").to_pylist() == reference[:4]
    assert out.column("answer_tokens").to_pylist() == reference[2:6]
    assert reference[3] == ["do", "n't", "boil", "hops", "too", "long", "!"]


def test_vocabulary_ids_are_stable_with_caps_and_reserved_ids(tmp_path):
    from pipelines.vocabulary import RESERVED, Vocabulary, char_counts

    counts = {"b": 3, "a": 3, "c": 5, "rare": 1, "<unk>": 9}
    vocab = Vocabulary.from_counts(counts, min_count=2)
    assert vocab.tokens == list(RESERVED) + ["c", "a", "b"]  # by count, ties by token; reserved never twice
    assert Vocabulary.from_counts(dict(reversed(list(counts.items()))), min_count=2).tokens == vocab.tokens
    assert Vocabulary.from_counts(counts, max_size=5).tokens == list(RESERVED) + ["c"]
    assert vocab.ids(["a", "zzz"]) == [5, 1]
    chars = Vocabulary.from_counts(char_counts({"ab": 2, "b": 1})).tokens
    assert chars == list(RESERVED) + ["b", "a"]  # b: 2 + 1, a: 2
    full = Vocabulary(vocab.tokens, chars)
    assert full.char_ids(["abc", "b"], max_word_chars=2) == [[5, 4], [4]]
    full.save(str(tmp_path / "vocab.json"))
    again = Vocabulary.load(str(tmp_path / "vocab.json"))
    assert again.tokens == full.tokens and again.chars == full.chars


def test_a_parquet_file_is_written_whole_in_full_row_groups_whatever_the_pieces(tmp_path):
    import pyarrow.parquet as pq

    from pipelines.shards import write_parquet_atomically

    schema = pa.schema([("x", pa.int64())])
    values = list(range(23))
    pieces = [
        pa.table({"x": values[:3]}, schema=schema),
        schema.empty_table(),
        pa.table({"x": values[3:8]}),
        pa.table({"x": values[8:]}, schema=schema),
    ]  # the second-last without the schema: int64 all the same
    path = str(tmp_path / "part-00000.parquet")
    assert write_parquet_atomically(path, schema, pieces, row_group_rows=7) == 23
    written = pq.ParquetFile(path)
    assert [written.metadata.row_group(i).num_rows for i in range(written.num_row_groups)] == [7, 7, 7, 2]
    assert written.read()["x"].to_pylist() == values and sorted(p.name for p in tmp_path.iterdir()) == [
        "part-00000.parquet"
    ]


def test_shards_hold_the_datasets_rows_in_its_order(ray_local, tmp_path):
    """Ray Data's writer gave a task's blocks to Arrow's threaded dataset writer, which wrote them out of order in
    about one run in twenty; the shards must be the dataset's rows in its order, shard names in that order too."""
    import pyarrow.parquet as pq
    import ray.data

    from pipelines.shards import write_shards
    from pipelines.tokenize import TokenizeConfig

    sizes = [37, 0, 120, 5, 64] * 12
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    blocks = [
        pa.table({"row": pa.array(range(s, s + n), pa.int64()), "text": ["x" * 40] * n}) for s, n in zip(starts, sizes)
    ]
    cfg = TokenizeConfig(dataset="wikiqa", input="", output=str(tmp_path), rows_per_shard=500)
    files = write_shards(ray.data.from_arrow(blocks), str(tmp_path), "train", cfg)
    assert [f["path"] for f in files] == [f"train/part-{i:05d}.parquet" for i in range(len(files))]
    read = [pq.read_table(tmp_path / f["path"]) for f in files]
    assert [t.num_rows for t in read] == [f["rows"] for f in files]
    assert all(n >= 500 for n in (f["rows"] for f in files[:-1])) and len(files) == 5  # of 2,712 rows
    assert [r for t in read for r in t["row"].to_pylist()] == list(range(sum(sizes)))
    assert sorted(os.listdir(tmp_path / "train")) == [os.path.basename(f["path"]) for f in files]
    empty = write_shards(ray.data.from_arrow([blocks[1]]), str(tmp_path), "dev", cfg)
    assert empty == [] and not (tmp_path / "dev").exists()


def test_shards_gather_consecutive_blocks_until_they_hold_enough_rows():
    from pipelines.shards import consecutive_groups

    assert consecutive_groups([3, 0, 5, 2, 0, 4, 1], 5) == [[0, 2], [3, 5], [6]]
    assert consecutive_groups([4, 0, 0], 5) == [[0]]  # the last shard takes what remains, empty blocks left out
    assert consecutive_groups([0, 0], 5) == [] and consecutive_groups([], 5) == []


def test_a_manifest_is_named_path_free_by_everything_but_the_folders_it_names():
    """`path_free_sha256` leaves out exactly the paths a manifest keeps (where its input, output, a borrowed
    vocabulary and a build's statistics lay); any other field (a shard's sha256, a count, a setting) changes it."""
    import copy

    from pipelines.shards import MANIFEST_PATHS, path_free_sha256

    manifest = {
        "dataset": "stackexchangeqa",
        "vocab_sha256": "ab" * 32,
        "vocab_from": "/data/other/vocab.json",
        "config": {"input": "/a/shared/data/x", "output": "out/x", "vocab": "/data/other/vocab.json", "min_count": 1},
        "reader": {"stats": "out/x-build/stats.json", "sizes": {"train": {"questions": 3}}},
        "splits": {"train": {"rows": 9, "files": [{"path": "train/part-00000.parquet", "sha256": "cd" * 32}]}},
    }
    before = copy.deepcopy(manifest)
    reference = path_free_sha256(manifest)
    assert manifest == before  # the caller's manifest is left as it was
    for *parents, field in MANIFEST_PATHS:
        moved = copy.deepcopy(manifest)
        holder = moved
        for parent in parents:
            holder = holder[parent]
        holder[field] = "/elsewhere/" + field
        assert path_free_sha256(moved) == reference, field
    assert path_free_sha256({k: manifest[k] for k in reversed(list(manifest))}) == reference  # key order
    for change in (
        lambda m: m["splits"]["train"]["files"][0].update(sha256="ce" * 32),
        lambda m: m["splits"]["train"].update(rows=10),
        lambda m: m["config"].update(min_count=2),
        lambda m: m.update(vocab_sha256="ac" * 32),
        lambda m: m["reader"]["sizes"]["train"].update(questions=4),
    ):
        changed = copy.deepcopy(manifest)
        change(changed)
        assert path_free_sha256(changed) != reference


def test_wikiqa_tokenised_from_shared_data_at_another_path_is_the_same_data(shared_data, ray_local, tmp_path):
    """The same WikiQA files at another absolute path (a reviewer's clone beside its own ../shared/data), tokenised
    into another folder: the manifests differ in bytes only by the paths they keep, so their path-free sha256 is the
    same, and every shard and the vocabulary are the same bytes."""
    import shutil

    import pytest

    from pipelines.shards import manifest_path_free_sha256, sha256_file
    from pipelines.tokenize import TokenizeConfig, write

    wikiqa = os.path.join(shared_data, "wikiqa")
    if not os.path.isdir(wikiqa):
        pytest.skip(f"{wikiqa} not found")
    elsewhere = str(tmp_path / "reviewer" / "shared" / "data" / "wikiqa")
    shutil.copytree(wikiqa, elsewhere)  # a copy, not a link: the path the reader resolves is another
    here, there = str(tmp_path / "here" / "wikiqa"), str(tmp_path / "there" / "wikiqa")
    built = write(TokenizeConfig(dataset="wikiqa", input=wikiqa, output=here))
    rebuilt = write(TokenizeConfig(dataset="wikiqa", input=elsewhere, output=there))
    assert built["config"]["input"] != rebuilt["config"]["input"]
    a, b = os.path.join(here, "manifest.json"), os.path.join(there, "manifest.json")
    assert sha256_file(a) != sha256_file(b)
    assert manifest_path_free_sha256(a) == manifest_path_free_sha256(b)
    assert built["splits"] == rebuilt["splits"] and built["vocab_sha256"] == rebuilt["vocab_sha256"]

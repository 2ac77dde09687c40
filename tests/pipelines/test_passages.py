"""Reading-comprehension readers and the passage tokenizer, on the real samples in ../shared/data where they
exist (SQuAD 1.1 dev, WikiHop heads, SearchQA per-question JSON) and on hand-built files where they do not
(Quasar-T, SearchQA's processed txt): span alignment, candidate mentions, the token cap, malformed input."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from pipelines.passages import NO_ANSWER, OK, OVER_CAP, PassageTokenizer, char_to_token_span
from pipelines.readers import ReaderError
from pipelines.readers.passages import read_quasart, read_searchqa, read_squad, read_wikihop
from tests.pipelines.test_readers import _data_folder


@pytest.fixture(scope="module")
def tokenizer():
    return PassageTokenizer()


def _spelled(row: dict, start: int, end: int) -> str:
    return "".join(row["context_tokens"][start : end + 1])


def test_char_to_token_span_golden():
    # "Super Bowl 50 (2016)": tokens Super|Bowl|50|(|2016|)
    starts, ends = [0, 6, 11, 14, 15, 19], [5, 10, 13, 15, 19, 20]
    assert char_to_token_span(starts, ends, 6, 13) == (1, 2)  # "Bowl 50"
    assert char_to_token_span(starts, ends, 15, 19) == (4, 4)  # "2016"
    assert char_to_token_span(starts, ends, 12, 13) == (2, 2)  # "0": inside a token, the token covering it
    assert char_to_token_span(starts, ends, 5, 6) is None  # only the space between two tokens


def test_squad_dev_halves_hold_the_official_dev_set(shared_data):
    folder = _data_folder(shared_data, "squad_sample")
    halves = [read_squad(os.path.join(folder, f"dev-v1.1.du-split-{h}-half.json.gz")) for h in ("dev", "test")]
    tables = [h.splits["dev"] for h in halves]
    assert [t.num_rows for t in tables] == [4_961, 5_609]  # PROVENANCE.md; 10,570 = SQuAD 1.1 dev
    assert sum(len(a) for t in tables for a in t.column("answers").to_pylist()) == 34_726
    assert halves[0].check_sizes() == ["squad dev: 4,961 questions, published 10,570"]


def test_squad_spans_reproduce_the_answers(shared_data, tokenizer):
    corpus = read_squad(os.path.join(_data_folder(shared_data, "squad_sample"), "dev-v1.1.first1article.json"))
    rows = tokenizer(corpus.splits["dev"]).to_pylist()
    assert len(rows) == 810 and {r["status"] for r in rows} == {OK}
    first = rows[0]
    assert first["qid"] == "56be4db0acb8001400a502ec" and first["answers"] == ["Denver Broncos"] * 3
    assert [
        " ".join(first["context_tokens"][s : e + 1]) for s, e in zip(first["answer_starts"], first["answer_ends"])
    ] == ["denver broncos"]  # three annotators, one span
    spans = [(r, s, e) for r in rows for s, e in zip(r["answer_starts"], r["answer_ends"])]
    exact = [(r, s, e) for r, s, e in spans if _spelled(r, s, e) in {"".join(a.split()).lower() for a in r["answers"]}]
    # The rest start or end inside a token: "8" of "20-18" (an en dash in the text), "ten" inside "contenders"
    # (annotators' offsets).
    assert len(exact) / len(spans) > 0.98
    assert sum(r["inexact_spans"] for r in rows) == len(spans) - len(exact)


def test_searchqa_json_ranks_and_every_occurrence(shared_data, tokenizer):
    folder = os.path.join(_data_folder(shared_data, "searchqa_sample"), "hf_dummy_raw_jeopardy", "030000-49999")
    corpus = read_searchqa(folder)
    table = corpus.splits["train"]
    assert table.column("qid").to_pylist() == ["30000", "30001"]
    assert [len(p) for p in table.column("passage_ranks").to_pylist()] == [50, 31]  # PROVENANCE.md
    rows = tokenizer(table).to_pylist()
    samos = rows[0]
    assert samos["answers"] == ["Samos"] and samos["status"] == OK
    assert len(samos["passage_starts"]) == 50 and samos["passage_starts"] == sorted(samos["passage_starts"])
    assert len(samos["answer_starts"]) > 5  # every occurrence, not the first
    assert all(_spelled(samos, s, e) == "samos" for s, e in zip(samos["answer_starts"], samos["answer_ends"]))
    passages = table.column("passages").to_pylist()[0]
    assert samos["answer_starts"][0] < samos["passage_starts"][1] and "Samos" in passages[0]


def test_searchqa_processed_txt_layout(tmp_path, tokenizer):
    # No line of the processed train/val/test.txt is in ../shared/data (PROVENANCE.md): these follow the format
    # the authors' readers parse, `<s> snippet </s>  <s> ... ||| question ||| answer`, lower-cased and tokenised.
    (tmp_path / "val.txt").write_text(
        "<s> the eiffel tower is in paris . </s>  <s> paris , france 's capital </s> ||| this city has the eiffel "
        "tower ||| paris\n"
        "<s> nothing here </s> |||  ||| rome\n"  # an empty question: dropped and counted
        "<s> a snippet </s> ||| a question\n"
    )  # two fields: a bad record
    with pytest.raises(ReaderError, match=r"val.txt: line 3: 2 '\|\|\|'-separated fields"):
        read_searchqa(str(tmp_path))
    corpus = read_searchqa(str(tmp_path), on_error="skip")
    assert corpus.sizes() == {"dev": (1, 1)} and corpus.dropped_by_filter == {"dev": 1} and len(corpus.skipped) == 1
    row = tokenizer(corpus.splits["dev"]).to_pylist()[0]
    assert row["passage_starts"] == [0, 7] and row["passage_ranks"] == [1, 2]
    assert list(zip(row["answer_starts"], row["answer_ends"])) == [(5, 5), (7, 7)]


def test_a_train_split_whose_every_question_was_dropped_is_named_before_the_tokenizer_runs(tmp_path):
    """A train split read whole but holding no question with passages (each dropped and counted) ended in
    `KeyError: 'train'` where the split's counts were read; now one line names the input."""
    from pipelines.passages import write_passages
    from pipelines.tokenize import TokenizeConfig

    (tmp_path / "searchqa").mkdir()
    (tmp_path / "searchqa" / "train.txt").write_text("<s> nothing here </s> |||  ||| rome\n")  # no question: dropped
    cfg = TokenizeConfig(dataset="searchqa", input=str(tmp_path / "searchqa"), output=str(tmp_path / "out"))
    with pytest.raises(ReaderError, match="searchqa's train split holds no question with passages"):
        write_passages(cfg)
    assert not (tmp_path / "out").exists()


def _quasart(folder, questions, contexts, kind="short", split="dev"):
    os.makedirs(folder / "questions", exist_ok=True)
    os.makedirs(folder / "contexts" / kind, exist_ok=True)
    with gzip.open(folder / "questions" / f"{split}_questions.json.gz", "wt") as f:
        f.writelines(json.dumps(q) + "\n" for q in questions)
    with gzip.open(folder / "contexts" / kind / f"{split}_contexts.json.gz", "wt") as f:
        f.writelines(json.dumps(c) + "\n" for c in contexts)


def test_quasart_layout_alignment_and_cap(tmp_path):
    # Quasar-T has no file in ../shared/data: these follow its readme (one JSON object per line, contexts in the
    # same order as questions, `[score, text]` ranked).
    questions = [
        {"uid": "s0q1", "question": "which river flows through cairo ?", "answer": "nile", "tags": []},
        {"uid": "s0q2", "question": "red planet ?", "answer": "mars", "tags": []},
    ]
    contexts = [
        {"uid": "s0q1", "contexts": [[0.9, "the nile flows north through cairo ."], [0.5, "cairo , egypt"]]},
        {"uid": "s0q2", "contexts": [[0.8, "venus is hot ."]]},
    ]
    _quasart(tmp_path, questions, contexts)
    corpus = read_quasart(str(tmp_path))
    rows = PassageTokenizer().__call__(corpus.splits["dev"]).to_pylist()
    assert [r["status"] for r in rows] == [OK, NO_ANSWER]
    assert rows[0]["answer_starts"] == [1] and rows[0]["passage_ranks"] == [1, 2]
    capped = PassageTokenizer(max_context_tokens=8)(corpus.splits["dev"]).to_pylist()
    assert capped[0]["status"] == OVER_CAP and len(capped[0]["context_tokens"]) == 10
    with pytest.raises(ReaderError, match="no contexts/long/dev_contexts"):
        read_quasart(str(tmp_path), contexts="long")
    _quasart(tmp_path, questions, contexts[::-1])
    with pytest.raises(ReaderError, match=r"dev_questions.json.gz: line 1: uid 's0q1' but .* has 's0q2'"):
        read_quasart(str(tmp_path))
    _quasart(tmp_path, questions, contexts[:1])
    with pytest.raises(ReaderError, match="more lines than"):
        read_quasart(str(tmp_path))


def test_wikihop_candidate_mentions_and_answer(shared_data, tokenizer):
    folder = os.path.join(_data_folder(shared_data, "wikihop_sample"), "wikihop_ml4g_prefix")
    corpus = read_wikihop(os.path.join(folder, "dev.first28.json"))
    table = corpus.splits["dev"]
    assert table.num_rows == 28 and sum(len(p) for p in table.column("passages").to_pylist()) > 0
    rows = tokenizer(table).to_pylist()
    first = rows[0]
    assert first["qid"] == "WH_dev_0" and first["question"] == "country sms braunschweig"
    assert first["candidates"][first["answer_index"]] == "german empire"
    for row in rows:
        answer_mentions = {
            (s, e)
            for s, e, c in zip(row["mention_starts"], row["mention_ends"], row["mention_candidates"])
            if c == row["answer_index"]
        }
        assert set(zip(row["answer_starts"], row["answer_ends"])) == answer_mentions
    exact = sum(
        _spelled(r, s, e) == "".join(r["candidates"][c].split())
        for r in rows
        for s, e, c in zip(r["mention_starts"], r["mention_ends"], r["mention_candidates"])
    )
    assert exact / sum(len(r["mention_starts"]) for r in rows) > 0.98
    assert sum(r["status"] == OK for r in rows) >= 26  # an answer with no mention in the supports is rare


def test_truncated_wikihop_file_is_an_error_naming_it(shared_data):
    folder = os.path.join(_data_folder(shared_data, "wikihop_sample"), "wikihop_ml4g_prefix")
    with pytest.raises(ReaderError, match=r"dev.prefix.json: line \d+ column \d+: not valid JSON.*truncated"):
        read_wikihop(os.path.join(folder, "dev.prefix.json"))


def test_wikihop_answer_outside_candidates(tmp_path):
    record = {"id": "WH_x", "query": "located_in the x", "answer": "z", "candidates": ["y"], "supports": ["x is in y."]}
    (tmp_path / "dev.json").write_text(json.dumps([record]))
    with pytest.raises(ReaderError, match=r"record 0 \(WH_x\): answer 'z' is not among the candidates"):
        read_wikihop(str(tmp_path))
    assert read_wikihop(str(tmp_path), on_error="skip").splits["dev"].num_rows == 0


@pytest.fixture(scope="module")
def wikihop_tokenised(shared_data, ray_local, tmp_path_factory):
    from pipelines.tokenize import TokenizeConfig, write

    real = os.path.join(_data_folder(shared_data, "wikihop_sample"), "wikihop_ml4g_prefix")
    folder = tmp_path_factory.mktemp("wikihop_in")
    os.symlink(os.path.join(real, "train.first22.json"), folder / "train.json")
    os.symlink(os.path.join(real, "dev.first28.json"), folder / "dev.json")
    out = str(tmp_path_factory.mktemp("wikihop") / "out")
    cfg = TokenizeConfig(dataset="wikihop", input=str(folder), output=out, on_error="skip", max_context_tokens=3_000)
    return out, write(cfg), cfg


def test_wikihop_shards_manifest_and_streaming_read_back(wikihop_tokenised):
    from pipelines.shards import read_shards
    from pipelines.vocabulary import Vocabulary

    out, manifest, cfg = wikihop_tokenised
    assert manifest["schema"] == "tokenised_passages" and manifest["max_context_tokens"] == 3_000
    for split, total in (("train", 22), ("dev", 28)):
        entry = manifest["splits"][split]
        dropped = entry["dropped_over_token_cap"] + (entry["answer_not_found"] if split == "train" else 0)
        assert entry["questions"] == entry["rows"] == total - dropped
        assert sum(f["rows"] for f in entry["files"]) == entry["rows"]
    assert (
        manifest["splits"]["train"]["dropped_over_token_cap"] + manifest["splits"]["dev"]["dropped_over_token_cap"] > 0
    )
    vocab = Vocabulary.load(os.path.join(out, "vocab.json"))
    assert len(vocab.chars) == manifest["char_vocab_size"] and vocab.chars[:2] == ["<pad>", "<unk>"]
    from pipelines.tokenize import SpacyTokenizer

    train = read_shards(out, "train").take_all()
    train_tokens = {t for row in train for t in row["context_tokens"]}
    train_tokens |= {t for q in SpacyTokenizer().tokenize([row["question"] for row in train]) for t in q}
    assert set(vocab.tokens[4:]) == train_tokens  # counted on the kept training questions only
    rows = []
    for batch in read_shards(out, "dev", verify="sha256").iter_batches(batch_size=4, batch_format="pyarrow"):
        assert batch.num_rows <= 4
        rows.extend(batch.to_pylist())
    assert len(rows) == manifest["splits"]["dev"]["rows"]
    unknown = sum(i == 1 for row in rows for i in row["context_ids"])
    assert unknown == sum(t not in vocab.index for row in rows for t in row["context_tokens"]) > 0  # dev-only words
    for row in rows:
        tokens = row["context_tokens"]
        assert len(tokens) <= 3_000 and row["context_ids"] == vocab.ids(tokens)
        assert row["context_char_ids"] == vocab.char_ids(tokens, cfg.max_word_chars)
        assert row["passage_starts"][0] == 0 and row["passage_starts"] == sorted(row["passage_starts"])
        assert all(0 <= s <= e < len(tokens) for s, e in zip(row["mention_starts"], row["mention_ends"]))
        assert row["candidates"][row["answer_index"]] == row["answers"][0]


def test_read_shards_refuses_changed_or_extra_shards(wikihop_tokenised, tmp_path):
    import shutil

    from pipelines.shards import ShardError, read_shards

    copy = str(tmp_path / "copy")
    shutil.copytree(wikihop_tokenised[0], copy)
    shard = os.path.join(copy, wikihop_tokenised[1]["splits"]["dev"]["files"][0]["path"])
    with open(shard, "r+b") as f:  # same size, one byte changed
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    read_shards(copy, "dev")  # the size check cannot see it...
    with pytest.raises(ShardError, match="sha256 differs"):
        read_shards(copy, "dev", verify="sha256")  # ...the checksum does
    shutil.copy(shard, os.path.join(copy, "dev", "stray.parquet"))
    with pytest.raises(ShardError, match=r"stray\.parquet: a shard the manifest does not list"):
        read_shards(copy, "dev")


def test_training_question_without_its_answer_is_an_error_or_counted(shared_data, ray_local, tmp_path):
    from pipelines.tokenize import TokenizeConfig, write

    folder = os.path.join(_data_folder(shared_data, "searchqa_sample"), "hf_dummy_data_json")
    cfg = TokenizeConfig(dataset="searchqa", input=folder, output=str(tmp_path / "out"))
    with pytest.raises(ReaderError, match=r"1 training questions whose answer occurs in no passage \(first: 38 "):
        write(cfg)
    assert not os.path.exists(cfg.output)
    cfg.on_error = "skip"
    manifest = write(cfg)
    assert manifest["splits"]["train"]["answer_not_found"] == 1 and manifest["splits"]["train"]["rows"] == 1

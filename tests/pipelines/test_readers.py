"""Answer-selection readers on the real published files: split sizes against the published figures, exact
records, the two TrecQA layouts against each other, and malformed input (a clear error, or a counted skip)."""

from __future__ import annotations

import gzip
import os

import pytest

from pipelines.readers import ReaderError, read_insuranceqa, read_semeval, read_trecqa, read_wikiqa, read_yahooqa


def _data_folder(shared_data: str, name: str) -> str:
    path = os.path.join(shared_data, name)
    if not os.path.isdir(path):
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="module")
def wikiqa_dir(shared_data):
    return _data_folder(shared_data, "wikiqa")


@pytest.fixture(scope="module")
def trecqa_dir(shared_data):
    return _data_folder(shared_data, "trecqa")


def test_wikiqa_clean_and_raw_sizes_are_the_published_ones(wikiqa_dir):
    clean = read_wikiqa(wikiqa_dir)
    assert clean.sizes() == {"train": (873, 8_672), "dev": (126, 1_130), "test": (243, 2_351)}
    assert clean.check_sizes() == [] and "as published" in clean.summary()
    assert clean.dropped_by_filter == {"train": 2_118 - 873, "dev": 296 - 126, "test": 633 - 243}
    raw = read_wikiqa(wikiqa_dir, clean=False)
    assert raw.sizes() == {"train": (2_118, 20_360), "dev": (296, 2_733), "test": (633, 6_165)}


def test_wikiqa_records_are_exact_and_quotes_are_not_quoting(wikiqa_dir):
    corpus = read_wikiqa(wikiqa_dir)
    first = corpus.splits["train"].slice(0, 1).to_pylist()[0]
    assert first == {
        "qid": "Q1",
        "question": "how are glacier caves formed?",
        "aid": "D1-0",
        "answer": "A partly submerged glacier cave on Perito Moreno Glacier .",
        "label": 0,
    }
    test = {r["aid"]: r for r in corpus.splits["test"].to_pylist()}
    assert test["D33-3"]["answer"].startswith('Each tip of the "Y" of an antibody') and test["D33-3"]["label"] == 1
    assert not any("\r" in r["answer"] for r in test.values())  # CRLF files


def test_trecqa_jacana_sizes_and_questions_without_candidates(trecqa_dir):
    clean = read_trecqa(os.path.join(trecqa_dir, "jacana_xml"))
    assert clean.sizes() == {"train": (94, 4_718), "dev": (65, 1_117), "test": (68, 1_442)}
    assert clean.check_sizes() == []
    raw = read_trecqa(os.path.join(trecqa_dir, "jacana_xml"), clean=False)
    assert raw.sizes() == {"train": (94, 4_718), "dev": (82, 1_148), "test": (100, 1_517)}
    assert raw.without_candidates == {"train": 1, "dev": 1, "test": 5}
    positives = {s: sum(raw.splits[s].column("label").to_pylist()) for s in raw.splits}
    assert positives == {"train": 348, "dev": 222, "test": 284}  # PROVENANCE.md


def test_trecqa_both_layouts_give_the_same_pairs(trecqa_dir):
    jacana = read_trecqa(os.path.join(trecqa_dir, "jacana_xml"))
    castorini = read_trecqa(os.path.join(trecqa_dir, "castorini_toks"))
    for split in ("train", "dev", "test"):
        a, b = jacana.splits[split].to_pylist(), castorini.splits[split].to_pylist()
        assert [(r["qid"], r["aid"], r["label"]) for r in a] == [(r["qid"], r["aid"], r["label"]) for r in b]
        assert all(
            x["answer"].lower() == y["answer"] and x["question"].lower() == y["question"] for x, y in zip(a, b)
        ), split
    # the tokenised layout leaves out the question with no candidates, and the check says so
    assert castorini.check_sizes() == ["trecqa train: 93 questions / 4,718 pairs, published 94 / 4,718"]


def _wikiqa_file(tmp_path, lines):
    header = "QuestionID\tQuestion\tDocumentID\tDocumentTitle\tSentenceID\tSentence\tLabel"
    path = tmp_path / "WikiQA-dev.tsv"
    path.write_text("\r\n".join([header] + lines) + "\r\n")
    return str(path)


def test_malformed_wikiqa_rows_name_file_and_line_or_are_counted(tmp_path):
    good = "Q1\twhat is x?\tD1\tX\tD1-0\tX is a letter.\t1"
    path = _wikiqa_file(tmp_path, [good, "Q1\twhat is x?\tD1\tX\tD1-1\tX is", "Q2\ty?\tD2\tY\tD2-0\tY.\tyes"])
    with pytest.raises(ReaderError, match=r"WikiQA-dev.tsv: line 3: 6 columns, expected 7"):
        read_wikiqa(path)
    corpus = read_wikiqa(path, on_error="skip")
    assert corpus.splits["dev"].num_rows == 1
    assert [s.split(": ", 1)[1] for s in corpus.skipped] == [
        "line 3: 6 columns, expected 7",
        "line 4: label 'yes' is not 0 or 1",
    ]
    (tmp_path / "WikiQA-test.tsv").write_text("Question\tSentence\n")
    with pytest.raises(ReaderError, match="line 1: header"):
        read_wikiqa(str(tmp_path / "WikiQA-test.tsv"))


def test_truncated_jacana_file_is_an_error_naming_it(trecqa_dir, tmp_path):
    with gzip.open(os.path.join(trecqa_dir, "jacana_xml", "DEV.xml.gz"), "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    (tmp_path / "DEV.xml").write_text("\n".join(lines[:-3]) + "\n")  # cut inside the last block
    with pytest.raises(ReaderError, match=r"DEV.xml: end: file ends inside question"):
        read_trecqa(str(tmp_path))
    corpus = read_trecqa(str(tmp_path), clean=False, on_error="skip")
    assert len(corpus.skipped) == 1 and corpus.splits["dev"].num_rows == 1_148 - 1  # the cut candidate


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no WikiQA"):
        read_wikiqa(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no TrecQA files"):
        read_trecqa(str(tmp_path))


def test_tokenised_wikiqa_manifest_has_the_published_sizes(wikiqa_dir, ray_local, tmp_path):
    import json

    from pipelines.schemas import TOKENISED_PAIRS, read_table
    from pipelines.tokenize import SpacyTokenizer, TokenizeConfig, write
    from pipelines.vocabulary import Vocabulary

    out = str(tmp_path / "wikiqa")
    manifest = write(TokenizeConfig(dataset="wikiqa", input=wikiqa_dir, output=out))
    sizes = {s: (v["questions"], v["rows"]) for s, v in manifest["splits"].items()}
    assert sizes == {"train": (873, 8_672), "dev": (126, 1_130), "test": (243, 2_351)}
    assert manifest["reader"]["differences_from_published"] == [] and manifest["reader"]["skipped"] == []
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f)["splits"]["dev"]["rows"] == 1_130
    vocab = Vocabulary.load(os.path.join(out, "vocab.json"))
    dev = read_table(os.path.join(out, "dev"), TOKENISED_PAIRS).to_pylist()
    tokenizer = SpacyTokenizer()
    for row in dev[:50]:
        assert row["question_ids"] == vocab.ids(tokenizer.tokenize([row["question"]])[0])
        assert row["answer_ids"] == vocab.ids(tokenizer.tokenize([row["answer"]])[0])


@pytest.fixture(scope="module")
def semeval_dir(shared_data):
    return _data_folder(shared_data, "semeval2016_task3_ql")


def test_semeval_part1_has_task_c_labels_only(semeval_dir):
    with pytest.raises(ReaderError, match=r"no task A labels .*use task C"):
        read_semeval(semeval_dir)
    raw = read_semeval(semeval_dir, task="C", clean=False)
    # PROVENANCE.md: 103 distinct original questions (each repeated once per thread), 6,130 comments, 1,449 Good
    assert raw.sizes() == {"train": (103, 6_130)}
    assert sum(raw.splits["train"].column("label").to_pylist()) == 1_449
    first = raw.splits["train"].slice(0, 1).to_pylist()[0]
    assert first == {
        "qid": "Q1",
        "question": "Good Bank Which is a good bank as per your experience in Doha",
        "aid": "Q1_R4_C1",
        "answer": "Commercial bank/IBQ",
        "label": 1,
    }
    clean = read_semeval(semeval_dir, task="C")
    assert clean.sizes() == {"train": (92, 5_980)} and clean.dropped_by_filter == {"train": 11}


_SEMEVAL_TASK_A = """<?xml version="1.0" encoding="UTF-8"?>
<xml version="1.0">
<Thread THREAD_SEQUENCE="Q5_R1">
  <RelQuestion RELQ_ID="Q5_R1" RELQ_RELEVANCE2ORGQ="N/A">
    <RelQSubject>Visa</RelQSubject><RelQBody>How long does a family visa take?</RelQBody>
  </RelQuestion>
  <RelComment RELC_ID="Q5_R1_C1" RELC_RELEVANCE2ORGQ="N/A" RELC_RELEVANCE2RELQ="Good">
    <RelCText>Two weeks.</RelCText></RelComment>
  <RelComment RELC_ID="Q5_R1_C2" RELC_RELEVANCE2ORGQ="N/A" RELC_RELEVANCE2RELQ="Bad">
    <RelCText>lol</RelCText></RelComment>
  <RelComment RELC_ID="Q5_R1_C3" RELC_RELEVANCE2ORGQ="N/A" RELC_RELEVANCE2RELQ="Dialogue">
    <RelCText>?</RelCText></RelComment>
</Thread>
</xml>
"""


def test_semeval_task_a_on_a_file_in_the_published_layout(tmp_path):
    # Part 2, dev and test (the files with task A labels) are not in ../shared/data: this file follows the
    # README's layout, where a thread stands alone outside any <OrgQuestion>.
    path = tmp_path / "SemEval2016-Task3-CQA-QL-dev.xml"
    path.write_text(_SEMEVAL_TASK_A)
    with pytest.raises(ReaderError, match=r"CQA-QL-dev.xml: line 11: RELC_RELEVANCE2RELQ='Dialogue'"):
        read_semeval(str(tmp_path))
    corpus = read_semeval(str(tmp_path), on_error="skip")
    assert corpus.splits["dev"].to_pylist() == [
        {
            "qid": "Q5_R1",
            "question": "Visa How long does a family visa take?",
            "aid": "Q5_R1_C1",
            "answer": "Two weeks.",
            "label": 1,
        },
        {
            "qid": "Q5_R1",
            "question": "Visa How long does a family visa take?",
            "aid": "Q5_R1_C2",
            "answer": "lol",
            "label": 0,
        },
    ]
    assert len(corpus.skipped) == 1
    path.write_text(_SEMEVAL_TASK_A[:-40])
    with pytest.raises(ReaderError, match=r"CQA-QL-dev\.xml: line .*malformed XML"):
        read_semeval(str(tmp_path))


@pytest.fixture(scope="module")
def insuranceqa_with_answers(shared_data, tmp_path_factory):
    """The real vocabulary, train questions and dev pools, plus an answers file built here: the real
    `answers.label.token_idx` (24,981 answers) is not in ../shared/data. Answer N reads `idx_N idx_1`, so a
    row's text shows which label it came from."""
    real = _data_folder(shared_data, "insuranceqa_v1_incomplete")
    folder = tmp_path_factory.mktemp("insuranceqa")
    for name in os.listdir(real):
        os.symlink(os.path.join(real, name), folder / name)
    with open(folder / "answers.label.token_idx", "w") as f:
        f.writelines(f"{label}\tidx_{label % 22_352 + 1} idx_1\n" for label in range(1, 24_982))
    with gzip.open(os.path.join(real, "vocabulary.gz"), "rt") as f:
        words = dict(line.rstrip("\n").split("\t") for line in f)
    return folder, words


def test_insuranceqa_without_answers_says_which_file_is_missing(shared_data):
    with pytest.raises(ReaderError, match=r"needs answers\.label\.token_idx"):
        read_insuranceqa(_data_folder(shared_data, "insuranceqa_v1_incomplete"))


def test_insuranceqa_sizes_pools_and_token_mapping(insuranceqa_with_answers):
    folder, words = insuranceqa_with_answers
    corpus = read_insuranceqa(str(folder))
    # PROVENANCE.md and Feng et al.: 12,887 train questions with 18,540 correct answers, 1,000 dev pools of 500
    assert corpus.sizes() == {"train": (12_887, 18_540), "dev": (1_000, 500_000)}
    assert corpus.check_sizes() == [] and "as published" in corpus.summary()
    dev = corpus.splits["dev"]
    assert sum(dev.column("label").to_pylist()) == 1_454
    with gzip.open(os.path.join(folder, "question.dev.label.token_idx.pool.gz"), "rt") as f:
        correct, question, pool = f.readline().rstrip("\n").split("\t")
    first = dev.slice(0, 500).to_pylist()
    assert first[0]["question"] == " ".join(words[i] for i in question.split())
    assert [r["aid"] for r in first] == pool.split() and {r["qid"] for r in first} == {"dev-1"}
    assert {r["aid"] for r in first if r["label"]} == set(correct.split())
    assert first[0]["answer"] == f"{words[f'idx_{int(pool.split()[0]) % 22_352 + 1}']} {words['idx_1']}"


def test_insuranceqa_bad_pool_line_and_unknown_token(insuranceqa_with_answers, tmp_path):
    folder, _ = insuranceqa_with_answers
    for name in ("vocabulary.gz", "answers.label.token_idx"):
        os.symlink(os.path.join(folder, name), tmp_path / name)
    (tmp_path / "question.test1.label.token_idx.pool").write_text(
        "1 2\tidx_5 idx_6\t1 2 3\n"  # good: 3 candidates, 2 correct
        "7\tidx_5\t8 9\n"  # the correct answer is not in the pool
        "4\tidx_5 idx_6\n"
    )  # a missing column (a truncated line)
    with pytest.raises(ReaderError, match=r"test1.label.token_idx.pool: line 2: .*missing from the candidate pool"):
        read_insuranceqa(str(tmp_path))
    corpus = read_insuranceqa(str(tmp_path), on_error="skip")
    assert corpus.sizes() == {"test1": (1, 3)} and len(corpus.skipped) == 2
    assert "line 3: 2 tab-separated fields" in corpus.skipped[1]
    (tmp_path / "question.test1.label.token_idx.pool").write_text("5\tidx_999999\t5 6\n")
    with pytest.raises(ReaderError, match=r"line 1: token 'idx_999999' is not in the vocabulary"):
        read_insuranceqa(str(tmp_path), on_error="skip")  # a wrong vocabulary file is never skipped past


def test_yahooqa_tsv_groups_candidates_by_question(tmp_path):
    # No YahooQA file is in ../shared/data (the authors' splits are a pickle, absent from the store): these
    # lines follow the Tay et al. layout, five candidates per question with one positive.
    lines = ["how do i fix a flat bike tyre ?\tpatch the inner tube after finding the hole .\t1"]
    lines += [f"how do i fix a flat bike tyre ?\tunrelated answer number {i} here .\t0" for i in range(4)]
    lines += ["why is the sky blue at noon ?\tbecause of rayleigh scattering of sunlight .\t0"]
    lines += ["what is a good cheap laptop ?\tany used thinkpad works well .\t1", "bad line without tabs"]
    (tmp_path / "dev.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ReaderError, match=r"dev.tsv: line 8: 1 columns, expected 3"):
        read_yahooqa(str(tmp_path))
    corpus = read_yahooqa(str(tmp_path), on_error="skip")
    assert corpus.sizes() == {"dev": (2, 6)} and corpus.dropped_by_filter == {"dev": 1}
    rows = corpus.splits["dev"].to_pylist()
    assert [r["aid"] for r in rows[:5]] == [f"dev-1-{i}" for i in range(1, 6)] and rows[5]["qid"] == "dev-3"
    assert corpus.check_sizes() == ["yahooqa dev: 2 questions / 6 pairs, published 6,289 / ?"]
    assert read_yahooqa(str(tmp_path), clean=False, on_error="skip").sizes() == {"dev": (3, 7)}


def test_trecqa_train_all_when_given(tmp_path):
    # TRAIN-ALL.xml is not in ../shared/data (PROVENANCE.md): this block follows the jacana layout of the other
    # files, five tab-separated lines per element of which the first is the tokens.
    block = (
        "<QApairs id='32.1'>\n<question>\nWho\tfounded\tit\t?\nWP\tVBD\tPRP\t.\nO\tO\tO\tO\n1\t2\t3\t4\n"
        "a\tb\tc\td\n</question>\n<positive>\nSmith\tfounded\tit\t.\nNNP\tVBD\tPRP\t.\nO\tO\tO\tO\n1\t2\t3\t4\n"
        "a\tb\tc\td\n</positive>\n<negative>\nIt\trained\t.\nPRP\tVBD\t.\nO\tO\tO\n1\t2\t3\na\tb\tc\n"
        "</negative>\n</QApairs>\n"
    )
    (tmp_path / "TRAIN-ALL.xml").write_text(block)
    (tmp_path / "TRAIN.xml").write_text(block)
    corpus = read_trecqa(str(tmp_path))
    assert set(corpus.splits) == {"train", "train-all"}
    assert corpus.splits["train-all"].to_pylist() == [
        {"qid": "32.1", "question": "Who founded it ?", "aid": "32.1-1", "answer": "Smith founded it .", "label": 1},
        {"qid": "32.1", "question": "Who founded it ?", "aid": "32.1-2", "answer": "It rained .", "label": 0},
    ]
    assert "trecqa train-all: 1 questions, 2 pairs (published 1,229 / 53,417)" in corpus.summary()

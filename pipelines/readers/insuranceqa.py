"""InsuranceQA v1 (Feng et al. 2015) in its token-index files: answers, vocabulary, train and candidate pools."""

from __future__ import annotations

import os

import pyarrow as pa

from pipelines.readers.common import PAIRS, Corpus, Errors, ReaderError, find_file, open_text

_INSURANCEQA_POOLS = {
    "dev": "question.dev.label.token_idx.pool",
    "test1": "question.test1.label.token_idx.pool",
    "test2": "question.test2.label.token_idx.pool",
}


def _insuranceqa_words(file: str) -> dict[str, str]:
    words = {}
    with open_text(file) as f:
        for number, line in enumerate(f, start=1):
            key, tab, word = line.rstrip("\r\n").partition("\t")
            if not tab or not key.startswith("idx_") or not word:
                raise ReaderError(f"{file}: line {number}: expected 'idx_N<TAB>word', got {line[:60]!r}")
            words[key] = word
    return words


class _Detokenizer:
    """Token-index strings (`idx_12 idx_7 ...`) to text through the `vocabulary` file."""

    def __init__(self, words: dict[str, str]):
        self.words = words

    def __call__(self, ids: str, where: str) -> str:
        try:
            return " ".join(self.words[i] for i in ids.split())
        except KeyError as missing:
            raise ReaderError(f"{where}: token {missing.args[0]!r} is not in the vocabulary file") from None


def insuranceqa_files(path: str) -> tuple[str, str, dict[str, str]]:
    """The vocabulary file, the answers file and `{split: question file}` in the folder `path`; an error naming
    what is missing."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not an InsuranceQA v1 folder")
    vocabulary = find_file(path, "vocabulary")
    answers_file = find_file(path, "answers.label.token_idx")
    if vocabulary is None or answers_file is None:
        missing = [n for n, f in (("vocabulary", vocabulary), ("answers.label.token_idx", answers_file)) if f is None]
        raise ReaderError(
            f"{path}: InsuranceQA v1 needs {' and '.join(missing)} (plain or .gz) beside the question "
            "files; copy it from the original release (github.com/shuzi/insuranceQA, V1/)"
        )
    names = {"train": "question.train.token_idx.label", **_INSURANCEQA_POOLS}
    found = {split: find_file(path, name) for split, name in names.items()}
    questions = {split: file for split, file in found.items() if file}
    if not questions:
        raise FileNotFoundError(
            f"{path}: no InsuranceQA question files (question.train.token_idx.label, "
            "question.{dev,test1,test2}.label.token_idx.pool)"
        )
    return vocabulary, answers_file, questions


def read_insuranceqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """InsuranceQA v1 (Feng et al. 2015), the folder of the original release: `vocabulary` (`idx_N<TAB>word`),
    `answers.label.token_idx` (`label<TAB>idx_ ...`, 24,981 answers), `question.train.token_idx.label`
    (`question idx_ ...<TAB>correct labels`) and the pools `question.{dev,test1,test2}.label.token_idx.pool`
    (`correct labels<TAB>question idx_ ...<TAB>500 candidate labels`); each file plain or .gz. Text is the
    tokens joined by spaces. Train rows are the correct answers only (the papers sample negatives from the whole
    answer set while training); pool rows are every candidate, label 1 for the correct ones. Question ids are
    `SPLIT-LINE`, answer ids the answer labels. `clean` does not apply (every question has a correct answer)."""
    vocabulary, answers_file, questions = insuranceqa_files(path)
    text = _Detokenizer(_insuranceqa_words(vocabulary))
    errors = Errors(on_error)
    answers: dict[str, str] = {}
    with open_text(answers_file) as f:
        for number, line in enumerate(f, start=1):
            where = f"{answers_file}: line {number}"
            label, tab, ids = line.rstrip("\r\n").partition("\t")
            if not tab or not label.strip().isdigit() or not ids.strip():
                errors(where, f"expected 'label<TAB>idx_ ...', got {line[:60]!r}")
                continue
            answers[label.strip()] = text(ids, where)

    def answer(label: str, where: str) -> str | None:
        if label not in answers:
            errors(where, f"answer label {label} is not in {answers_file}")
            return None
        return answers[label]

    corpus = Corpus("insuranceqa", {}, clean=clean)
    train = questions.get("train")
    if train:
        columns: dict[str, list] = {k: [] for k in PAIRS.names}
        with open_text(train) as f:
            for number, line in enumerate(f, start=1):
                where = f"{train}: line {number}"
                fields = line.rstrip("\r\n").split("\t")
                if len(fields) != 2 or not fields[0].strip() or not fields[1].split():
                    errors(where, f"{len(fields)} tab-separated fields, expected 2 (question ids, correct labels)")
                    continue
                question = text(fields[0], where)
                for label in fields[1].split():
                    found = answer(label, where)
                    if found is not None:
                        _append(columns, f"train-{number}", question, label, found, 1)
        corpus.splits["train"] = pa.table(columns, schema=PAIRS)
    for split in _INSURANCEQA_POOLS:
        file = questions.get(split)
        if file is None:
            continue
        columns = {k: [] for k in PAIRS.names}
        with open_text(file) as f:
            for number, line in enumerate(f, start=1):
                where = f"{file}: line {number}"
                fields = line.rstrip("\r\n").split("\t")
                if len(fields) != 3:
                    errors(
                        where,
                        f"{len(fields)} tab-separated fields, expected 3 (correct labels, question ids, "
                        "candidate labels)",
                    )
                    continue
                correct, pool = set(fields[0].split()), fields[2].split()
                if not correct or not correct <= set(pool):
                    errors(where, "no correct answer, or a correct answer missing from the candidate pool")
                    continue
                question = text(fields[1], where)
                candidates = [(label, answer(label, where)) for label in pool]
                if any(found is None for _, found in candidates):
                    continue
                for label, found in candidates:
                    _append(columns, f"{split}-{number}", question, label, found or "", int(label in correct))
        corpus.splits[split] = pa.table(columns, schema=PAIRS)
    corpus.skipped = errors.skipped
    return corpus


def _append(columns: dict[str, list], qid: str, question: str, aid: str, answer: str, label: int) -> None:
    for key, value in (("qid", qid), ("question", question), ("aid", aid), ("answer", answer), ("label", label)):
        columns[key].append(value)

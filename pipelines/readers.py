"""Readers for the answer-selection sets in their published formats, each checked against published sizes.

Every reader returns `{split: pa.Table}` in the PAIRS shape (qid, question, aid, answer, label), candidates in
file order. Bad input raises `ReaderError` naming the file and line; with `on_error="skip"` the bad record is
skipped and counted instead (`Corpus.skipped`), never dropped silently.

- WikiQA (Yang et al. 2015): the original `WikiQA-{train,dev,test}.tsv` (CRLF, a header, no quoting: sentences
  hold bare `"`). `clean=True` (the papers' setting) keeps questions with at least one correct answer:
  873/126/243 questions, 8,672/1,130/2,351 pairs.
- TrecQA (Wang et al. 2007, Yao et al. 2013): the jacana pseudo-XML (`TRAIN.xml`, `DEV.xml`, `TEST.xml`,
  `TRAIN-ALL.xml` when there; five tab-separated lines per sentence of which the first is the tokens), or the
  tokenised castorini layout (`train/`, `raw-dev/`, `clean-test/`, ...: line-aligned `a.toks`, `b.toks`,
  `sim.txt`, `id.txt`). `clean=True` drops dev/test questions whose candidates are all positive or all
  negative: 65/68 questions, 1,117/1,442 pairs.
- SemEval-2016 Task 3 Qatar Living (English XML): task A (a thread's question against its ten comments, Good
  positive), as the CTRN paper's QatarLiving (its Table 3, full release: 4.8K/224/327 questions,
  36K/2.4K/3.2K pairs), or task C (the original question against the comments of all its threads).
"""
from __future__ import annotations

import csv
import gzip
import io
import os
import re
from dataclasses import dataclass, field

import pyarrow as pa

PAIRS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("aid", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),
    ]
)

# Published split sizes: (questions, pairs). Sources: the WikiQA paper and the castorini/jacana releases as
# counted in ../shared/data/*/PROVENANCE.md; TrecQA clean dev/test as in Rao et al. 2016.
PUBLISHED = {
    ("wikiqa", True): {"train": (873, 8_672), "dev": (126, 1_130), "test": (243, 2_351)},
    ("wikiqa", False): {"train": (2_118, 20_360), "dev": (296, 2_733), "test": (633, 6_165)},
    ("trecqa", True): {"train": (94, 4_718), "train-all": (1_229, 53_417), "dev": (65, 1_117),
                       "test": (68, 1_442)},
    ("trecqa", False): {"train": (94, 4_718), "train-all": (1_229, 53_417), "dev": (82, 1_148),
                        "test": (100, 1_517)},
    # Feng et al. 2015 (and the GGSA paper's Table 1): train lists only each question's correct answers;
    # dev/test pools hold 500 candidates.
    ("insuranceqa", None): {"train": (12_887, 18_540), "dev": (1_000, 500_000), "test1": (1_800, 900_000),
                            "test2": (1_800, 900_000)},
    # Tay et al. 2017 splits as counted in the GGSA paper's Table 1 (five candidates per question); the CTRN
    # paper's rounded "253K / 31.7K / 31.7K" pairs disagree with 5 x questions, so pairs are not checked.
    ("yahooqa", None): {"train": (50_112, None), "dev": (6_289, None), "test": (6_283, None)},
}


class ReaderError(ValueError):
    """A corpus file that does not match its published format; the message names the file and line."""


@dataclass
class Corpus:
    name: str
    splits: dict[str, pa.Table]
    skipped: list[str] = field(default_factory=list)  # "file:line: reason" for each record skipped
    dropped_by_filter: dict[str, int] = field(default_factory=dict)  # questions removed by `clean`, per split
    clean: bool = True
    # Questions the file lists with no candidate at all (jacana TrecQA has some): not in the pairs, but in
    # the published question counts.
    without_candidates: dict[str, int] = field(default_factory=dict)
    rows_are_questions: bool = False  # reading comprehension: one row per question

    def sizes(self) -> dict[str, tuple[int, int]]:
        """(questions, pairs) per split; questions include those listed without candidates."""
        return {split: (len(set(t.column("qid").to_pylist())) + self.without_candidates.get(split, 0), t.num_rows)
                for split, t in self.splits.items()}

    def published(self) -> dict[str, tuple[int, int | None]]:
        return PUBLISHED.get((self.name, self.clean), PUBLISHED.get((self.name, None), {}))

    def check_sizes(self) -> list[str]:
        """Differences from the published sizes, one line each (empty when every split matches)."""
        problems = []
        for split, (questions, pairs) in self.sizes().items():
            want = self.published().get(split)
            if want is not None and not _matches(want, (questions, pairs)):
                problems.append(f"{self.name} {split}: {questions:,} questions, published {_count(want[0])}"
                                if self.rows_are_questions else
                                f"{self.name} {split}: {questions:,} questions / {pairs:,} pairs, published "
                                f"{_count(want[0])} / {_count(want[1])}")
        return problems

    def summary(self) -> str:
        lines = []
        for split, (questions, pairs) in self.sizes().items():
            want = self.published().get(split)
            mark = "" if want is None else " (as published)" if _matches(want, (questions, pairs)) else \
                f" (published {_count(want[0])} / {_count(want[1])})"
            if self.rows_are_questions:
                mark = "" if want is None else " (as published)" if _matches(want, (questions, pairs)) else \
                    f" (published {_count(want[0])})"
                lines.append(f"{self.name} {split}: {questions:,} questions{mark}")
            else:
                lines.append(f"{self.name} {split}: {questions:,} questions, {pairs:,} pairs{mark}")
        if self.skipped:
            lines.append(f"{self.name}: {len(self.skipped)} bad records skipped, first: {self.skipped[0]}")
        return "\n".join(lines)


def _matches(published: tuple, found: tuple) -> bool:
    return all(want is None or want == got for want, got in zip(published, found))


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _open_text(path: str) -> io.TextIOBase:
    raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def _find(folder: str, name: str) -> str | None:
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    return None


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=PAIRS)


class _Errors:
    def __init__(self, on_error: str):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error, self.skipped = on_error, []

    def __call__(self, where: str, reason: str) -> None:
        if self.on_error == "raise":
            raise ReaderError(f"{where}: {reason}")
        self.skipped.append(f"{where}: {reason}")


def _keep_clean(rows: list[dict], drop_all_positive: bool) -> tuple[list[dict], int]:
    """Questions with at least one positive (and, when `drop_all_positive`, at least one negative)."""
    labels: dict[str, set[int]] = {}
    for r in rows:
        labels.setdefault(r["qid"], set()).add(r["label"])
    keep = {q for q, seen in labels.items() if 1 in seen and (0 in seen or not drop_all_positive)}
    return [r for r in rows if r["qid"] in keep], len(labels) - len(keep)


# --------------------------------------------------------------------------------------------------- WikiQA
_WIKIQA_HEADER = ["QuestionID", "Question", "DocumentID", "DocumentTitle", "SentenceID", "Sentence", "Label"]


def read_wikiqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """`path`: the folder with `WikiQA-{train,dev,test}.tsv` (or `.tsv.gz`), or one of those files."""
    files = {}
    if os.path.isfile(path):
        match = re.search(r"WikiQA-(train|dev|test)\.tsv", os.path.basename(path))
        if not match:
            raise ReaderError(f"{path}: not a WikiQA-{{train,dev,test}}.tsv file")
        files[match.group(1)] = path
    else:
        for split in ("train", "dev", "test"):
            found = _find(path, f"WikiQA-{split}.tsv")
            if found:
                files[split] = found
        if not files:
            raise FileNotFoundError(f"{path}: no WikiQA-{{train,dev,test}}.tsv(.gz) found")
    errors = _Errors(on_error)
    corpus = Corpus("wikiqa", {}, clean=clean)
    for split, file in files.items():
        rows = []
        with _open_text(file) as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader, None)
            if header != _WIKIQA_HEADER:
                raise ReaderError(f"{file}: line 1: header {header!r}, expected {_WIKIQA_HEADER}")
            for number, fields in enumerate(reader, start=2):
                where = f"{file}: line {number}"
                if len(fields) != len(_WIKIQA_HEADER):
                    errors(where, f"{len(fields)} columns, expected {len(_WIKIQA_HEADER)}")
                    continue
                qid, question, _, _, sid, sentence, label = fields
                if label not in ("0", "1"):
                    errors(where, f"label {label!r} is not 0 or 1")
                    continue
                if not question.strip() or not sentence.strip():
                    errors(where, "empty question or sentence")
                    continue
                rows.append({"qid": qid, "question": question, "aid": sid, "answer": sentence, "label": int(label)})
        if clean:
            rows, dropped = _keep_clean(rows, drop_all_positive=False)
            corpus.dropped_by_filter[split] = dropped
        corpus.splits[split] = _table(rows)
    corpus.skipped = errors.skipped
    return corpus


# --------------------------------------------------------------------------------------------------- TrecQA
_JACANA_FILES = {"train": "TRAIN.xml", "train-all": "TRAIN-ALL.xml", "dev": "DEV.xml", "test": "TEST.xml"}
_CASTORINI_DIRS = {"train": ["train"], "train-all": ["train-all"], "dev": ["clean-dev", "raw-dev"],
                   "test": ["clean-test", "raw-test"]}


def _jacana_questions(file: str, errors: _Errors) -> tuple[list[dict], int]:
    """One jacana file: rows of every `<QApairs>` block (text is the first line of each 5-line element), and
    how many blocks had no candidate."""
    rows: list[dict] = []
    empty = 0
    qid = question = None
    element = None  # "question", "positive" or "negative" while inside one
    first_line = None
    count = 0
    in_block = False
    with _open_text(file) as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            where = f"{file}: line {number}"
            opening = re.fullmatch(r"<QApairs id=['\"]([^'\"]+)['\"]>", line)
            if opening:
                if in_block:
                    errors(where, f"<QApairs> opened before question {qid} was closed")
                qid, question, in_block, count = opening.group(1), None, True, 0
                continue
            if line == "</QApairs>":
                if not in_block:
                    errors(where, "</QApairs> without an opening tag")
                elif count == 0:
                    empty += 1
                in_block = False
                continue
            tag = re.fullmatch(r"<(/?)(question|positive|negative)>", line)
            if tag:
                closing, name = tag.group(1) == "/", tag.group(2)
                if not in_block:
                    errors(where, f"<{name}> outside a <QApairs> block")
                    continue
                if not closing:
                    element, first_line = name, None
                    continue
                if element != name:
                    errors(where, f"</{name}> closes <{element}>")
                    element = None
                    continue
                text = " ".join((first_line or "").split("\t")).strip()
                element = None
                if not text:
                    errors(where, f"empty <{name}> in question {qid}")
                    continue
                if name == "question":
                    question = text
                elif question is None:
                    errors(where, f"a candidate before the question in block {qid}")
                else:
                    count += 1
                    rows.append({"qid": qid, "question": question, "aid": f"{qid}-{count}", "answer": text,
                                 "label": int(name == "positive")})
                continue
            if element is not None and first_line is None:
                first_line = line
            elif element is None and line.strip():
                errors(where, f"unexpected line outside an element: {line[:60]!r}")
    if in_block or element is not None:
        errors(f"{file}: end", f"file ends inside question {qid} (truncated?)")
    return rows, empty


def _castorini_split(folder: str, errors: _Errors) -> list[dict]:
    paths = {name: os.path.join(folder, name) for name in ("a.toks", "b.toks", "sim.txt", "id.txt")}
    for name, p in paths.items():
        if not os.path.isfile(p):
            raise ReaderError(f"{folder}: {name} missing (castorini layout: a.toks, b.toks, sim.txt, id.txt)")
    columns = {}
    for name, p in paths.items():
        with open(p, encoding="utf-8", newline="") as f:
            columns[name] = f.read().splitlines()
    lengths = {name: len(v) for name, v in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ReaderError(f"{folder}: files are not line-aligned: {lengths}")
    rows, per_question = [], {}
    for i, (q, a, sim, qid) in enumerate(zip(columns["a.toks"], columns["b.toks"], columns["sim.txt"],
                                             columns["id.txt"])):
        where = f"{paths['sim.txt']}: line {i + 1}"
        if sim.strip() not in ("0", "1"):
            errors(where, f"label {sim!r} is not 0 or 1")
            continue
        qid = qid.strip()
        per_question[qid] = per_question.get(qid, 0) + 1
        rows.append({"qid": qid, "question": q.strip(), "aid": f"{qid}-{per_question[qid]}", "answer": a.strip(),
                     "label": int(sim.strip())})
    return rows


def read_trecqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """`path`: a folder with the jacana files (`TRAIN.xml`, `DEV.xml`, `TEST.xml`, optionally `TRAIN-ALL.xml`,
    plain or .gz) or the castorini folders (`train/`, `clean-dev/` or `raw-dev/`, ...). With castorini folders,
    `clean` picks `clean-*` over `raw-*` (and filters `raw-*` when only those are there)."""
    errors = _Errors(on_error)
    corpus = Corpus("trecqa", {}, clean=clean)
    jacana = {split: _find(path, name) for split, name in _JACANA_FILES.items()}
    jacana = {split: file for split, file in jacana.items() if file}
    if jacana:
        for split, file in jacana.items():
            rows, empty = _jacana_questions(file, errors)
            if clean and split in ("dev", "test"):
                rows, dropped = _keep_clean(rows, drop_all_positive=True)
                corpus.dropped_by_filter[split] = dropped + empty
            elif empty:
                corpus.without_candidates[split] = empty
            corpus.splits[split] = _table(rows)
    else:
        for split, names in _CASTORINI_DIRS.items():
            choices = names if clean else list(reversed(names))
            folder = next((os.path.join(path, n) for n in choices if os.path.isdir(os.path.join(path, n))), None)
            if folder is None:
                continue
            rows = _castorini_split(folder, errors)
            if clean and split in ("dev", "test") and os.path.basename(folder).startswith("raw"):
                rows, corpus.dropped_by_filter[split] = _keep_clean(rows, drop_all_positive=True)
            corpus.splits[split] = _table(rows)
    if not corpus.splits:
        raise FileNotFoundError(f"{path}: no TrecQA files (jacana TRAIN/DEV/TEST.xml or castorini train/, dev/...)")
    corpus.skipped = errors.skipped
    return corpus


# -------------------------------------------------------------------------------------------- SemEval CQA
_SEMEVAL_SPLITS = {"train": ("train-part1", "train-part2", "train"), "dev": ("dev",), "test": ("test",)}


def _semeval_split_of(file: str) -> str | None:
    name = os.path.basename(file).lower()
    if not re.search(r"semeval.*task3.*\.xml(\.gz)?$", name):
        return None
    for split, marks in _SEMEVAL_SPLITS.items():
        if any(f"-{mark}" in name for mark in marks):
            return split
    return None


def _semeval_text(subject: str | None, body: str | None) -> str:
    return " ".join(part.strip() for part in (subject or "", body or "") if part and part.strip())


def read_semeval(path: str, clean: bool = True, on_error: str = "raise", task: str = "A") -> Corpus:
    """SemEval-2016 Task 3, Qatar Living (English) XML: `path` a folder of the official files
    (`SemEval2016-Task3-CQA-QL-{train-part1,train-part2,dev,test}*.xml[.gz]`) or one of them.

    Task A (the CTRN paper's QatarLiving): each thread's related question against its ten comments,
    `RELC_RELEVANCE2RELQ` Good positive, PotentiallyUseful and Bad negative; one question per thread.
    Task C: the original question against the comments of all its related threads (`RELC_RELEVANCE2ORGQ`),
    grouped by `ORGQ_ID` (an original question is repeated once per thread in the file). Part 1 of the
    training release has no task A labels (`N/A`), so task A over it is an error that says so. `clean` drops
    questions with no Good comment (they carry no ranking signal: every metric is undefined for them)."""
    from lxml import etree

    if task not in ("A", "C"):
        raise ValueError(f"SemEval task must be 'A' or 'C', got {task!r}")
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path) if _semeval_split_of(f)) if os.path.isdir(path) else []
    if not files:
        raise FileNotFoundError(f"{path}: no SemEval2016-Task3-CQA-QL-*.xml(.gz) files")
    errors = _Errors(on_error)
    by_split: dict[str, list[dict]] = {}
    label_field = "RELC_RELEVANCE2RELQ" if task == "A" else "RELC_RELEVANCE2ORGQ"
    for file in files:
        split = _semeval_split_of(file) or "train"
        rows = by_split.setdefault(split, [])
        seen = {(r["qid"], r["aid"]) for r in rows}
        unlabelled = 0
        raw = gzip.open(file, "rb") if file.endswith(".gz") else open(file, "rb")
        with raw:
            try:
                root = etree.parse(raw, etree.XMLParser(huge_tree=True)).getroot()
            except etree.XMLSyntaxError as err:
                raise ReaderError(f"{file}: line {err.lineno}: malformed XML: {err.msg}") from None
        # Threads sit inside their <OrgQuestion> (the full release) or at the top (task A only files).
        for thread in root.iter("Thread"):
            org = thread.getparent()
            rel = thread.find("RelQuestion")
            if rel is None:
                errors(f"{file}: line {thread.sourceline}", "a <Thread> without <RelQuestion>")
                continue
            if task == "A":
                qid = rel.get("RELQ_ID")
                question = _semeval_text(rel.findtext("RelQSubject"), rel.findtext("RelQBody"))
            elif org is None or org.tag != "OrgQuestion":
                errors(f"{file}: line {thread.sourceline}", "task C needs each <Thread> inside an <OrgQuestion>")
                continue
            else:
                qid = org.get("ORGQ_ID")
                question = _semeval_text(org.findtext("OrgQSubject"), org.findtext("OrgQBody"))
            for comment in thread.iter("RelComment"):
                where = f"{file}: line {comment.sourceline}"
                label = comment.get(label_field)
                aid = comment.get("RELC_ID")
                if label == "N/A":
                    unlabelled += 1
                    continue
                if label not in ("Good", "PotentiallyUseful", "Bad"):
                    errors(where, f"{label_field}={label!r} is not Good, PotentiallyUseful or Bad")
                    continue
                text = (comment.findtext("RelCText") or "").strip()
                if not aid or not text or not question:
                    errors(where, "a comment without RELC_ID or text, or an empty question")
                    continue
                if (qid, aid) in seen:  # the same comment for the same question twice (a repeated thread)
                    continue
                seen.add((qid, aid))
                rows.append({"qid": qid, "question": question, "aid": aid, "answer": text,
                             "label": int(label == "Good")})
        if unlabelled and not rows:
            raise ReaderError(f"{file}: every comment's {label_field} is N/A: this file has no task {task} labels"
                              + (" (part 1 of the 2016 training release has task C labels: use task C)"
                                 if task == "A" else ""))
    corpus = Corpus("semeval-ql", {}, clean=clean)
    for split, rows in by_split.items():
        if clean:
            rows, corpus.dropped_by_filter[split] = _keep_clean(rows, drop_all_positive=False)
        corpus.splits[split] = _table(rows)
    corpus.skipped = errors.skipped
    return corpus


# ---------------------------------------------------------------------------------------------- InsuranceQA
_INSURANCEQA_POOLS = {"dev": "question.dev.label.token_idx.pool", "test1": "question.test1.label.token_idx.pool",
                      "test2": "question.test2.label.token_idx.pool"}


def _insuranceqa_words(file: str) -> dict[str, str]:
    words = {}
    with _open_text(file) as f:
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


def read_insuranceqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """InsuranceQA v1 (Feng et al. 2015), the folder of the original release: `vocabulary` (`idx_N<TAB>word`),
    `answers.label.token_idx` (`label<TAB>idx_ ...`, 24,981 answers), `question.train.token_idx.label`
    (`question idx_ ...<TAB>correct labels`) and the pools `question.{dev,test1,test2}.label.token_idx.pool`
    (`correct labels<TAB>question idx_ ...<TAB>500 candidate labels`); each file plain or .gz. Text is the
    tokens joined by spaces. Train rows are the correct answers only (the papers sample negatives from the whole
    answer set while training); pool rows are every candidate, label 1 for the correct ones. Question ids are
    `SPLIT-LINE`, answer ids the answer labels. `clean` does not apply (every question has a correct answer)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not an InsuranceQA v1 folder")
    vocabulary = _find(path, "vocabulary")
    answers_file = _find(path, "answers.label.token_idx")
    if vocabulary is None or answers_file is None:
        missing = [n for n, f in (("vocabulary", vocabulary), ("answers.label.token_idx", answers_file)) if f is None]
        raise ReaderError(f"{path}: InsuranceQA v1 needs {' and '.join(missing)} (plain or .gz) beside the question "
                          "files; copy it from the original release (github.com/shuzi/insuranceQA, V1/)")
    text = _Detokenizer(_insuranceqa_words(vocabulary))
    errors = _Errors(on_error)
    answers: dict[str, str] = {}
    with _open_text(answers_file) as f:
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
    train = _find(path, "question.train.token_idx.label")
    if train:
        columns = {k: [] for k in PAIRS.names}
        with _open_text(train) as f:
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
    for split, name in _INSURANCEQA_POOLS.items():
        file = _find(path, name)
        if file is None:
            continue
        columns = {k: [] for k in PAIRS.names}
        with _open_text(file) as f:
            for number, line in enumerate(f, start=1):
                where = f"{file}: line {number}"
                fields = line.rstrip("\r\n").split("\t")
                if len(fields) != 3:
                    errors(where, f"{len(fields)} tab-separated fields, expected 3 (correct labels, question ids, "
                                  "candidate labels)")
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
                    _append(columns, f"{split}-{number}", question, label, found, int(label in correct))
        corpus.splits[split] = pa.table(columns, schema=PAIRS)
    if not corpus.splits:
        raise FileNotFoundError(f"{path}: no InsuranceQA question files (question.train.token_idx.label, "
                                "question.{dev,test1,test2}.label.token_idx.pool)")
    corpus.skipped = errors.skipped
    return corpus


def _append(columns: dict[str, list], qid: str, question: str, aid: str, answer: str, label: int) -> None:
    for key, value in (("qid", qid), ("question", question), ("aid", aid), ("answer", answer), ("label", label)):
        columns[key].append(value)


# -------------------------------------------------------------------------------------------------- YahooQA
def read_yahooqa(path: str, clean: bool = True, on_error: str = "raise") -> Corpus:
    """YahooQA in the Tay et al. 2017 splits (github.com/vanzytay/YahooQA_Splits) written out as one TSV per
    split, `{train,dev,test}.tsv` (or `.txt`, plain or .gz): `question<TAB>answer<TAB>label`, no header, a
    question's five candidates (one positive, four Lucene negatives) on consecutive lines. The authors ship
    the splits as a Python pickle; unpickling runs code, so this reader takes the text form only. Questions are
    grouped by their text within a split, ids `SPLIT-N` in order of appearance. `clean` drops questions
    without a positive."""
    files = {}
    for split in ("train", "dev", "test"):
        for name in (f"{split}.tsv", f"{split}.txt"):
            found = _find(path, name) if os.path.isdir(path) else None
            if found:
                files[split] = found
                break
    if not files:
        raise FileNotFoundError(f"{path}: no YahooQA {{train,dev,test}}.tsv(.gz) (question<TAB>answer<TAB>label)")
    errors = _Errors(on_error)
    corpus = Corpus("yahooqa", {}, clean=clean)
    for split, file in files.items():
        rows, qids, answers_seen = [], {}, {}
        with _open_text(file) as f:
            for number, line in enumerate(f, start=1):
                where = f"{file}: line {number}"
                fields = line.rstrip("\r\n").split("\t")
                if fields == [""]:
                    continue
                if len(fields) != 3:
                    errors(where, f"{len(fields)} columns, expected 3 (question, answer, label)")
                    continue
                question, text, label = (x.strip() for x in fields)
                if label not in ("0", "1"):
                    errors(where, f"label {label!r} is not 0 or 1")
                    continue
                if not question or not text:
                    errors(where, "empty question or answer")
                    continue
                qid = qids.setdefault(question, f"{split}-{len(qids) + 1}")
                answers_seen[qid] = answers_seen.get(qid, 0) + 1
                rows.append({"qid": qid, "question": question, "aid": f"{qid}-{answers_seen[qid]}", "answer": text,
                             "label": int(label)})
        if clean:
            rows, corpus.dropped_by_filter[split] = _keep_clean(rows, drop_all_positive=False)
        corpus.splits[split] = _table(rows)
    corpus.skipped = errors.skipped
    return corpus


# ------------------------------------------------------------------------------------------ StackExchangeQA
def stackexchangeqa_found(path: str) -> dict:
    """What our own build wrote, checked without reading a row: pairs per split from the Parquet footers
    against `stats.json` (a difference means shards were lost or added after the build), questions from
    `stats.json`, and the pair totals beside the GSAMN paper's (628,706 positive, 9,874,758 negative)."""
    import json

    import pyarrow.parquet as pq

    from pipelines.schemas import parquet_files

    stats_path = os.path.join(path, "stats.json")
    stats = None
    if os.path.isfile(stats_path):
        with open(stats_path) as f:
            stats = json.load(f)
    sizes, differences = {}, []
    for split in ("train", "dev", "test"):
        if not os.path.isdir(os.path.join(path, split)):
            continue
        rows = sum(pq.ParquetFile(file).metadata.num_rows for file in parquet_files(os.path.join(path, split)))
        recorded = (stats or {}).get("splits", {}).get(split, {})
        sizes[split] = {"questions": recorded.get("questions"), "pairs": rows}
        if stats is not None and recorded.get("rows") != rows:
            differences.append(f"stackexchangeqa {split}: {rows:,} pairs in the shards, {recorded.get('rows')} in "
                               f"{stats_path}")
    found = {"sizes": sizes, "differences_from_build": differences, "stats": stats_path if stats else None}
    if stats:
        found["pairs"], found["paper"] = stats.get("pairs"), stats.get("paper")
    return found


READERS = {"wikiqa": read_wikiqa, "trecqa": read_trecqa, "semeval-ql": read_semeval,
           "insuranceqa": read_insuranceqa, "yahooqa": read_yahooqa}

"""The experiment plan's parts: the data steps, a row (a model on a data set with its options per profile, the
papers' figures quoted with their table) and a run of it, and where runs and data live. The rows themselves, the
comparisons the claims table makes and what is missing are in `experiments/rows.py`; the commands each run
executes, in `experiments/runner.py`."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("QA_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))
SEEDS = (0, 1, 2)


def say(message: str) -> None:
    print(f"[results] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ the data
@dataclass
class DataStep:
    """One preparation command; `done` is the file that exists once it has succeeded (each job writes its output
    atomically, so a folder's manifest appears last)."""

    key: str
    argv: list[str]
    done: str


def data_steps(out: str) -> list[DataStep]:
    d, s = os.path.join(out, "data"), SHARED_DATA
    # each tokenised folder is named by its step's key: rows name their data by it
    wikiqa, trecqa, seqa_raw, seqa, squad = (
        os.path.join(d, n) for n in ("wikiqa", "trecqa", "seqa-build", "seqa", "squad")
    )
    squad_input = os.path.join(d, "squad-input")  # links: train and dev files named as the SQuAD reader wants
    return [
        DataStep(
            "wikiqa",
            ["jobs/tokenize_corpora.py", "--dataset", "wikiqa", "--input", f"{s}/wikiqa", "--output", wikiqa],
            f"{wikiqa}/manifest.json",
        ),
        DataStep(
            "wikiqa-vectors",
            ["jobs/word_vectors.py", "--data", wikiqa, "--dim", "300", "--epochs", "10"],
            f"{wikiqa}/embeddings.npy",
        ),
        # static vectors distilled from MiniLM (pre-trained on a large corpus, as GloVe and word2vec are): the
        # evidence rows on why the word-vector models fall short of their papers read them
        DataStep(
            "wikiqa-minilm-vectors",
            [
                "jobs/word_vectors.py",
                "--data",
                wikiqa,
                "--from-encoder",
                "minilm",
                "--output",
                f"{wikiqa}/minilm-vectors.npy",
            ],
            f"{wikiqa}/minilm-vectors.npy",
        ),
        DataStep(
            "trecqa",
            [
                "jobs/tokenize_corpora.py",
                "--dataset",
                "trecqa",
                "--input",
                f"{s}/trecqa/jacana_xml",
                "--output",
                trecqa,
            ],
            f"{trecqa}/manifest.json",
        ),
        DataStep(
            "trecqa-vectors",
            ["jobs/word_vectors.py", "--data", trecqa, "--dim", "300", "--epochs", "10"],
            f"{trecqa}/embeddings.npy",
        ),
        DataStep(
            "seqa-build",
            [
                "jobs/build_stackexchangeqa.py",
                "--dump",
                f"{s}/stackexchange_dump_beer/Posts.xml.gz",
                "--output",
                seqa_raw,
                "--negatives",
                "4",
                "--exclude-overlap",
                f"wikiqa={s}/wikiqa",
            ],
            f"{seqa_raw}/stats.json",
        ),
        DataStep(
            "seqa",
            ["jobs/tokenize_corpora.py", "--dataset", "stackexchangeqa", "--input", seqa_raw, "--output", seqa],
            f"{seqa}/manifest.json",
        ),
        *transfer_steps(d, s),
        DataStep(
            "squad",
            ["jobs/tokenize_corpora.py", "--dataset", "squad", "--input", squad_input, "--output", squad],
            f"{squad}/manifest.json",
        ),
        DataStep(
            "squad-vectors",
            ["jobs/word_vectors.py", "--data", squad, "--dim", "300", "--epochs", "5"],
            f"{squad}/embeddings.npy",
        ),
    ]


# The transfer curve's corpora (GSAMN's StackExchangeQA at the paper's 15.71 negatives a positive, decontaminated
# against WikiQA): beer alone, beer and the three largest of the ten other dumps, all eleven; and all eleven with
# negatives mined by the shipped MiniLM in place of random ones (issue #39). Site names as the dumps' hosts.
TRANSFER_SITES = {
    "seqa1": ["beer"],
    "seqa4": ["beer", "atheism", "quantumcomputing", "cardano"],
    "seqa11": [
        "beer",
        "ai",
        "atheism",
        "cardano",
        "economics",
        "firearms",
        "gadgets",
        "htw",
        "matheducators",
        "quantumcomputing",
        "stackoverflow",
    ],
}
PAPER_NEGATIVES = "15.71"


def site_dump(site: str, shared: str) -> str:
    """`--dump HOST=PATH` for a site of ../shared/data: beer's own folder, or one of stackexchange_dumps/."""
    if site == "beer":
        return f"beer.stackexchange.com={shared}/stackexchange_dump_beer/Posts.xml.gz"
    host = "stackoverflow.com" if site == "stackoverflow" else f"{site}.stackexchange.com"
    return f"{host}={shared}/stackexchange_dumps/{site}/Posts.xml.gz"


def transfer_steps(d: str, s: str) -> list[DataStep]:
    """A build and its tokenisation for each corpus of the transfer curve (`KEY-build`, then `KEY`)."""
    corpora: list[tuple[str, list[str], list[str]]] = [(key, sites, []) for key, sites in TRANSFER_SITES.items()]
    corpora.append(("seqa11-mined", TRANSFER_SITES["seqa11"], ["--hard-negatives", "minilm"]))
    steps = []
    for key, sites, extra in corpora:
        raw, tokenised = os.path.join(d, f"{key}-build"), os.path.join(d, key)
        dumps = [a for site in sites for a in ("--dump", site_dump(site, s))]
        build = ["jobs/build_stackexchangeqa.py", *dumps, "--output", raw, "--negatives", PAPER_NEGATIVES]
        build += ["--exclude-overlap", f"wikiqa={s}/wikiqa", *extra]
        steps.append(DataStep(f"{key}-build", build, f"{raw}/stats.json"))
        tokenise = ["jobs/tokenize_corpora.py", "--dataset", "stackexchangeqa", "--input", raw, "--output", tokenised]
        steps.append(DataStep(key, tokenise, f"{tokenised}/manifest.json"))
    return steps


def link_squad(out: str) -> None:
    """SQuAD's train set is not here; the official dev set is, as two halves split by article. Train on one half
    (24 articles, 5,609 questions) and evaluate on the first article of the other (Super_Bowl_50, 810 questions):
    no article is in both."""
    folder = os.path.join(out, "data", "squad-input")
    os.makedirs(folder, exist_ok=True)
    for name, source in (
        ("train-v1.1.json.gz", "dev-v1.1.du-split-test-half.json.gz"),
        ("dev-v1.1.json", "dev-v1.1.first1article.json"),
    ):
        link = os.path.join(folder, name)
        if not os.path.islink(link):
            os.symlink(os.path.join(SHARED_DATA, "squad_sample", source), link)


# ------------------------------------------------------------------------------------------------- the plan
@dataclass(eq=False)  # rows compare and hash by identity: each is one line of the plan
class Row:
    """One line of the report: a model on a data set, trained and evaluated once per seed."""

    id: str
    section: str
    label: str
    data: str  # a DataStep key
    model: str | None  # None: the zero-shot bi-encoder
    options: list[str] = field(default_factory=list)
    paper: dict = field(default_factory=dict)  # metric -> the paper's figure
    source: str = ""  # where the paper's figure is
    gpu: str = ""  # what the paper's scale needs, where this machine's budget falls short
    # a row id whose run of the same seed this row fine-tunes: each seed its own pretraining, so that a row's
    # spread over seeds holds the pretraining's as well as the fine-tuning's (the source row has the same seeds)
    init_from: str | None = None
    seeds: tuple = SEEDS
    split: str = "test"
    extra: str = ""  # why the row is left out of the hour's plan (it runs with --only or --all)
    full: list[str] | None = None  # the options of the full profile (None: the row is not in it)
    in_hour: bool = True  # False: a row of the full profile only
    full_seeds: tuple = SEEDS
    revision: int = 0  # raised when what the row's commands do changes without the commands changing
    needs: tuple = ()  # data steps beyond its data set and that set's vectors
    full_extra: str = ""  # why the row is left out of the full profile's plan (it runs with --only or --all)
    # The paper's figures a claim's difference is taken from where they are not `paper`'s: DynSAN's ablations are
    # on SearchQA, while its row beside them is compared with the paper's SQuAD result.
    claim_paper: dict | None = None

    def seeds_of(self, profile: str, seeds: tuple = SEEDS) -> tuple:
        """The seeds of this row in `profile`; multi-seed rows take the invocation's --seeds."""
        own = self.full_seeds if profile == "full" else self.seeds
        return own if len(own) == 1 else seeds

    def options_of(self, profile: str) -> list[str]:
        return (self.full or []) if profile == "full" else self.options


@dataclass(frozen=True)
class Run:
    """One row trained (or scored) once: its seed and profile, and the name of its run folder and ledger entry."""

    row: Row
    seed: int
    profile: str = "hour"

    @property
    def name(self) -> str:
        return run_name(self.row, self.seed, self.profile)


def runs_of(rows: list[Row], profile: str, seeds: tuple = SEEDS) -> list[Run]:
    """The runs of `rows` in `profile`: each row at its seeds (multi-seed rows at `seeds`), row by row."""
    return [Run(row, seed, profile) for row in rows for seed in row.seeds_of(profile, seeds)]


# ------------------------------------------------------------------------------------------------ where runs live
def run_name(row: Row, seed: int, profile: str = "hour") -> str:
    """The run folder and ledger key: the hour's runs as they always were named, the full profile's prefixed."""
    return ("full-" if profile == "full" else "") + f"{row.id.replace('/', '-')}-seed{seed}"


def data_folder(out: str, key: str) -> str:
    return os.path.join(out, "data", key)


def shown(argv: list[str]) -> str:
    return "python " + " ".join(shlex.quote(a) for a in argv)

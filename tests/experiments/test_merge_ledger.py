"""experiments/merge_ledger.py: runs made in another clone or on another machine join the committed ledger, each
taken only where it is newer than the record here, and with its per-question figures."""

import json
import os
import subprocess

import pytest

from experiments import merge_ledger
from experiments.ledger import Ledger


def _git(repo, *args) -> str:
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def history(tmp_path):
    """A repository with two commits in a line and one beside them: (older, newer, sibling)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    commits = []
    for name in ("older", "newer"):
        (repo / name).write_text(name)
        _git(repo, "add", name)
        _git(repo, "commit", "-q", "-m", name)
        commits.append(_git(repo, "rev-parse", "--short=7", "HEAD"))
    _git(repo, "checkout", "-q", "-b", "side", "HEAD~1")
    (repo / "side").write_text("side")
    _git(repo, "add", "side")
    _git(repo, "commit", "-q", "-m", "side")
    commits.append(_git(repo, "rev-parse", "--short=7", "HEAD"))
    return str(repo), *commits


def _run(commit: str, map_: float, finished: str = "2026-11-28", **more) -> dict:
    return {"row": "wikiqa/ctrn", "seed": 0, "test": {"map": map_}, "commit": commit, "finished": finished, **more}


def test_a_record_is_taken_only_where_it_is_newer_than_the_one_here(history, tmp_path, capsys):
    repo, older, newer, sibling = history
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    here, there = Ledger(str(tmp_path / "here" / "ledger.json")), Ledger(str(tmp_path / "there" / "ledger.json"))
    cases = {  # key: (the record here, the record there, taken)
        "new-run": (None, _run(older, 0.5), True),
        "later-commit": (_run(older, 0.5), _run(newer, 0.6), True),
        "earlier-commit": (_run(newer, 0.6), _run(older, 0.5), False),
        "beside-it": (_run(newer, 0.6), _run(sibling, 0.7), False),
        "dirty-there": (None, _run(f"{newer}-dirty", 0.6), False),
        "dirty-here": (_run(f"{older}-dirty", 0.5), _run(older, 0.6), True),
        "unknown-commit": (None, _run("0123abc", 0.6), False),
        "re-ran-it": (
            _run(older, 0.5),
            _run(older, 0.52, "2026-11-29", replaces={"commit": older, "finished": "2026-11-28"}),
            True,
        ),
        "same-commit-other-figure": (_run(older, 0.5), _run(older, 0.52, "2026-11-29"), False),
        "the-same": (_run(older, 0.5), _run(older, 0.5), False),
        "replaced:cut-off": (None, _run(older, 0.4), False),
        "data:wikiqa": (None, {"command": "python jobs/tokenize_corpora.py ...", "seconds": 3.0}, True),
        "data:trecqa": ({"command": "python ...", "seconds": 2.0}, {"command": "python ...", "seconds": 4.0}, False),
    }
    for key, (ours, theirs, _) in cases.items():
        if ours is not None:
            here.add(key, ours)
        there.add(key, theirs)
    there.add(
        "new-run", dict(there.records["new-run"], per_question={"metric": "ap", "values": {"Q1": 0.5, "Q2": 1.0}})
    )
    before = json.dumps(Ledger(here.path).records, sort_keys=True)
    merge_ledger.merge(Ledger(there.path), Ledger(here.path), dry_run=True, repo=repo)
    assert json.dumps(Ledger(here.path).records, sort_keys=True) == before  # a dry run writes nothing
    done = merge_ledger.merge(Ledger(there.path), Ledger(here.path), repo=repo)
    assert sorted(done["taken"]) == sorted(key for key, (_, _, taken) in cases.items() if taken)
    merged = Ledger(here.path).records
    for key, (ours, _, taken) in cases.items():
        assert merged.get(key) == (Ledger(there.path).records[key] if taken else ours), key
    assert merged["new-run"]["per_question"]["values"] == {"Q1": 0.5, "Q2": 1.0}  # its questions' file came along
    assert os.path.exists(tmp_path / "here" / "ledger-questions" / "new-run.json")
    out = capsys.readouterr().out
    assert f"taken: later-commit: from a later commit than the record here ({older}); map 0.5000 -> map 0.6000" in out
    assert "left: unknown-commit: its commit 0123abc is not in this repository: fetch it first" in out
    assert f"left: dirty-there: from uncommitted code ({newer}-dirty)" in out
    assert "the-same" not in out
    assert merge_ledger.merge(Ledger(there.path), Ledger(here.path), repo=repo).get("taken") is None  # idempotent


def test_another_json_object_is_refused_before_it_is_merged_into_the_ledger(tmp_path, capsys):
    """A build's stats.json (a JSON object, so it once read as a ledger) was merged in whole: its `posts_in`
    and `splits` became entries of the committed ledger. Every entry of a ledger is a record."""
    ledger = tmp_path / "ledger.json"
    Ledger(str(ledger)).add("data:wikiqa", {"command": "python ...", "seconds": 1.0})
    before = ledger.read_bytes()
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"posts_in": 1200, "splits": {"train": {"questions": 465}}}))
    with pytest.raises(SystemExit) as refused:
        merge_ledger.main([str(stats), "--ledger", str(ledger)])
    message = f"{stats}: not a run ledger: entry 'posts_in' is a JSON number, not a record"
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert ledger.read_bytes() == before
    stats.write_text(json.dumps([{"posts_in": 1200}]))
    with pytest.raises(ValueError, match="not a run ledger: a JSON array, not an object of records"):
        Ledger(str(stats))


def test_the_command_refuses_a_missing_ledger_a_file_that_is_none_and_merging_a_ledger_into_itself(tmp_path, capsys):
    ledger = tmp_path / "ledger.json"
    Ledger(str(ledger)).add("data:wikiqa", {"command": "python ...", "seconds": 1.0})
    report = tmp_path / "results.md"
    report.write_text("# Results: our figures beside the papers'\n")
    for argv, message in (
        ([str(tmp_path / "nowhere.json"), "--ledger", str(ledger)], "nowhere.json: no such ledger"),
        ([str(ledger), "--ledger", str(ledger)], "is the ledger merged into"),
        ([str(report), "--ledger", str(ledger)], f"{report}: not a run ledger: not JSON"),  # the page, say
        ([str(ledger), "--ledger", str(report)], f"{report}: not a run ledger: not JSON"),
    ):
        with pytest.raises(SystemExit) as refused:
            merge_ledger.main(argv)
        assert refused.value.code == 2 and message in capsys.readouterr().err

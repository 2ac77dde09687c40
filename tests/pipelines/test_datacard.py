"""The data card and the build's console summary from a build's stats (no Ray)."""

from __future__ import annotations

import pytest

from jobs.build_stackexchangeqa import summary
from pipelines.datacard import card_json, card_markdown


def _stats(short: int, drawn: str = "random") -> dict:
    """A build's stats.json as the eleven-site build wrote it (its figures), with `short` negatives short."""
    part = {"in": 10, "kept": 10, "dropped": {}}
    return {
        "posts_in": 17_365,
        "fetch_failures": 0,
        "questions": part,
        "answers": part,
        "other_posts": {"in": 0, "kept": 0, "dropped": {}},
        "pairs": {
            "positive": 7_032,
            "negative": 110_268,
            "total": 117_300,
            "negatives_per_positive": 15.68,
            "negatives_short": short,
        },
        "paper": {"positive_pairs": 628_706, "negative_pairs": 9_874_758, "negatives_per_positive": 15.71},
        "splits": {"train": {"questions": 2_854, "rows": 93_808, "positive": 5_607, "negative": 88_201, "shards": 1}},
        "negatives": {"drawn": drawn, "pool": "site", "seed": 13},
        "config": {"negatives": 15.71, "negative_pool": "site"},
        "seconds": 17.5,
    }


@pytest.mark.parametrize("drawn", ["random", "mined"])
def test_fewer_negatives_than_asked_are_counted_and_explained(drawn):
    """The summary said "15.68 per positive; paper 15.71" of a build asked for 15.71, and nowhere why."""
    said = summary(_stats(326, drawn))
    why = "326 negatives short of 15.71 per positive: a question draws from its site's answers in its split"
    assert why in said
    assert ("false-negative guard" in said) is (drawn == "mined")
    card = card_json(_stats(326, drawn))
    assert card["shortfall"]["negatives"] == 326 and card["shortfall"]["why"].startswith(why)
    assert ("false-negative guard" in card["shortfall"]["why"]) is (drawn == "mined")
    if drawn == "random":  # a mined build's card also reads the miner's figures, which these stats lack
        assert why in card_markdown(card)


def test_a_build_with_every_negative_asked_says_nothing_of_a_shortfall():
    card = card_json(_stats(0))
    assert card["shortfall"] is None
    assert "short of" not in summary(_stats(0)) and "short of" not in card_markdown(card)

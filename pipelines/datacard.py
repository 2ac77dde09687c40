"""The StackExchangeQA data card: what went in, what every filter took out and why, what came out, how it
compares with the paper, and the licence terms. Written as `DATA_CARD.md`, `data_card.json` and a funnel plot
`funnel.png` beside the shards.
"""

from __future__ import annotations

import itertools
import json
import os
from datetime import UTC, datetime

LENGTH_BINS = (0, 10, 20, 50, 100, 200, 500, 1000, 2000)


def length_histogram(lengths) -> dict[str, int]:
    """Counts per word-length bin: {"0-9": n, ..., "2000+": n}."""
    import numpy as np

    lengths = np.asarray(list(lengths), dtype=np.int64)
    edges = list(LENGTH_BINS) + [np.iinfo(np.int64).max]
    counts, _ = np.histogram(lengths, bins=edges)
    labels = [f"{lo}-{hi - 1}" for lo, hi in itertools.pairwise(LENGTH_BINS)] + [f"{LENGTH_BINS[-1]}+"]
    return dict(zip(labels, (int(c) for c in counts)))


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in row) + " |")
    return "\n".join(lines)


def card_json(stats: dict) -> dict:
    pairs, paper = stats["pairs"], stats["paper"]
    negatives = stats.get("negatives", {})
    return {
        "name": "StackExchangeQA",
        "built": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recipe": "GSAMN paper (Lai et al. 2019), section 3: English only, answers with score >= min_score are "
        "positives, real answers to other questions "
        + ("mined by a model as negatives" if negatives.get("drawn") == "mined" else "sampled as negatives"),
        "negatives": negatives,
        "shortfall": _shortfall(stats),
        "ours_vs_paper": {
            "positive_pairs": [pairs["positive"], paper["positive_pairs"]],
            "negative_pairs": [pairs["negative"], paper["negative_pairs"]],
            "negatives_per_positive": [pairs["negatives_per_positive"], paper["negatives_per_positive"]],
        },
        "funnel": {k: stats[k] for k in ("posts_in", "fetch_failures", "questions", "answers", "other_posts")},
        "language_decided_by": stats.get("language_decided_by", {}),
        "test_set_overlap": stats.get("test_set_overlap", {}),
        "per_site": stats.get("per_site", {}),
        "splits": stats["splits"],
        "label_balance": {
            "positive": pairs["positive"],
            "negative": pairs["negative"],
            "positive_share": round(pairs["positive"] / pairs["total"], 4) if pairs["total"] else 0.0,
        },
        "lengths_in_words": stats.get("lengths", {}),
        "licences": stats.get("licences", {}),
        "attribution": stats.get("attribution", {}),
        "config": stats.get("config", {}),
        "drop_reasons": stats.get("drop_reasons", {}),
    }


def _shortfall(stats: dict) -> dict | None:
    """How many negatives fewer than asked the build has, and why; None where it has them all."""
    from pipelines.negatives import shortfall_text

    short, config = stats["pairs"].get("negatives_short"), stats.get("config", {})
    if not short or "negatives" not in config:
        return None
    mined = stats.get("negatives", {}).get("drawn") == "mined"
    why = shortfall_text(short, config["negatives"], config.get("negative_pool", "site"), mined)
    return {"negatives": short, "why": why}


def card_markdown(card: dict) -> str:
    paper = card["ours_vs_paper"]
    funnel = card["funnel"]
    out = [
        "# StackExchangeQA data card",
        "",
        f"Built {card['built']}. Recipe: {card['recipe']}.",
        "",
        "## Ours beside the paper",
        "",
        _table(
            ["", "this build", "GSAMN paper"],
            [
                ["positive pairs", paper["positive_pairs"][0], paper["positive_pairs"][1]],
                ["negative pairs", paper["negative_pairs"][0], paper["negative_pairs"][1]],
                ["negatives per positive", paper["negatives_per_positive"][0], paper["negatives_per_positive"][1]],
            ],
        ),
        "",
        "The paper crawled every Stack Exchange site; a build from a few sites is proportionally smaller."
        + (f" {card['shortfall']['why']}." if card.get("shortfall") else ""),
        "",
        "## Funnel",
        "",
        f"Posts read: {funnel['posts_in']:,}"
        + (
            f"; URLs that failed: {funnel['fetch_failures']:,} (listed in `failures.jsonl`)"
            if funnel.get("fetch_failures")
            else ""
        ),
        "",
    ]
    rows = []
    for section in ("questions", "answers", "other_posts"):
        part = funnel[section]
        rows.append([section, part["in"], "", ""])
        for reason, n in part["dropped"].items():
            rows.append(["", "", reason, n])
        rows.append(["", "", "**kept**", part["kept"]])
    out += [_table(["posts", "in", "filter", "count"], rows), ""]
    reasons = card.get("drop_reasons", {})
    used = {r for section in ("questions", "answers", "other_posts") for r in funnel[section]["dropped"]}
    if used:
        out += ["Filters:", ""] + [f"- `{k}`: {v}" for k, v in reasons.items() if k in used] + [""]
    if card["language_decided_by"]:
        out += [
            "Language decided by: "
            + ", ".join(f"{k} {v:,}" for k, v in card["language_decided_by"].items())
            + f" (fastText first{_on_chars(card)}, langdetect on the whole text where fastText is unsure).",
            "",
        ]
    if card["test_set_overlap"]:
        out += [
            "## Overlap with evaluation test sets (removed)",
            "",
            _table(
                ["test set", "questions", "answers"],
                [[k, v["question"], v["answer"]] for k, v in card["test_set_overlap"].items()],
            ),
            "",
        ]
    out += [
        "## Splits",
        "",
        _table(
            ["split", "questions", "rows", "positive", "negative", "shards"],
            [
                [k, v["questions"], v["rows"], v["positive"], v["negative"], v.get("shards", "")]
                for k, v in card["splits"].items()
            ],
        ),
        "",
        f"Label balance: {card['label_balance']['positive_share']:.1%} positive.",
        "",
    ]
    out += negatives_section(card.get("negatives") or {})
    if card["per_site"]:
        out += [
            "## Per site",
            "",
            _table(
                ["site", "questions", "kept", "answers", "positives"],
                [
                    [k, v["questions"], v["questions_kept"], v["answers"], v["positives"]]
                    for k, v in card["per_site"].items()
                ],
            ),
            "",
        ]
    lengths = card["lengths_in_words"]
    if lengths:
        bins = list(next(iter(lengths.values())).keys())
        out += [
            "## Lengths (words, kept questions and positive answers)",
            "",
            _table(["words"] + list(lengths), [[b] + [lengths[k][b] for k in lengths] for b in bins]),
            "",
        ]
    licences = card["licences"]
    out += [
        "## Licence and attribution",
        "",
        "All text is user contributions to Stack Exchange sites, licensed under Creative Commons "
        "Attribution-ShareAlike (the version depends on the post date; counts below). Anything built from "
        "this data must be shared under the same licence and must attribute the authors: link each post and "
        "name its author with a link to their profile. `attribution/*.parquet` has one row per post whose "
        "text can appear in the shards (`id` is the pairs' `qid`/`aid`): its URL (`https://SITE/q/ID`, "
        "`https://SITE/a/ID`), author name and id, profile URL and licence. Dumps name only deleted users "
        "(the others are ids, whose names are in the dump's Users.xml); the API and pages give names. "
        "See https://stackoverflow.com/help/licensing.",
        "",
    ]
    attribution = card.get("attribution") or {}
    if attribution:
        out += [
            f"Attribution rows: {attribution['posts']:,}; without a named or identified author (deleted "
            f"users, community wikis): {attribution['without_author']:,}.",
            "",
        ]
    if licences:
        out += [_table(["licence", "posts kept"], [[k, v] for k, v in licences.items()]), ""]
    cfg = card["config"]
    if cfg:
        shown = {k: v for k, v in cfg.items() if k not in ("urls",)}
        out += ["## Configuration", "", "```json", json.dumps(shown, indent=2, sort_keys=True, default=str), "```", ""]
    return "\n".join(out)


def negatives_section(negatives: dict) -> list[str]:
    """How the negatives were drawn, and for mined ones the miner's scores of them beside its scores of the
    positives and of a random candidate."""
    if not negatives:
        return []
    pool = {
        "site": "the same site and split",
        "any": "any site of the same split",
        "tag": "the same site, tag and split",
    }
    where = pool.get(negatives.get("pool", "site"), negatives.get("pool", ""))
    if negatives.get("drawn") != "mined":
        return [
            "## Negatives",
            "",
            f"Drawn at random (seed {negatives.get('seed')}) from the answers of other questions of {where}; a "
            "question never gets one of its own answers.",
            "",
        ]
    reranked = negatives.get("reranker")
    miner = (
        f"the retriever `{negatives['retriever']}` ranks every candidate by cosine; the checkpoint "
        f"`{reranked}` re-ranks its top {negatives['candidates']}"
        if reranked
        else f"the sentence encoder `{negatives['retriever']}` ranks every candidate by cosine with the question"
    )
    scores = negatives.get("scores", {})
    names = {
        "negative": "mined negatives",
        "positive": "positives",
        "candidate_mean": "mean over a question's candidates (cosine: what a random negative scores)",
    }
    columns = ["count", "mean", "p0", "p10", "p25", "p50", "p75", "p90", "p100"]
    rows = [[names[k]] + [scores[k].get(c, "") for c in columns] for k in names if k in scores]
    return [
        "## Negatives",
        "",
        f"Mined by a model (`--hard-negatives`, pipelines/hard_negatives.py): for each question, {miner}; the "
        f"candidates are the answers of other questions of {where}, never the question's own answers of any "
        f"score; a candidate whose cosine with one of the question's positives reaches "
        f"{negatives['max_similarity']} is passed over as a likely false negative "
        f"({negatives.get('near_duplicates_passed_over', 0):,} passed over for "
        f"{negatives.get('questions', 0):,} questions); each question takes as many as random sampling would give "
        f"it (seed {negatives.get('seed')}), the top-ranked. Scores: {negatives.get('scored_by', '')}.",
        "",
        _table(["scores of", *columns], rows),
        "",
    ]


def funnel_plot(card: dict, path: str) -> None:
    """Horizontal bars: posts in, then what each filter removed, then what was kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, colours = [], [], []
    for section, colour in (("questions", "#4c72b0"), ("answers", "#55a868")):
        part = card["funnel"][section]
        labels.append(f"{section} in")
        values.append(part["in"])
        colours.append(colour)
        for reason, n in sorted(part["dropped"].items(), key=lambda kv: -kv[1]):
            labels.append(f"  - {reason}")
            values.append(n)
            colours.append("#c44e52")
        labels.append(f"{section} kept")
        values.append(part["kept"])
        colours.append(colour)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1))
    ax.barh(range(len(labels)), values, color=colours)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,}", va="center", fontsize=7)
    ax.set_xlabel("posts")
    ax.set_title("StackExchangeQA funnel")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_card(stats: dict, folder: str) -> dict:
    card = card_json(stats)
    with open(os.path.join(folder, "data_card.json"), "w") as f:
        json.dump(card, f, indent=2, sort_keys=True, default=str)
    with open(os.path.join(folder, "DATA_CARD.md"), "w") as f:
        f.write(card_markdown(card))
    funnel_plot(card, os.path.join(folder, "funnel.png"))
    return card


def _on_chars(card: dict) -> str:
    chars = card.get("config", {}).get("language_chars")
    return f", on each text's first {chars:,} characters" if chars else ", on the whole text"

"""What the build counts as it goes: every post once by status, site, language model, overlap, licence and
length (the funnel of stats.json and the data card), and the rows the sampler and the attribution files read."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.blocks import trim_when_idle
from pipelines.datacard import LENGTH_BINS, length_histogram
from pipelines.negatives import pool_groups
from pipelines.stackexchangeqa.config import DROP_REASONS, KEPT_QUESTION, NEGATIVE_COLUMNS, NEGATIVE_POOL, POSITIVE

WORD_COUNT_ROWS = 2048


def word_counts(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """`len(text.split())` for every text (0 for a null): the non-empty pieces of Arrow's `utf8_split_whitespace`,
    which splits at every character of Python's whitespace and at no other (tested over all of Unicode's) but
    gives empty pieces at the ends and within some runs of mixed whitespace. `WORD_COUNT_ROWS` texts at a time, so
    that the pieces never hold more than a slice's words (over a whole block they held every word of it in the
    funnel's heap); a regular expression that counted the words in place took 2.7 times as long."""
    counts = [np.zeros(0, dtype=np.int64)]
    for start in range(0, len(texts), WORD_COUNT_ROWS):
        piece = texts.slice(start, WORD_COUNT_ROWS)
        for chunk in piece.chunks if isinstance(piece, pa.ChunkedArray) else [piece]:
            pieces = pc.utf8_split_whitespace(chunk)
            offsets = pieces.offsets.to_numpy()  # nulls have no pieces
            words = np.concatenate([[0], np.cumsum(pc.binary_length(pieces.values).to_numpy() > 0)])
            counts.append(words[offsets[1:]] - words[offsets[:-1]])
    return np.concatenate(counts)


LENGTH_LABELS = list(length_histogram([]).keys())


def count_threads(batch: pa.Table, pool_mode: str = "site") -> pa.Table:
    """Every count the funnel, the data card and the negative sampler (answers per pool group under `pool_mode`)
    need from one batch of thread rows, as one JSON row: the funnel is then one pass over the data with no
    shuffle (a groupby per figure costs seconds each). Counted with Arrow's group-bys, not row by row."""
    trim_when_idle()
    counts: dict[str, int] = {}

    def add_counts(prefix: str, table: pa.Table, keys: list[str]) -> None:
        if table.num_rows == 0:
            return
        grouped = table.group_by(keys, use_threads=False).aggregate([([], "count_all")])
        for *values, n in zip(*(grouped[k].to_pylist() for k in keys), grouped["count_all"].to_pylist()):
            key = "\x1f".join([prefix, *values])
            counts[key] = counts.get(key, 0) + n

    # Columns are filtered one at a time, never the whole batch: a filtered batch copies every text in it.
    add_counts("status", batch, ["site", "role", "status"])
    lang_by = batch["lang_by"]
    decided = pc.filter(lang_by, pc.not_equal(lang_by, "none"))
    add_counts("lang", pa.table({"by": pc.if_else(pc.equal(decided, ""), "no_text", decided)}), ["by"])
    overlaps = pc.ends_with(batch["status"], "overlaps_test_set")
    details, roles = pc.filter(batch["detail"], overlaps).to_pylist(), pc.filter(batch["role"], overlaps).to_pylist()
    for detail, role in zip(details, roles):
        for name in (detail or "").split(","):
            key = f"overlap\x1f{name}\x1f{role}"
            counts[key] = counts.get(key, 0) + 1
    status = batch["status"]
    kept = pc.is_in(status, pa.array([KEPT_QUESTION, POSITIVE]))
    licence = pc.fill_null(pc.filter(batch["licence"], kept), "")
    add_counts("licence", pa.table({"licence": pc.if_else(pc.equal(licence, ""), "unknown", licence)}), ["licence"])
    kept_question, positive = pc.equal(status, KEPT_QUESTION), pc.equal(status, POSITIVE)
    for role, rows, texts in (("question", kept_question, "question"), ("answer", positive, "answer")):
        bins = np.digitize(word_counts(pc.filter(batch[texts], rows)), LENGTH_BINS[1:])  # index into LENGTH_LABELS
        add_counts(
            "length",
            pa.table(
                {
                    "role": pa.array([role] * len(bins), pa.string()),
                    "bin": pa.array(np.asarray(LENGTH_LABELS)[bins], pa.string()),
                }
            ),
            ["role", "bin"],
        )
    add_counts("questions", pa.table({"split": pc.filter(batch["split"], kept_question)}), ["split"])
    attributed = pc.is_in(status, pa.array([KEPT_QUESTION, *NEGATIVE_POOL]))  # the rows of `attribution_rows`
    unnamed = pc.and_(pc.equal(pc.fill_null(batch["author"], ""), ""), pc.is_null(batch["author_id"]))
    add_counts(
        "attribution", pa.table({"author": pc.if_else(pc.filter(unnamed, attributed), "without", "named")}), ["author"]
    )
    in_pool = pc.is_in(status, pa.array(list(NEGATIVE_POOL)))
    pool = batch.select(["split", "site", "tags"] if pool_mode == "tag" else ["split", "site"]).filter(in_pool)
    add_counts("pool", pa.table({"group": pool_groups(pool, pool_mode)[0]}), ["group"])
    failed = pc.equal(status, "fetch_failed")
    failures = [
        {"url": url, "reason": reason}
        for url, reason in zip(
            pc.filter(batch["origin"], failed).to_pylist(), pc.filter(batch["detail"], failed).to_pylist()
        )
    ]
    return pa.table({"counts": [json.dumps(counts)], "failures": [json.dumps(failures)]})


def summarise_threads(block: pa.Table, pool_mode: str) -> tuple[pa.Table, pa.Table]:
    """A block of thread rows' counts (`count_threads`) and attribution rows, from one read of the block."""
    attribution = attribution_rows(
        rows_with_status(
            block,
            statuses=[KEPT_QUESTION, *NEGATIVE_POOL],
            columns=["role", "status", "qid", "aid", "site", "author", "author_id", "licence"],
        )
    )
    return count_threads(block, pool_mode), attribution


def funnel(counts: list[pa.Table]) -> dict:
    """Posts by role and status (every post once), per site, by language model, test-set overlap, licence,
    length and split, the fetch failures (`failures`: URL and reason), answers per negative-pool group
    (`pool_groups`), and the attribution rows with and without a named author, from `count_threads`' rows."""
    totals: dict[str, int] = {}
    failures: list[dict] = []
    for row in (row for table in counts for row in table.to_pylist()):
        for key, n in json.loads(row["counts"]).items():
            totals[key] = totals.get(key, 0) + n
        failures += json.loads(row["failures"])
    by_status: dict[tuple[str, str], int] = {}
    per_site: dict[str, dict[str, int]] = {}
    lang: dict[str, int] = {}
    overlap: dict[str, dict[str, int]] = {}
    licences: dict[str, int] = {}
    questions_per_split: dict[str, int] = {}
    pool_groups: dict[str, int] = {}
    attribution: dict[str, int] = {}
    lengths = {role: dict.fromkeys(LENGTH_LABELS, 0) for role in ("question", "answer")}
    for key, n in sorted(totals.items()):
        kind, *parts = key.split("\x1f")
        if kind == "status":
            site, role, status = parts
            by_status[(role, status)] = by_status.get((role, status), 0) + n
            if role in ("question", "answer"):
                entry = per_site.setdefault(site, {"questions": 0, "questions_kept": 0, "answers": 0, "positives": 0})
                entry[role + "s"] += n
                entry["questions_kept"] += n if (role, status) == ("question", KEPT_QUESTION) else 0
                entry["positives"] += n if (role, status) == ("answer", POSITIVE) else 0
        elif kind == "lang":
            lang[parts[0]] = n
        elif kind == "overlap":
            overlap.setdefault(parts[0], {"question": 0, "answer": 0})[parts[1]] += n
        elif kind == "licence":
            licences[parts[0]] = n
        elif kind == "length":
            lengths[parts[0]][parts[1]] = n
        elif kind == "questions":
            questions_per_split[parts[0]] = n
        elif kind == "pool":
            pool_groups[parts[0]] = n
        elif kind == "attribution":
            attribution[parts[0]] = n

    def section(role: str, kept: str | None) -> dict:
        total = sum(n for (r, _), n in by_status.items() if r == role)
        dropped = {s: n for (r, s), n in sorted(by_status.items()) if r == role and s != kept}
        return {"in": total, "dropped": dropped, "kept": by_status.get((role, kept), 0) if kept else 0}

    return {
        "posts_in": sum(n for (role, _), n in by_status.items() if role != "failure"),
        "fetch_failures": by_status.get(("failure", "fetch_failed"), 0),
        "questions": section("question", KEPT_QUESTION),
        "answers": section("answer", POSITIVE),
        "other_posts": section("other", None),
        "language_decided_by": lang,
        "test_set_overlap": overlap,
        "per_site": per_site,
        "lengths": lengths,
        "licences": licences,
        "questions_per_split": questions_per_split,
        "drop_reasons": DROP_REASONS,
        "failures": failures,
        "pool_groups": pool_groups,
        "attribution": {"posts": sum(attribution.values()), "without_author": attribution.get("without", 0)},
    }


def attribution_rows_of(counts: pa.Table) -> int:
    """The attribution rows of the block whose `count_threads` row this is."""
    totals = json.loads(counts["counts"][0].as_py())
    return totals.get("attribution\x1fnamed", 0) + totals.get("attribution\x1fwithout", 0)


# One row per post whose text can reach the shards (kept questions, and answers that are positives or
# negative candidates), with what CC BY-SA attribution needs: the post's link, its author and licence.
ATTRIBUTION = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # "<site>:<post id>", as `qid`/`aid` in the pairs
        pa.field("kind", pa.string(), nullable=False),  # question or answer
        pa.field("url", pa.string(), nullable=False),
        pa.field("author", pa.string(), nullable=False),  # display name; empty where the source gives none
        pa.field("author_id", pa.int64()),  # null: unknown, deleted user or community wiki; -1 "Community"
        pa.field("author_url", pa.string(), nullable=False),  # the profile page; empty without an author_id
        pa.field("licence", pa.string(), nullable=False),
    ]
)


def rows_with_status(batch: pa.Table, statuses: list[str], columns: list[str]) -> pa.Table:
    """`columns` of the thread rows whose status is one of `statuses`. One function rather than Ray Data's
    `select_columns` and `filter`: its optimiser runs a filter before a projection, and a filter copies every
    column it is given (the texts, where only ids were wanted)."""
    trim_when_idle()
    return batch.select(columns).filter(pc.is_in(batch["status"], pa.array(statuses, pa.string())))


def negative_candidates(batch: pa.Table) -> pa.Table:
    """Thread rows as the negative sampler's pool (answers with a status of NEGATIVE_POOL), the positives among
    them marked in `asks`: they ask for negatives and are candidates for other questions' alike."""
    pool = rows_with_status(batch, list(NEGATIVE_POOL), [*NEGATIVE_COLUMNS, "answer", "score", "status"])
    return pool.append_column("asks", pc.equal(pool["status"], POSITIVE)).drop_columns(["status"])


def attribution_rows(batch: pa.Table) -> pa.Table:
    """Thread rows (kept questions and pool answers) as ATTRIBUTION rows, column by column."""
    if batch.num_rows == 0:
        return ATTRIBUTION.empty_table()
    question = pc.equal(batch["role"], "question")
    post = pc.if_else(question, batch["qid"], batch["aid"])
    number = pc.struct_field(pc.extract_regex(post, r":(?P<number>[^:]*)$"), "number")
    url = pc.binary_join_element_wise("https://", batch["site"], "/", pc.if_else(question, "q", "a"), "/", number, "")
    author_id = batch["author_id"]
    profile = pc.binary_join_element_wise("https://", batch["site"], "/users/", pc.cast(author_id, pa.string()), "")
    return pa.table(
        {
            "id": post,
            "kind": batch["role"],
            "url": url,
            "author": pc.fill_null(batch["author"], ""),
            "author_id": author_id,
            "author_url": pc.fill_null(profile, ""),
            "licence": pc.fill_null(batch["licence"], ""),
        }
    ).cast(ATTRIBUTION)


_SIZES: dict[str, dict] = {}


def mining_candidates(batch: pa.Table, k: float, seed: int, mode: str, sizes_ref: list) -> pa.Table:
    """Thread rows (blocks of whole threads) as the hard-negative miner's rows (`pipelines.hard_negatives.MINING`):
    each pool answer in each of its pool groups, marked where it is a positive, and each kept question in the one
    group it draws from (`chosen_group`, as the random sampler chooses), asking for as many negatives as its
    positives would ask the random sampler for (`negatives_wanted`)."""
    import ray

    from pipelines.hard_negatives import MINING
    from pipelines.negatives import chosen_group, negatives_wanted

    trim_when_idle()
    sizes = sizes_ref[0]
    if isinstance(sizes, ray.ObjectRef):  # fetched once per worker process, not per block
        if sizes.hex() not in _SIZES:
            _SIZES.clear()
            _SIZES[sizes.hex()] = ray.get(sizes)
        sizes = _SIZES[sizes.hex()]
    columns = ["qid", "aid", "answer", "score", "site", "split", "tags", "status"]
    answers = rows_with_status(batch, list(NEGATIVE_POOL), columns)
    groups, rows = pool_groups(answers, mode)
    taken = answers.take(pa.array(rows, pa.int64())) if mode == "tag" else answers
    n = taken.num_rows
    answer_rows = pa.table(
        {
            "kind": pa.array(["answer"] * n, pa.string()),
            "group": groups,
            "qid": taken["qid"],
            "aid": taken["aid"],
            "text": taken["answer"],
            "score": taken["score"],
            "positive": pc.equal(taken["status"], POSITIVE),
            "wanted": pa.array(np.zeros(n, np.int64)),
            "site": taken["site"],
            "split": taken["split"],
        }
    ).cast(MINING)
    positives = answers.filter(pc.equal(answers["status"], POSITIVE))
    wanted: dict[str, int] = {}
    for qid, aid in zip(positives["qid"].to_pylist(), positives["aid"].to_pylist()):
        wanted[qid] = wanted.get(qid, 0) + negatives_wanted(k, seed, aid)
    questions = rows_with_status(batch, [KEPT_QUESTION], ["qid", "question", "site", "split", "tags"])
    qids = questions["qid"].to_pylist()
    asking = np.array([wanted.get(q, 0) > 0 for q in qids], dtype=bool)
    questions, qids = questions.filter(pa.array(asking)), [q for q, a in zip(qids, asking) if a]
    question_groups, parents = pool_groups(questions, mode)
    options: list[list[str]] = [[] for _ in qids]
    for group, row in zip(question_groups.to_pylist(), parents.tolist()):
        if sizes.get(group):
            options[row].append(group)
    m = len(qids)
    question_rows = pa.table(
        {
            "kind": pa.array(["question"] * m, pa.string()),
            "group": pa.array([chosen_group(o, seed, q) for o, q in zip(options, qids)], pa.string()),
            "qid": questions["qid"],
            "aid": pa.array([""] * m, pa.string()),
            "text": questions["question"],
            "score": pa.array(np.zeros(m, np.int32)),
            "positive": pa.array(np.zeros(m, bool)),
            "wanted": pa.array([wanted[q] for q in qids], pa.int64()),
            "site": questions["site"],
            "split": questions["split"],
        }
    ).cast(MINING)
    return pa.concat_tables([answer_rows, question_rows])

"""StackExchangeQA construction as Ray Data stages (GSAMN paper, Lai et al. 2019, section 3).

The recipe: keep English only, make every answer with at least two up-votes a positive pair for its question,
and sample real answers to other questions as negatives (the paper: 628,706 positive and 9,874,758 negative
pairs, about 15.7 negatives per positive).

Stages, Ray Data reads and maps, then Ray tasks over the blocks they made:
  1. posts from dump files (`crawl.dump.posts_dataset`: a plain Posts.xml is cut into byte ranges read in
     parallel; gzip and 7z are streamed by one task each), the API or pages (`crawl.sources.crawled_posts`),
     all in the POSTS shape;
  2. per post, in the same tasks as the read (`analyse_posts`, a cached `PostAnalysis` per worker): HTML to
     text (`clean_text`), language ID (`LanguageIdentifier`), overlap with evaluation test sets
     (`pipelines.overlap`, when configured);
  3. duplicate answers found across the corpus (`pipelines.dedup`, MinHash LSH) and sent to their threads
     as marker rows;
  4. threads assembled by question (a hash shuffle by thread, `pipelines.shuffle`, then `assemble_threads` per
     partition): every post gets a `status`, either kept ("question", "positive") or the reason it was dropped,
     and its question's split; the same task counts the funnel and makes the attribution rows;
  5. negatives sampled for each positive from the answers of other questions in the same pool group (site and
     split by default) at cluster scale (`pipelines.negatives`), seeded so the result does not depend on
     partitioning; or, with `hard_negatives` set, mined by a model from the same pool groups, as many per
     question (`pipelines.hard_negatives`, the thread rows made its rows by `funnel.mining_candidates`);
  6. pairs grouped by question (a hash shuffle by question id), questions in an order drawn from the seed,
     so that shards never hold long runs of one label.

`build(cfg)` returns the pairs dataset and the funnel (`build_blocks(cfg)` the object references beneath);
`write(cfg)` writes shards, `stats.json`, `failures.jsonl` and the data card atomically. The funnel counts
every post exactly once, so its parts add up to the posts read.

The package, a module per concern: `config` (BuildConfig, statuses), `posts` (stages 1-2), `threads` (stage 4's
rules), `funnel` (counts and attribution rows), `pairs` (stage 6 and the shards), `build` (the stages as Ray tasks,
`build`, `write`).
"""

from pipelines.stackexchangeqa.build import Built, NoPosts, build, build_blocks, write
from pipelines.stackexchangeqa.config import (
    DROP_REASONS,
    JOB,
    KEPT_QUESTION,
    NEGATIVE_POOL,
    PAPER,
    POSITIVE,
    SPLITS,
    BuildConfig,
    earlier_build,
)
from pipelines.stackexchangeqa.funnel import ATTRIBUTION, funnel

__all__ = [
    "ATTRIBUTION",
    "DROP_REASONS",
    "JOB",
    "KEPT_QUESTION",
    "NEGATIVE_POOL",
    "PAPER",
    "POSITIVE",
    "SPLITS",
    "BuildConfig",
    "Built",
    "NoPosts",
    "build",
    "build_blocks",
    "earlier_build",
    "funnel",
    "write",
]

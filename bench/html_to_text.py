"""How dump bodies become text: lxml.html (what the build uses) against BeautifulSoup, on real posts.

    python bench/html_to_text.py [--dump PATH] [--repeat N] [--json OUT]

Prints documents per second on one core for each, their ratio, and whether both give the same words; the
last line is one JSON object (also written to --json).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):
    # Run as a script, bench/ comes first on sys.path, where bench/tokenize.py would stand in for the standard
    # library's `tokenize`: put the repository there instead.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

from bench.report import check_result_file, write_result
from crawl.dump import iter_posts
from pipelines.text import html_to_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DUMP = os.path.join(REPO, "..", "shared", "data", "stackexchange_dump_beer", "Posts.xml.gz")


def soup_text(html: str) -> str:
    from bs4 import BeautifulSoup

    return BeautifulSoup(html, "lxml").get_text("\n")


def rate(fn, bodies, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        for body in bodies:
            fn(body)
    return repeat * len(bodies) / (time.perf_counter() - start)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dump", default=DEFAULT_DUMP, help="a Posts.xml(.gz) whose bodies are the workload")
    p.add_argument("--repeat", type=int, default=3, help="passes over the bodies per method")
    p.add_argument(
        "--json", default=os.path.join(REPO, "bench", "html_to_text.json"), help="where to write the figures"
    )
    args = p.parse_args(argv)
    check_result_file(p, args.json, "lxml_vs_beautifulsoup", inputs=(args.dump,))
    bodies = [post["body"] for post in iter_posts(args.dump) if post["body"]]
    mean_kb = sum(len(b) for b in bodies) / len(bodies) / 1024
    lxml_rate = rate(html_to_text, bodies, args.repeat)
    soup_rate = rate(soup_text, bodies, args.repeat)
    # Same visible characters, whitespace aside (the two place line breaks differently).
    same = sum("".join(html_to_text(b).split()) == "".join(soup_text(b).split()) for b in bodies) / len(bodies)
    result = {
        "documents": len(bodies),
        "mean_kb": round(mean_kb, 2),
        "lxml_docs_per_s": round(lxml_rate),
        "beautifulsoup_docs_per_s": round(soup_rate),
        "lxml_vs_beautifulsoup": round(lxml_rate / soup_rate, 1),
        "same_text_share": round(same, 3),
    }
    print(
        f"{len(bodies)} bodies, {mean_kb:.1f} KB mean: lxml.html {lxml_rate:,.0f}/s, BeautifulSoup "
        f"{soup_rate:,.0f}/s ({result['lxml_vs_beautifulsoup']}x); same text in {same:.1%} of bodies"
    )
    write_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

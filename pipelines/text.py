"""HTML post bodies to clean text.

Dump bodies are trusted, well-formed HTML, so a fast HTML5 parser is enough: selectolax's Lexbor engine,
the fastest of the three parsers `bench/html_to_text.py` measures on real posts (Lexbor, lxml.html,
BeautifulSoup). Crawled pages, whose structure matters, go through BeautifulSoup in `crawl/`.

A block element (paragraph, list item, cell, heading, `<br>`, ...) starts and ends a line. Lexbor has no hook
for that, so the block tags get a newline on each side in the HTML string before parsing, which the parser keeps
as text; `html_to_text_lxml`, the implementation this one replaced, adds the newline to each block's tail in
the parsed tree instead. The two give the same text on every one of the 2,633 real bodies of
`../shared/data` (the beer dump and the crawled pages; `tests/pipelines/test_text.py` checks it), and differ only where
the old one joined two words across a block that opens mid-line (`x<div>y</div>` was "xy", now "x\\ny").
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selectolax.lexbor import LexborHTMLParser

_BLOCKS = {
    "p",
    "div",
    "br",
    "li",
    "ul",
    "ol",
    "pre",
    "blockquote",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "tr",
    "td",
    "th",
    "table",
    "hr",
    "dd",
    "dt",
}
# Any opening or closing block tag (attributes included); `\b` keeps <param> and <thead> out of `p` and `th`.
_BLOCK_TAG = re.compile(
    r"</?(?:p|div|br|li|ul|ol|pre|blockquote|h[1-6]|tr|td|th|table|hr|dd|dt)\b[^>]*>", re.IGNORECASE
)
_SPACES = re.compile(r"[^\S\n]+")
_NEWLINES = re.compile(r"\s*\n\s*")


def _on_own_line(match: re.Match) -> str:
    return "\n" + match.group(0) + "\n"


def collapse_whitespace(text: str) -> str:
    """Spaces collapsed within each line, blank lines and the lines' ends dropped: the same as substituting
    `[^\\S\\n]+` with a space and `\\s*\\n\\s*` with a newline, then stripping (str.split and re's `\\s` agree on
    what is whitespace), at a fifth of their cost."""
    return "\n".join(filter(None, (" ".join(line.split()) for line in text.split("\n"))))


@functools.cache
def _lexbor() -> type[LexborHTMLParser]:
    # Loaded with the first body, not with the module: the StackExchangeQA package imports this module, and the
    # results page reads that package's configuration on machines that parse no HTML and lack selectolax (a GPU
    # node's image; tests/experiments/test_results.py checks the page is written there).
    from selectolax.lexbor import LexborHTMLParser

    return LexborHTMLParser


def html_to_text(html: str, keep_code: bool = True) -> str:
    """Visible text of an HTML fragment: entities decoded, one line per block, spaces collapsed.

    `keep_code=False` drops `<pre>` blocks (multi-line code) but keeps inline `<code>` words, which are
    usually part of the sentence.
    """
    if not html or not html.strip():
        return ""
    tree = _lexbor()(_BLOCK_TAG.sub(_on_own_line, html))
    root = tree.root
    if root is None:
        return ""
    if not keep_code:
        for pre in root.css("pre"):
            pre.decompose()
    return collapse_whitespace(root.text())


def html_to_text_lxml(html: str, keep_code: bool = True) -> str:
    """The lxml.html implementation `html_to_text` replaced, kept as its reference (tests, bench)."""
    import lxml.html
    from lxml import etree

    if not html or not html.strip():
        return ""
    try:
        root = lxml.html.fragment_fromstring(html, create_parent="div")
    except (etree.ParserError, ValueError):
        return ""
    if not keep_code:
        for pre in root.findall(".//pre"):
            pre.drop_tree()
    for element in root.iter():
        if isinstance(element.tag, str) and element.tag in _BLOCKS:
            element.tail = "\n" + (element.tail or "")
    text = root.text_content()
    text = _SPACES.sub(" ", text)
    return _NEWLINES.sub("\n", text).strip()

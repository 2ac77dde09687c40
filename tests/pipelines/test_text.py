"""HTML post bodies to text (pipelines/text.py)."""

from pathlib import Path

import pytest

from crawl.dump import iter_posts
from pipelines.text import collapse_whitespace, html_to_text, html_to_text_lxml


def test_html_to_text():
    html = "<p>Hops &amp; malt</p><pre><code>x = 1\ny = 2</code></pre><p>Use <code>ls</code>   now</p>"
    assert html_to_text(html) == "Hops & malt\nx = 1\ny = 2\nUse ls now"
    assert html_to_text(html, keep_code=False) == "Hops & malt\nUse ls now"
    assert html_to_text("") == "" and html_to_text("   ") == ""
    # malformed and mid-line blocks: implicit closes still break lines, and a block never joins two words
    assert html_to_text("<p>a<p>b") == "a\nb" and html_to_text("<ul><li>a<li>b</ul>c") == "a\nb\nc"
    assert html_to_text("x<div>y</div>z") == "x\ny\nz" and html_to_text_lxml("x<div>y</div>z") == "xy\nz"
    assert html_to_text("a<br/>b<BR >c &nbsp; d<param>e") == "a\nb\nc de"  # <param> is not <p>
    assert html_to_text("<p>caf&eacute; &amp; &lt;tag&gt;</p>") == "café & <tag>"


@pytest.mark.parametrize("text", ["a  b\t\n\n  c \r\n d\u00a0e\u2028f ", "", " \n ", "one"])
def test_collapse_whitespace_is_the_two_substitutions_it_replaced(text):
    from pipelines.text import _NEWLINES, _SPACES

    assert collapse_whitespace(text) == _NEWLINES.sub("\n", _SPACES.sub(" ", text)).strip()


@pytest.mark.slow
def test_html_to_text_gives_the_replaced_lxml_text_on_every_real_body(shared_data):
    """Golden values from the reference implementation: every body of the beer dump and the crawled pages."""
    import glob
    import gzip

    from crawl.pages import PageParseError, parse_question_page

    bodies = [p["body"] for p in iter_posts(f"{shared_data}/stackexchange_dump_beer/Posts.xml.gz")]
    for path in sorted(glob.glob(f"{shared_data}/stackexchange_html/pages/*.html.gz")):
        try:
            page = parse_question_page(gzip.decompress(Path(path).read_bytes()), path)
        except PageParseError:  # the set holds a few pages that are not question pages, on purpose
            continue
        bodies += [page["body"]] + [a["body"] for a in page["answers"]]
    assert len(bodies) > 2500
    for keep_code in (True, False):
        differ = [b for b in bodies if html_to_text(b, keep_code) != html_to_text_lxml(b, keep_code)]
        assert not differ, (len(differ), differ[0][:300])

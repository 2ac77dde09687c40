"""Reading official dumps: the real beer dump, both tag forms, and bad input with clear errors."""

import gzip
import itertools
import os
from pathlib import Path

import pyarrow as pa
import pytest

from crawl.dump import DumpError, iter_posts, parse_tags, site_name


def test_beer_dump_counts_match_provenance(beer_dump):
    posts = list(iter_posts(beer_dump))
    by_type = {}
    for p in posts:
        by_type[p["post_type"]] = by_type.get(p["post_type"], 0) + 1
    assert len(posts) == 2354  # PROVENANCE.md: 2,354 rows
    assert by_type == {1: 663, 2: 1572, 4: 58, 5: 58, 7: 3}
    first = posts[0]
    assert first["id"] == 1 and first["accepted_answer_id"] == 4 and first["tags"] == ["hops"]
    assert first["title"] == "What is a citra hop, and how does it differ from other hops?"
    assert first["line"] == 3  # BOM and CRLF do not shift line numbers
    assert sum(p["accepted_answer_id"] > 0 for p in posts) == 410
    answers = [p for p in posts if p["post_type"] == 2]
    assert all(p["parent_id"] > 0 for p in answers) and all(p["title"] == "" for p in answers)
    assert site_name(beer_dump) == "beer.stackexchange.com"
    # authors, for attribution: a user id on most posts; deleted users keep only a display name
    assert first["author_id"] == 7 and first["author"] == ""
    named = {p["id"]: (p["author_id"], p["author"]) for p in posts if p["author"]}
    assert len(named) == 15 and named[423] == (None, "user150") and named[506] == (352, "CDspace")
    assert sum(p["author_id"] is not None for p in posts) == 2342  # rows with an OwnerUserId
    assert sum(p["author_id"] == -1 for p in posts) == 31  # the "Community" user (tag wikis and the like)


def test_both_tag_forms():
    assert parse_tags("<hops><history>") == ["hops", "history"]
    assert parse_tags("|hops|history|") == ["hops", "history"]
    assert parse_tags(None) == [] and parse_tags("") == []


def _write(tmp_path, name, data: bytes, compress=False):
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def test_missing_optional_attributes_and_new_tag_form(tmp_path):
    xml = (
        '\ufeff<?xml version="1.0" encoding="utf-8"?>\r\n<posts>\r\n'
        '  <row Id="7" PostTypeId="1" Score="3" Body="&lt;p&gt;Q?&lt;/p&gt;" Tags="|a|b|" />\r\n'
        '  <row Id="8" PostTypeId="2" ParentId="7" Body="x" />\r\n</posts>\r\n'
    ).encode()
    posts = list(iter_posts(_write(tmp_path, "Posts.xml", xml), site="s"))
    assert posts[0]["tags"] == ["a", "b"] and posts[0]["accepted_answer_id"] == -1
    assert posts[1]["score"] == 0 and posts[1]["title"] == "" and posts[1]["creation_date"] == ""


def test_truncated_gzip_names_file_and_line(tmp_path, beer_dump):
    data = gzip.decompress(Path(beer_dump).read_bytes())
    blob = gzip.compress(data)
    path = tmp_path / "Posts.xml.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DumpError, match=r"Posts\.xml\.gz: after line \d+: truncated or corrupt gzip"):
        list(iter_posts(str(path)))


def test_malformed_xml_names_file_and_line(tmp_path):
    xml = b'<?xml version="1.0"?>\n<posts>\n  <row Id="1" PostTypeId="1" />\n  <row Id="2" PostTypeId="2" \n</posts>\n'
    path = _write(tmp_path, "Posts.xml", xml)
    with pytest.raises(DumpError, match=r"Posts\.xml: line 5: malformed XML"):
        list(iter_posts(path))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DumpError, match=r"nope\.xml: no such file"):
        list(iter_posts(str(tmp_path / "nope.xml")))
    with pytest.raises(DumpError, match="empty file"):
        list(iter_posts(_write(tmp_path, "Posts.xml", b"")))
    with pytest.raises(DumpError, match="empty or not XML"):
        list(iter_posts(_write(tmp_path, "Posts.xml.gz", b"", compress=True)))


def test_wrong_root_and_bad_integer(tmp_path):
    with pytest.raises(DumpError, match="root element is <users>"):
        list(iter_posts(_write(tmp_path, "a.xml", b"<users><row Id='1'/></users>")))
    with pytest.raises(DumpError, match=r"line 1: attribute Score='x' is not an integer"):
        list(iter_posts(_write(tmp_path, "b.xml", b"<posts><row Id='1' Score='x'/></posts>")))


def test_memory_stays_flat_while_streaming(tmp_path):
    """Rows are freed as they are read: the parsed tree never holds more than a few rows."""
    rows = "".join(f'<row Id="{i}" PostTypeId="2" ParentId="1" Body="{"x" * 200}" />\n' for i in range(1, 20001))
    path = _write(tmp_path, "Posts.xml", f"<posts>\n{rows}</posts>".encode())
    import tracemalloc

    tracemalloc.start()
    count = sum(1 for _ in iter_posts(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 20000
    assert peak < os.path.getsize(path) / 4, f"peak {peak} bytes for a {os.path.getsize(path)}-byte file"


def test_byte_ranges_read_every_row_once_whatever_the_cut(beer_dump, tmp_path):
    """A plain Posts.xml cut into byte ranges (parallel reads of one big file) gives exactly the rows of one
    streaming read, in order, for cuts that fall mid-line, on a line start, and on the CRLF."""
    from crawl.dump import byte_ranges, iter_posts_range, line_per_row

    plain = tmp_path / "Posts.xml"
    plain.write_bytes(gzip.decompress(Path(beer_dump).read_bytes()))  # the real file: BOM, CRLF
    assert line_per_row(str(plain)) and not line_per_row(beer_dump)  # gzip cannot be cut
    whole = [(p["id"], p["body"], p["tags"]) for p in iter_posts(str(plain), site="beer")]
    size = os.path.getsize(plain)
    for range_bytes in (size, 100_000, 4096, 1000, 777):
        pieces = byte_ranges(str(plain), range_bytes)
        assert pieces[0][0] == 0 and pieces[-1][1] == size
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        cut = [
            (p["id"], p["body"], p["tags"])
            for start, end in pieces
            for p in iter_posts_range(str(plain), start, end, site="beer")
        ]
        assert cut == whole, f"ranges of {range_bytes} bytes"


def test_files_that_cannot_be_cut_are_recognised(tmp_path):
    from crawl.dump import line_per_row

    multi_line = _write(tmp_path, "a.xml", b'<posts>\n<row Id="1"\n PostTypeId="1" />\n</posts>\n')
    one_line = _write(tmp_path, "b.xml", b'<posts><row Id="1" PostTypeId="1" /></posts>')
    truncated = _write(tmp_path, "c.xml", b'<posts>\n<row Id="1" PostTypeId="1" />\n<row Id="2"')
    wrong_root = _write(tmp_path, "d.xml", b'<users>\n<row Id="1" />\n</users>\n')
    assert not any(line_per_row(p) for p in (multi_line, one_line, truncated, wrong_root))


def test_a_bad_row_in_a_byte_range_names_the_file_and_offset(tmp_path):
    from crawl.dump import iter_posts_range

    data = b'<posts>\n<row Id="1" PostTypeId="1" />\n<row Id="2" Score="x" />\n</posts>\n'
    path = _write(tmp_path, "Posts.xml", data)
    offset = data.index(b'<row Id="2"')
    with pytest.raises(DumpError, match=rf"Posts\.xml: byte {offset}: attribute Score='x'"):
        list(iter_posts_range(path, 0, len(data)))


def test_range_tables_are_the_row_by_row_reading_whatever_the_rows_hold(beer_dump, tmp_path):
    """The columnar range reader gives the table the row-by-row reader gives: on the real dump (BOM, CRLF), in
    small tables, and where a table holds a row that only the row-by-row reader reads (an empty attribute)."""
    from crawl.dump import POSTS, iter_post_range_tables, iter_posts_range

    plain = tmp_path / "Posts.xml"
    plain.write_bytes(gzip.decompress(Path(beer_dump).read_bytes()))
    size = os.path.getsize(plain)
    for rows_per_table in (4096, 100, 7):
        for start, end in ((0, size), (0, size // 3), (size // 3, size)):
            tables = list(iter_post_range_tables(str(plain), start, end, "beer", rows_per_table))
            assert all(t.num_rows <= rows_per_table and t.schema == POSTS for t in tables)
            expected = pa.Table.from_pylist(list(iter_posts_range(str(plain), start, end, "beer")), schema=POSTS)
            assert pa.concat_tables(tables).equals(expected), (rows_per_table, start, end)
    odd = _write(
        tmp_path,
        "odd.xml",
        b'<posts>\n<row Id="1" PostTypeId="1" Score="" Title="t" />\n'
        b'<row Id="2" PostTypeId="2" ParentId="1" Score="3" />\n</posts>\n',
    )
    table = pa.concat_tables(iter_post_range_tables(odd, 0, os.path.getsize(odd), "beer"))
    assert table.column("score").to_pylist() == [0, 3] and table.column("parent_id").to_pylist() == [-1, 1]
    bad = _write(tmp_path, "bad.xml", b'<posts>\n<row Id="1" PostTypeId="1" />\n<row Id="2" Score="x" />\n</posts>\n')
    with pytest.raises(DumpError, match=r"bad\.xml: byte 38: attribute Score='x'"):
        list(iter_post_range_tables(bad, 0, os.path.getsize(bad)))

"""Stream posts out of an official Stack Exchange dump `Posts.xml`, plain or gzip, in constant memory.

The dump is one `<row .../>` per post under `<posts>`, HTML bodies escaped inside attributes. Real files
carry a UTF-8 BOM and CRLF line ends, omit optional attributes instead of leaving them empty, and write tags
either as `<a><b>` (dumps before 2023) or `|a|b|` (later dumps). `iter_posts` parses incrementally with
lxml and frees each row as soon as it is read, so memory does not grow with the file.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Generator, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lxml import etree

from crawl.sites import site_host

QUESTION, ANSWER = 1, 2
FETCH_FAILED = -1  # not a post: a URL the crawler could not turn into posts; `failure` says why

# One post as read from a dump, the API or a page. `origin` is the file or URL it came from and `line` its
# line in a dump file (-1 for crawled posts), kept so later errors can point at them.
POSTS = pa.schema(
    [
        pa.field("site", pa.string()),
        pa.field("id", pa.int64()),
        pa.field("post_type", pa.int8()),
        pa.field("parent_id", pa.int64()),  # -1 unless an answer
        pa.field("accepted_answer_id", pa.int64()),  # -1 when none
        pa.field("score", pa.int32()),
        pa.field("title", pa.string()),
        pa.field("body", pa.string()),  # HTML
        pa.field("tags", pa.list_(pa.string())),
        pa.field("creation_date", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("origin", pa.string()),
        pa.field("licence", pa.string()),
        pa.field("failure", pa.string()),  # empty for posts
        # The author, for CC BY-SA attribution: the user id (null when unknown or deleted; -1 is the
        # "Community" user) and the display name where the source gives one (dumps name only deleted users:
        # the others' names are in Users.xml).
        pa.field("author_id", pa.int64()),
        pa.field("author", pa.string()),
    ]
)


def licence_for(creation_date: str, declared: str | None = None) -> str:
    """The CC licence of a post: as declared (dumps since 2018 and API 2.3 say it), else by its date as Stack
    Exchange's terms put it: BY-SA 2.5 before 2011-04-08, 3.0 before 2018-05-02, 4.0 after."""
    if declared:
        return declared
    day = (creation_date or "")[:10]
    if not day:
        return "CC BY-SA"
    return "CC BY-SA 2.5" if day < "2011-04-08" else "CC BY-SA 3.0" if day < "2018-05-02" else "CC BY-SA 4.0"


_ANGLE_TAGS = re.compile(r"<([^<>]+)>")


class DumpError(ValueError):
    """A dump file cannot be read; the message names the file and, where known, the line."""


def parse_tags(value: str | None) -> list[str]:
    """Both tag forms: `<hops><history>` and `|hops|history|`."""
    if not value:
        return []
    if value.startswith("<"):
        return _ANGLE_TAGS.findall(value)
    return [t for t in value.split("|") if t]


def site_name(path: str) -> str:
    """The site a dump belongs to, from its location.

    `.../beer.stackexchange.com/Posts.xml` gives `beer.stackexchange.com`; a folder named
    `stackexchange_dump_<site>` gives `<site>`; an archive `<site>.7z` gives `<site>`.
    """
    path = os.path.abspath(path)
    base = os.path.basename(path)
    if base.endswith(".7z"):
        return site_host(base[: -len(".7z")].split("-")[0])  # stackoverflow.com-Posts.7z -> stackoverflow.com
    folder = os.path.basename(os.path.dirname(path))
    return site_host(folder[len("stackexchange_dump_") :] if folder.startswith("stackexchange_dump_") else folder)


SEVEN_ZIP_MAGIC = b"7z\xbc\xaf\x27\x1c"
DUMP_NAMES = ("Posts.xml", "Posts.xml.gz")


def resolve_dump(path: str) -> str:
    """A dump file for `path`: itself, or the Posts.xml / Posts.xml.gz / single .7z inside a folder."""
    if not os.path.isdir(path):
        return path
    for name in DUMP_NAMES:
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    archives = sorted(f for f in os.listdir(path) if f.endswith(".7z"))
    if len(archives) == 1:
        return os.path.join(path, archives[0])
    found = f"{len(archives)} .7z archives" if archives else "none of them"
    raise DumpError(f"{path}: is a directory; expected Posts.xml, Posts.xml.gz or one site .7z inside ({found})")


def _open(path: str):
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DumpError(f"{path}: is a directory, expected Posts.xml or Posts.xml.gz")
    if os.path.getsize(path) == 0:
        raise DumpError(f"{path}: empty file, expected a Posts.xml dump")
    with open(path, "rb") as probe:
        magic = probe.read(6)
    if path.endswith(".7z") and magic != SEVEN_ZIP_MAGIC:
        raise DumpError(f"{path}: not a 7z archive (wrong magic bytes)")
    return gzip.open(path, "rb") if magic[:2] == b"\x1f\x8b" else open(path, "rb")


def check_readable(path: str) -> None:
    """Raise DumpError naming `path` if it is missing, a folder without a dump, empty, or not what it says: for
    an XML dump (plain or gzip) that includes its root element and first row (another dump file of the site, such
    as Users.xml, or a damaged start), read here in a moment rather than by the build after Ray has started.
    A .7z is only checked for its magic bytes: its Posts.xml is extracted when read."""
    path = resolve_dump(path)
    _open(path).close()
    if not path.endswith(".7z"):
        posts = iter_posts(path)
        try:
            next(posts, None)
        finally:
            posts.close()


def _iter_archive(path: str, site: str) -> Iterator[dict]:
    """Posts of a site `.7z`: Posts.xml is extracted to a temporary folder on the reading node, streamed,
    and removed. $QA_EXTRACT_DIR chooses where (it needs room for the uncompressed Posts.xml)."""
    import tempfile

    from crawl.download import DownloadError, extract_posts

    with tempfile.TemporaryDirectory(prefix="posts-", dir=os.environ.get("QA_EXTRACT_DIR")) as tmp:
        try:
            xml = extract_posts(path, tmp)
        except DownloadError as err:
            raise DumpError(str(err)) from err
        try:
            for row in iter_posts(xml, site):
                row["origin"] = path
                yield row
        except DumpError as err:
            raise DumpError(str(err).replace(xml, f"{path}:Posts.xml")) from err


def _int(attrs, name: str, default: int | None, path: str, where: str) -> int | None:
    value = attrs.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise DumpError(f"{path}: {where}: attribute {name}={value!r} is not an integer") from None


def _post(attrs, site: str, path: str, line: int, where: str) -> dict:
    """One `<row>`'s attributes as a POSTS row; `where` ("line 12", "byte 4096") places errors."""
    post_id = _int(attrs, "Id", -1, path, where)
    if post_id is None or post_id < 0:
        raise DumpError(f"{path}: {where}: row without an Id attribute")
    return {
        "site": site,
        "id": post_id,
        "post_type": _int(attrs, "PostTypeId", 0, path, where),
        "parent_id": _int(attrs, "ParentId", -1, path, where),
        "accepted_answer_id": _int(attrs, "AcceptedAnswerId", -1, path, where),
        "score": _int(attrs, "Score", 0, path, where),
        "title": attrs.get("Title", ""),
        "body": attrs.get("Body", ""),
        "tags": parse_tags(attrs.get("Tags")),
        "creation_date": attrs.get("CreationDate", ""),
        "line": line,
        "origin": path,
        "licence": licence_for(attrs.get("CreationDate", ""), attrs.get("ContentLicense")),
        "failure": "",
        "author_id": _int(attrs, "OwnerUserId", None, path, where),
        "author": attrs.get("OwnerDisplayName", ""),
    }


def iter_posts(path: str, site: str | None = None) -> Generator[dict, None, None]:
    """Yield every `<row>` of a dump as a dict with the POSTS columns, in file order."""
    path = resolve_dump(path)
    site = site_host(site) if site else site_name(path)
    if path.endswith(".7z"):
        _open(path).close()
        yield from _iter_archive(path, site)
        return
    stream = _open(path)
    last_line = 0
    seen_root = False
    try:
        for event, elem in etree.iterparse(stream, events=("start", "end"), huge_tree=True, remove_comments=True):
            if event == "start":
                if not seen_root:
                    seen_root = True
                    if elem.tag != "posts":
                        raise DumpError(
                            f"{path}: line {elem.sourceline}: root element is <{elem.tag}>, expected <posts>"
                        )
                continue
            if elem.tag != "row":
                continue
            line = elem.sourceline or last_line
            last_line = line
            yield _post(elem.attrib, site, path, line, f"line {line}")
            # Free the row and everything parsed before it: memory stays flat over any file size.
            elem.clear(keep_tail=True)
            parent = elem.getparent()
            if parent is not None:
                while elem.getprevious() is not None:
                    del parent[0]
    except etree.XMLSyntaxError as err:
        where = f"line {err.lineno}" if err.lineno else f"after line {last_line}"
        empty = "Document is empty" in str(err) or (last_line == 0 and "no element found" in str(err))
        reason = "empty or not XML" if empty else err.msg
        raise DumpError(f"{path}: {where}: malformed XML: {reason}") from err
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise DumpError(f"{path}: after line {last_line}: truncated or corrupt gzip: {err}") from err
    finally:
        stream.close()
    if not seen_root:
        raise DumpError(f"{path}: no XML content")


def _post_tables(posts: Iterator[dict], rows_per_table: int) -> Iterator[pa.Table]:
    batch: list[dict] = []
    for post in posts:
        batch.append(post)
        if len(batch) >= rows_per_table:
            yield pa.Table.from_pylist(batch, schema=POSTS)
            batch = []
    if batch:
        yield pa.Table.from_pylist(batch, schema=POSTS)


def iter_post_tables(path: str, site: str | None = None, rows_per_table: int = 4096) -> Iterator[pa.Table]:
    """The posts of one dump as pyarrow tables of at most `rows_per_table` rows (blocks for Ray Data)."""
    return _post_tables(iter_posts(path, site), rows_per_table)


# Official dumps write one `<row .../>` per line (newlines inside bodies are escaped as `&#xA;`), so a plain
# Posts.xml can be cut at line starts and its pieces parsed in parallel: one site's file (Stack Overflow's is
# about 100 GB) need not be read by one core. gzip and 7z streams cannot be cut and are read whole.
_PROBE_BYTES = 1 << 20


def line_per_row(path: str) -> bool:
    """True when `path` is a plain (uncompressed) Posts.xml laid out one row per line, as official dumps are:
    its head opens `<posts>`, every row line in the first megabyte is a whole `<row .../>` element, and the
    file ends with `</posts>`. Anything else is read by one streaming parser, which handles any layout."""
    path = resolve_dump(path)
    if path.endswith(".7z"):
        return False
    with open(path, "rb") as f:
        head = f.read(_PROBE_BYTES)
        if head[:2] == b"\x1f\x8b":
            return False
        f.seek(max(0, os.path.getsize(path) - 64))
        tail = f.read()
    if not tail.rstrip().endswith(b"</posts>"):
        return False
    lines = head.split(b"\n")
    if len(head) == _PROBE_BYTES:
        lines = lines[:-1]  # the last line may be cut by the probe
    rows = [line.strip() for line in lines if b"<row" in line]
    root = re.search(rb"<(?!\?)(?!!)([A-Za-z_][\w.-]*)", head)
    return (
        bool(rows)
        and root is not None
        and root.group(1) == b"posts"
        and all(row.startswith(b"<row") and row.endswith(b"/>") for row in rows)
    )


def byte_ranges(path: str, range_bytes: int) -> list[tuple[int, int]]:
    """[start, end) ranges of about `range_bytes` covering the file; a range owns the lines that start in it."""
    size = os.path.getsize(path)
    count = max(1, -(-size // max(1, range_bytes)))
    step = -(-size // count)
    return [(i * step, min(size, (i + 1) * step)) for i in range(count)]


def iter_posts_range(path: str, start: int, end: int, site: str | None = None) -> Iterator[dict]:
    """The posts on the lines of a line-per-row Posts.xml (see `line_per_row`) that start in [start, end).

    `line` is -1 (counting lines before `start` would mean reading them); errors name the byte offset.
    """
    site = site_host(site) if site else site_name(path)
    parser = etree.XMLParser(huge_tree=True, resolve_entities=False)
    with open(path, "rb") as f:
        f.seek(start)
        offset = start
        if start > 0:
            f.seek(start - 1)
            offset = start - 1 + len(f.readline())  # the line under way at `start` belongs to the range before
        while offset < end:
            line = f.readline()
            if not line:
                break
            where = offset
            offset += len(line)
            stripped = line.strip()
            if not stripped.startswith(b"<row"):
                continue  # the XML declaration, <posts>, </posts>, blank lines
            try:
                elem = etree.fromstring(stripped, parser)
            except etree.XMLSyntaxError as err:
                raise DumpError(f"{path}: byte {where}: malformed XML: {err.msg}") from err
            yield _post(elem.attrib, site, path, -1, f"byte {where}")


def _range_lines(path: str, start: int, end: int) -> tuple[bytes, int]:
    """The bytes of the whole lines that start in [start, end), and the offset of the first."""
    with open(path, "rb") as f:
        first = start
        if start > 0:
            f.seek(start - 1)
            first = start - 1 + len(f.readline())  # the line under way at `start` belongs to the range before
        if first >= end:
            return b"", first
        f.seek(first)
        data = f.read(end - first)
        if not data.endswith(b"\n"):
            data += f.readline()  # the last line that starts in the range, to its end
    return data, first


_ATTRIBUTES = (
    "Id",
    "PostTypeId",
    "ParentId",
    "AcceptedAnswerId",
    "Score",
    "OwnerUserId",
    "Title",
    "Body",
    "Tags",
    "CreationDate",
    "ContentLicense",
    "OwnerDisplayName",
)
_ROWS_PARSER = etree.XMLParser(huge_tree=True, resolve_entities=False)


def _integers(values: list, default: int | None, type_: pa.DataType) -> pa.Array:
    """String attributes to integers in one Arrow call (missing: `default`); raises ArrowInvalid on anything else
    (empty, not a number, out of range), which the caller answers by reading row by row."""
    array = pc.cast(pa.array(values, pa.string()), type_)
    return array if default is None else pc.fill_null(array, pa.scalar(default, type_))


def _rows_table(rows: list[bytes], site: str, path: str) -> pa.Table:
    """POSTS rows for whole `<row .../>` lines, parsed in one lxml call and converted column by column."""
    root = etree.fromstring(b"<posts>" + b"\n".join(rows) + b"</posts>", _ROWS_PARSER)
    columns: dict[str, list] = {name: [] for name in _ATTRIBUTES}
    appends = list(columns.items())
    count = 0
    for row in root:
        if row.tag != "row":
            raise ValueError(f"<{row.tag}> where <row> was expected")
        get = row.attrib.get
        for name, values in appends:
            values.append(get(name))
        count += 1
    if count != len(rows):
        raise ValueError("a line held more or fewer than one row")
    ids = _integers(columns["Id"], None, pa.int64())
    if ids.null_count:
        raise ValueError("a row without an Id")

    def text(name):
        return pc.fill_null(pa.array(columns[name], pa.string()), "")

    dates = columns["CreationDate"]
    return pa.table(
        {
            "site": pa.array([site] * count, pa.string()),
            "id": ids,
            "post_type": _integers(columns["PostTypeId"], 0, pa.int8()),
            "parent_id": _integers(columns["ParentId"], -1, pa.int64()),
            "accepted_answer_id": _integers(columns["AcceptedAnswerId"], -1, pa.int64()),
            "score": _integers(columns["Score"], 0, pa.int32()),
            "title": text("Title"),
            "body": text("Body"),
            "tags": pa.array([parse_tags(t) for t in columns["Tags"]], pa.list_(pa.string())),
            "creation_date": text("CreationDate"),
            "line": pa.array(np.full(count, -1, dtype=np.int64)),
            "origin": pa.array([path] * count, pa.string()),
            "licence": pa.array(
                [licence_for(d or "", c) for d, c in zip(dates, columns["ContentLicense"])], pa.string()
            ),
            "failure": pa.array([""] * count, pa.string()),
            "author_id": _integers(columns["OwnerUserId"], None, pa.int64()),
            "author": text("OwnerDisplayName"),
        },
        schema=POSTS,
    )


def iter_post_range_tables(
    path: str, start: int, end: int, site: str | None = None, rows_per_table: int = 4096
) -> Iterator[pa.Table]:
    """The rows of `iter_posts_range` as tables of at most `rows_per_table` rows, each table's lines parsed in
    one lxml call and converted column by column (a third less time a post than a parse and a dict per row).
    A table whose lines are not plain official rows (an empty or non-numeric attribute, a malformed line) is
    read again row by row, which either reads it the same way or raises the error naming the byte."""
    site = site_host(site) if site else site_name(path)
    data, first = _range_lines(path, start, end)
    rows: list[bytes] = []
    group_start = offset = first
    for line in data.split(b"\n"):  # as readline cuts them, so that offsets are the row-by-row reader's
        stripped = line.strip()
        offset += len(line) + 1
        if stripped.startswith(b"<row"):
            rows.append(stripped)
        if len(rows) >= rows_per_table:
            yield _table_or_rows(rows, site, path, group_start, offset)
            rows, group_start = [], offset
    if rows:
        yield _table_or_rows(rows, site, path, group_start, offset)


def _table_or_rows(rows: list[bytes], site: str, path: str, start: int, end: int) -> pa.Table:
    try:
        return _rows_table(rows, site, path)
    except (etree.XMLSyntaxError, pa.ArrowInvalid, ValueError):
        return pa.Table.from_pylist(list(iter_posts_range(path, start, end, site)), schema=POSTS)


def posts_dataset(
    paths: list[str],
    sites: list[str | None] | None = None,
    rows_per_block: int = 4096,
    max_range_bytes: int = 64 << 20,
    min_range_bytes: int = 8 << 20,
    pieces_wanted: int | None = None,
):
    """A `ray.data.Dataset` of POSTS rows read from `paths`.

    A plain, line-per-row Posts.xml is cut into byte ranges read by parallel tasks: at most `max_range_bytes`
    each, and at least `pieces_wanted` (default: twice the cluster's CPUs) while they stay above
    `min_range_bytes`. Other files (gzip, 7z, unusual layouts) are streamed whole by one task each.
    """
    import ray
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    sites = sites or [None] * len(paths)
    paths = [resolve_dump(p) for p in paths]
    for path in paths:  # fail on the driver, before any task starts, for the common mistakes
        check_readable(path)
    if pieces_wanted is None:
        pieces_wanted = 2 * int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 2
    pieces: list[tuple[str, str | None, int, int | None]] = []  # path, site, start, end (None: whole file)
    for path, site in zip(paths, sites):
        size = os.path.getsize(path)
        if size <= min_range_bytes or not line_per_row(path):
            pieces.append((path, site, 0, None))
            continue
        count = max(-(-size // max_range_bytes), min(pieces_wanted, size // min_range_bytes))
        pieces.extend((path, site, start, end) for start, end in byte_ranges(path, -(-size // count)))

    def read(path, site, start, end):
        if end is None:
            return iter_post_tables(path, site, rows_per_block)
        return iter_post_range_tables(path, start, end, site, rows_per_block)

    class _Source(Datasource):
        def estimate_inmemory_data_size(self):
            return sum(os.path.getsize(p) for p in paths) * 3

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            tasks = []
            for path, site, start, end in pieces:
                size = (end if end is not None else os.path.getsize(path)) - start
                meta = BlockMetadata(num_rows=None, size_bytes=size, exec_stats=None, input_files=(path,))
                tasks.append(
                    ReadTask(
                        lambda p=path, s=site, a=start, b=end: read(p, s, a, b),
                        meta,
                        schema=POSTS,
                        per_task_row_limit=per_task_row_limit,
                    )
                )
            return tasks

        def get_name(self):
            return "StackExchangeDump"

    # One block count per piece: Ray then neither splits the pieces' output nor stops fusing each read with
    # the per-post analysis that follows it.
    return ray.data.read_datasource(_Source(), override_num_blocks=len(pieces))

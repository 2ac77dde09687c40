"""Dump archives: Sites.xml, range-resumed downloads with checksums from a loopback mirror, and .7z reading."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import pytest

from crawl.download import (
    DownloadConfig,
    Downloader,
    DownloadError,
    archive_name,
    download_sites,
    parse_checksums,
    parse_sites_xml,
)
from crawl.dump import DumpError, iter_posts
from tests.fakeweb import Reply


@pytest.fixture(scope="module")
def beer_archive(beer_dump, tmp_path_factory) -> str:
    """A real site archive: the beer dump's Posts.xml packed as beer.stackexchange.com.7z with py7zr."""
    import py7zr

    folder = tmp_path_factory.mktemp("archive")
    xml = folder / "Posts.xml"
    with gzip.open(beer_dump) as src:
        xml.write_bytes(src.read())
    path = folder / "beer.stackexchange.com.7z"
    with py7zr.SevenZipFile(path, "w") as z:
        z.write(xml, "Posts.xml")
    xml.unlink()
    return str(path)


def test_archive_names_and_sites_xml(tmp_path):
    assert archive_name("beer") == "beer.stackexchange.com.7z"
    assert archive_name("stackoverflow") == "stackoverflow.com-Posts.7z"
    sites = tmp_path / "Sites.xml"
    sites.write_text(
        '\ufeff<?xml version="1.0" encoding="utf-8"?>\r\n<sites>\r\n'
        '  <row Id="1" Name="Stack Overflow" Url="https://stackoverflow.com" />\r\n'
        '  <row Id="2" Name="Beer" Url="https://beer.stackexchange.com" />\r\n'
        '  <row Id="3" Name="Beer Meta" Url="https://beer.meta.stackexchange.com" />\r\n'
        '  <row Id="4" Name="Meta SE" Url="https://meta.stackexchange.com" />\r\n</sites>\r\n',
        encoding="utf-8",
    )
    assert parse_sites_xml(str(sites)) == ["stackoverflow.com", "beer.stackexchange.com"]
    assert len(parse_sites_xml(str(sites), include_meta=True)) == 4
    assert parse_checksums("d41d8cd98f00b204e9800998ecf8427e  a.7z\nnot a line\n" + "ab" * 32 + " *b.7z") == {
        "a.7z": "md5:d41d8cd98f00b204e9800998ecf8427e",
        "b.7z": "sha256:" + "ab" * 32,
    }


@pytest.mark.slow
def test_a_7z_dump_streams_the_same_posts(beer_archive, beer_dump):
    from_archive = list(iter_posts(beer_archive))
    from_gzip = list(iter_posts(beer_dump))
    assert len(from_archive) == len(from_gzip) == 2354
    assert from_archive[0]["site"] == "beer.stackexchange.com" and from_archive[0]["origin"] == beer_archive
    assert [p["id"] for p in from_archive] == [p["id"] for p in from_gzip]
    assert list(iter_posts(os.path.dirname(beer_archive)))[5]["id"] == from_gzip[5]["id"]  # a folder works too


def test_a_broken_archive_is_a_clear_error(tmp_path):
    fake = tmp_path / "x.stackexchange.com.7z"
    fake.write_bytes(b"PK\x03\x04 not 7z at all")
    with pytest.raises(DumpError, match=r"x.stackexchange.com.7z: not a 7z archive"):
        list(iter_posts(str(fake)))
    with pytest.raises(DumpError, match=r"is a directory; expected Posts\.xml"):
        list(iter_posts(str(tmp_path / "..")))


def test_download_resumes_with_a_range_request_and_verifies_the_checksum(http_server, beer_archive, tmp_path):
    data = Path(beer_archive).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    name = "beer.stackexchange.com.7z"
    # first attempt: the connection dies halfway; the retry asks for the rest with Range and gets a 206
    http_server.script(f"/dumps/{name}", Reply(200, data, truncate=True), Reply(200, data, ranges=True))
    cfg = DownloadConfig(
        dest=str(tmp_path / "dl"),
        mirror=http_server.url("/dumps"),
        checksums={name: f"sha256:{sha}"},
        backoff_base=0.01,
    )
    downloader = Downloader(cfg)
    path = downloader.site_archive("beer")
    kept = downloader.resumed_bytes  # the whole chunks received before the connection died
    assert Path(path).read_bytes() == data and 0 < kept <= len(data) // 2
    ranges = [h.get("Range") for _, p, h in http_server.log if p.endswith(name)]
    assert ranges == [None, f"bytes={kept}-"]
    assert not os.path.exists(path + ".part")
    assert Downloader(cfg).site_archive("beer") == path and len(http_server.log) == 2  # already there

    # given checksums (build --checksums URL), an archive the list lacks is not fetched: it was taken unverified
    strict = DownloadConfig(
        dest=str(tmp_path / "dl2"), mirror=http_server.url("/dumps"), checksums={}, require_checksum=True
    )
    with pytest.raises(DownloadError, match=f"no checksum for {name} in --checksums"):
        Downloader(strict).site_archive("beer")
    assert len(http_server.log) == 2 and not os.path.exists(tmp_path / "dl2" / name)


def test_download_with_a_wrong_checksum_keeps_nothing(http_server, beer_archive, tmp_path):
    data = Path(beer_archive).read_bytes()
    http_server.route("/dumps/beer.stackexchange.com.7z", data)
    cfg = DownloadConfig(
        dest=str(tmp_path / "dl"),
        mirror=http_server.url("/dumps"),
        checksums={"beer.stackexchange.com.7z": "md5:" + "0" * 32},
    )
    with pytest.raises(DownloadError, match=r"/dumps/beer.stackexchange.com.7z: checksum mismatch .* got md5:"):
        Downloader(cfg).site_archive("beer")
    assert os.listdir(tmp_path / "dl") == []


def test_an_archive_already_there_with_another_checksum_is_named_and_kept(http_server, beer_archive, tmp_path):
    """A file under an archive's final name that the mirror's checksum does not match was not downloaded by this
    job (downloads are renamed only once verified): another release of the dump, or the user's own. It was deleted
    and fetched again; now it is named and kept, and nothing is fetched."""
    data = Path(beer_archive).read_bytes()
    http_server.route("/dumps/beer.stackexchange.com.7z", data)
    mine = tmp_path / "dl" / "beer.stackexchange.com.7z"
    mine.parent.mkdir()
    mine.write_bytes(b"last quarter's dump")
    cfg = DownloadConfig(
        dest=str(tmp_path / "dl"),
        mirror=http_server.url("/dumps"),
        checksums={"beer.stackexchange.com.7z": "sha256:" + hashlib.sha256(data).hexdigest()},
    )
    with pytest.raises(DownloadError, match=f"{mine}: already there, but its sha256 is not the mirror's"):
        Downloader(cfg).site_archive("beer")
    assert mine.read_bytes() == b"last quarter's dump" and os.listdir(tmp_path / "dl") == [mine.name]
    assert not [path for _, path, _ in http_server.log if path.endswith(".7z")]


def test_download_errors_name_the_url_and_redirects_stay_on_the_mirror(http_server, tmp_path):
    http_server.route(
        "/dumps/coffee.stackexchange.com.7z", "", status=302, headers={"Location": "http://evil.example/x.7z"}
    )
    cfg = DownloadConfig(dest=str(tmp_path / "dl"), mirror=http_server.url("/dumps"), max_retries=1, backoff_base=0.01)
    with pytest.raises(DownloadError) as err:
        download_sites(["nosuch", "coffee"], cfg, log=lambda m: None)
    assert "nosuch.stackexchange.com.7z: HTTP 404" in str(err.value)
    assert "outside 127.0.0.1" in str(err.value)


def test_build_with_a_checksums_url_that_lacks_a_site_fetches_nothing_unverified(http_server, tmp_path, capsys):
    """build --download beer --checksums URL: the list (read only once the build starts) holds no line for beer's
    archive, which was then downloaded unverified; now the job stops before fetching it."""
    from jobs import build_stackexchangeqa

    http_server.script("/sums.txt", Reply(200, ("ab" * 32 + "  coffee.stackexchange.com.7z\n").encode()))
    argv = ["--download", "beer", "--mirror", http_server.url("/dumps"), "--checksums", http_server.url("/sums.txt")]
    argv += ["--output", str(tmp_path / "seqa"), "--download-dir", str(tmp_path / "dl")]
    assert build_stackexchangeqa.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no checksum for beer.stackexchange.com.7z in --checksums" in err, err
    assert [path for _, path, _ in http_server.log] == ["/sums.txt"]  # the archive was never asked for
    assert not (tmp_path / "seqa").exists()

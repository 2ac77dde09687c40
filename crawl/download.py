"""Official dump archives: which sites exist (`Sites.xml`), downloading a site's `.7z` from a mirror with
HTTP range resume and checksum verification, and getting `Posts.xml` out of it.

Archives are named by host (`beer.stackexchange.com.7z`); Stack Overflow's is split per table
(`stackoverflow.com-Posts.7z`). A download writes `NAME.part` and renames it only once complete and verified,
so a killed download resumes from the bytes it has (`Range: bytes=N-`) and a bad archive never sits under
the final name. Mirrors such as archive.org redirect to their own storage hosts: redirects are followed only
within the mirror's domain.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin

import requests
from lxml import etree

from crawl.http import USER_AGENT, host_of
from crawl.sites import site_host
from runtime.errors import scrub

DEFAULT_MIRROR = "https://archive.org/download/stackexchange"


class DownloadError(RuntimeError):
    """A download failed for good; the message names the URL and the reason (secret parameters scrubbed)."""

    def __init__(self, message: str):
        super().__init__(scrub(message))


def archive_name(site: str) -> str:
    host = site_host(site)
    return "stackoverflow.com-Posts.7z" if host == "stackoverflow.com" else f"{host}.7z"


def parse_sites_xml(path: str, include_meta: bool = False) -> list[str]:
    """Site hosts listed in a dump's `Sites.xml` (`<sites><row Url="https://beer.stackexchange.com" .../>`)."""
    hosts = []
    try:
        for _, row in etree.iterparse(path, tag="row"):
            url = row.get("Url") or ""
            host = host_of(url) or (url.split("//")[-1].strip("/") if url else "")
            if host and (include_meta or (".meta." not in f".{host}" and not host.startswith("meta."))):
                hosts.append(host)
            row.clear()
    except etree.XMLSyntaxError as err:
        raise DownloadError(f"{path}: line {err.lineno}: malformed Sites.xml: {err.msg}") from err
    except OSError as err:
        raise DownloadError(f"{path}: cannot read: {err}") from err
    return list(dict.fromkeys(hosts))


def parse_checksums(text: str) -> dict[str, str]:
    """`md5sum`/`sha256sum` output ('HEX  NAME' lines) as {NAME: 'md5:HEX' or 'sha256:HEX'}."""
    sums = {}
    for line in text.splitlines():
        parts = line.strip().split()
        if len(parts) >= 2 and all(c in "0123456789abcdefABCDEF" for c in parts[0]):
            kind = {32: "md5", 40: "sha1", 64: "sha256"}.get(len(parts[0]))
            if kind:
                sums[parts[-1].lstrip("*")] = f"{kind}:{parts[0].lower()}"
    return sums


def file_digest(path: str, kind: str) -> str:
    digest = hashlib.new(kind)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class DownloadConfig:
    dest: str
    mirror: str = DEFAULT_MIRROR
    checksums: dict[str, str] = field(default_factory=dict)  # archive name -> "md5:HEX" / "sha256:HEX"
    require_checksum: bool = False  # the job sets it with --checksums: an archive the list lacks is not fetched
    max_retries: int = 5
    backoff_base: float = 1.0
    timeout: float = 60.0
    chunk_bytes: int = 1 << 16  # what a dropped connection can cost: the last unfinished chunk
    user_agent: str = USER_AGENT


class Downloader:
    def __init__(self, cfg: DownloadConfig, sleep=time.sleep):
        self.cfg = cfg
        self.session = requests.Session()
        self.session.headers["User-Agent"] = cfg.user_agent
        self.sleep = sleep
        mirror_host = host_of(cfg.mirror).split(":")[0]
        labels = mirror_host.split(".")
        self.domain = mirror_host if mirror_host.replace(".", "").isdigit() else ".".join(labels[-2:])
        self.resumed_bytes = 0  # bytes not downloaded again thanks to a range request

    def _allowed(self, url: str) -> bool:
        host = host_of(url).split(":")[0]
        return host == self.domain or host.endswith("." + self.domain)

    def site_archive(self, site: str) -> str:
        """Download (or find already downloaded) a site's archive; returns its path."""
        name = archive_name(site)
        return self.fetch(urljoin(self.cfg.mirror.rstrip("/") + "/", name), name)

    def fetch(self, url: str, name: str) -> str:
        os.makedirs(self.cfg.dest, exist_ok=True)
        target = os.path.join(self.cfg.dest, os.path.basename(name))
        expected = self.cfg.checksums.get(name)
        if expected is None and self.cfg.require_checksum:
            raise DownloadError(
                f"{url}: no checksum for {name} in --checksums; an archive without one would be taken unchecked"
            )
        if os.path.exists(target):
            if expected is None or self._matches(target, expected):
                return target
            # never ours (a download is renamed to its final name only once verified): another release of the
            # dump, or the user's own file. Deleting gigabytes the user did not ask to lose is not this job's call.
            kind, _ = expected.split(":", 1)
            raise DownloadError(
                f"{target}: already there, but its {kind} is not the mirror's for {name} ({expected}): another "
                "release of the dump, or not a download of this job; move it away (or delete it) and run again"
            )
        partial = target + ".part"
        reason = ""
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                self.sleep(random.uniform(0, self.cfg.backoff_base * 2 ** (attempt - 1)))
            try:
                done = self._transfer(url, partial)
            except requests.RequestException as err:
                reason = f"{type(err).__name__}: {scrub(str(err))[:160]}"
                continue
            if done is not True:
                reason = done
                if done.startswith("HTTP 4") and not done.startswith(("HTTP 408", "HTTP 429")):
                    raise DownloadError(f"{url}: {done}")
                continue
            if expected and not self._matches(partial, expected):
                kind, _ = expected.split(":", 1)
                got = file_digest(partial, kind)
                os.unlink(partial)
                raise DownloadError(f"{url}: checksum mismatch for {name}: expected {expected}, got {kind}:{got}")
            os.replace(partial, target)
            return target
        raise DownloadError(
            f"{url}: {reason} after {self.cfg.max_retries + 1} attempts "
            f"({os.path.getsize(partial) if os.path.exists(partial) else 0:,} bytes kept for resume)"
        )

    @staticmethod
    def _matches(path: str, expected: str) -> bool:
        kind, _, hexdigest = expected.partition(":")
        return file_digest(path, kind) == hexdigest.lower()

    def _transfer(self, url: str, partial: str):
        """Append the missing bytes to `partial`; True when the body ended complete, else a reason."""
        have = os.path.getsize(partial) if os.path.exists(partial) else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        for _ in range(10):
            response = self.session.get(
                url, headers=headers, stream=True, timeout=self.cfg.timeout, allow_redirects=False
            )
            if response.is_redirect:
                target = urljoin(url, response.headers.get("Location", ""))
                response.close()
                if not self._allowed(target):
                    raise DownloadError(f"{url}: redirect to {host_of(target) or target!r} outside {self.domain}")
                url = target
                continue
            break
        else:
            return "too many redirects"
        with response:
            if response.status_code == 416 and have:
                # The server has nothing past our bytes: the partial file is whole (verified by checksum).
                return True
            if response.status_code == 206:
                start = int(response.headers.get("Content-Range", "bytes 0-").split()[1].split("-")[0])
                if start != have:
                    return f"server resumed at byte {start}, not {have}"
                mode = "ab"
                self.resumed_bytes += have
            elif response.status_code == 200:
                mode, have = "wb", 0  # no range support: start over
            else:
                return f"HTTP {response.status_code}"
            expected_len = response.headers.get("Content-Length")
            written = 0
            with open(partial, mode) as out:
                for chunk in response.iter_content(self.cfg.chunk_bytes):
                    out.write(chunk)
                    written += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if expected_len is not None and written != int(expected_len):
                return f"connection closed after {written:,} of {int(expected_len):,} bytes"
        return True


def extract_posts(archive: str, dest_dir: str) -> str:
    """`Posts.xml` out of a site archive into `dest_dir` (py7zr streams it to disk); returns its path."""
    import py7zr

    try:
        with py7zr.SevenZipFile(archive, mode="r") as z:
            names = z.getnames()
            member = next((n for n in names if os.path.basename(n) == "Posts.xml"), None)
            if member is None:
                raise DownloadError(f"{archive}: no Posts.xml inside (has {', '.join(names[:8])})")
            z.extract(path=dest_dir, targets=[member])
    except (py7zr.exceptions.Bad7zFile, EOFError, OSError) as err:
        raise DownloadError(f"{archive}: not a readable 7z archive: {err}") from err
    return os.path.join(dest_dir, member)


def download_sites(sites: list[str], cfg: DownloadConfig, parallel: int = 2, log=print) -> list[str]:
    """Archives of `sites`, downloaded `parallel` at a time (resuming partial files); raises on the first
    site that fails for good, after the others finished, naming every failed URL."""
    from concurrent.futures import ThreadPoolExecutor

    def one(site):
        started = time.time()
        downloader = Downloader(cfg)
        path = downloader.site_archive(site)
        size = os.path.getsize(path)
        log(
            f"download {archive_name(site)}: {size / 1e6:,.1f} MB in {time.time() - started:.1f} s"
            + (f" ({downloader.resumed_bytes / 1e6:,.1f} MB resumed)" if downloader.resumed_bytes else "")
        )
        return path

    paths, errors = [], []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for future in [pool.submit(one, s) for s in sites]:
            try:
                paths.append(future.result())
            except DownloadError as err:
                errors.append(str(err))
    if errors:
        raise DownloadError("; ".join(errors))
    return paths


def load_checksums(source: str | None, timeout: float = 60.0) -> dict[str, str]:
    """Checksums from a local file or an http(s) URL in md5sum/sha256sum format; {} when `source` is None."""
    if not source:
        return {}
    if host_of(source):
        response = requests.get(source, timeout=timeout, headers={"User-Agent": USER_AGENT})
        if response.status_code != 200:
            raise DownloadError(f"{source}: HTTP {response.status_code} fetching checksums")
        return parse_checksums(response.text)
    with open(source, encoding="utf-8") as f:
        return parse_checksums(f.read())

"""How a failure reaches the user: Ray's wrappers opened to the error inside, our own errors kept whole."""

from __future__ import annotations

from ray.exceptions import RayTaskError

from runtime.errors import one_line, unwrap


class DownloadError(RuntimeError):
    pass


def test_rays_wrappers_are_opened_and_our_errors_raised_from_a_librarys_keep_their_words():
    """`DownloadError(f"{path}: line 4: malformed Sites.xml: ...") from err` printed lxml's message alone, and
    `--embeddings F`'s "F: not a .npy matrix" numpy's: unwrap followed every `__cause__`, not only Ray's."""
    try:
        try:
            raise SyntaxError("Couldn't find end of Start Tag row, line 4, column 1")
        except SyntaxError as err:
            raise DownloadError("Sites.xml: line 4: malformed Sites.xml: Couldn't find end of Start Tag row") from err
    except DownloadError as ours:
        assert unwrap(ours) is ours
        assert one_line(ours).startswith("DownloadError: Sites.xml: line 4: malformed Sites.xml")

    inner = ValueError("shard.parquet: row group 0: bad page")
    for wrapped in (
        RayTaskError("read", "Traceback ...", inner),
        RayTaskError("read", "...", inner).as_instanceof_cause(),
    ):
        assert unwrap(wrapped) is inner and one_line(unwrap(wrapped)) == "shard.parquet: row group 0: bad page"

"""The output directory as Hadoop sees it: `--out` is a Hadoop URI (`file:`, `hdfs:`, `s3a:`, ... whatever
the cluster's Hadoop configuration reaches) or a local path (made a `file:` URI), and every file the job
leaves there goes through Hadoop's FileSystem in the driver's JVM (Spark's own, with the session's Hadoop
configuration) or is written by Spark itself (the tables, `df.write`): never through Python's local file
calls, so the same command writes to a laptop's disk and to a cluster's HDFS or object store.

The files the driver writes itself are small (run.json, report.html, the redrive requests); reads are
bounded (MAX_READ_BYTES).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pipeline.errors import InsightsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_READ_BYTES = 1 << 20  # a run.json read back is far smaller; a larger file there is not ours


def location(out: str | Path) -> str:
    """`out` as a URI without a trailing slash: a URI with a scheme as given, a local path as `file:` (made
    absolute, so Spark's default filesystem, which may be HDFS, never resolves it)."""
    text = str(out)
    scheme = urlsplit(text).scheme
    if len(scheme) > 1:  # a drive letter is not a scheme
        return text.rstrip("/") or text
    return Path(text).absolute().as_uri()


def local(uri: str) -> Path | None:
    """The local path of a `file:` URI, else None."""
    parts = urlsplit(uri)
    return Path(parts.path) if parts.scheme == "file" and parts.netloc in ("", "localhost") else None


def join(uri: str, *names: str) -> str:
    return "/".join([uri.rstrip("/"), *names])


def name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Entry:
    uri: str
    name: str
    is_dir: bool
    modified_ms: int


class Files:
    """Hadoop's FileSystem for the URIs under `root`, through the session's JVM."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm: Any = spark._jvm
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()
        try:
            self._fs = jvm.org.apache.hadoop.fs.Path(root).getFileSystem(self._conf)
        except Exception as e:  # no FileSystem for the scheme, a bad authority: the JVM says which
            raise InsightsError(f"--out {root}: {_reason(e)}") from None

    def _path(self, uri: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(uri)

    def exists(self, uri: str) -> bool:
        return bool(self._fs.exists(self._path(uri)))

    def is_dir(self, uri: str) -> bool:
        path = self._path(uri)
        return bool(self._fs.exists(path) and self._fs.getFileStatus(path).isDirectory())

    def children(self, uri: str) -> list[Entry]:
        """What the directory holds, by name; [] when it does not exist."""
        path = self._path(uri)
        if not self._fs.exists(path):
            return []
        found = [
            Entry(join(uri, s.getPath().getName()), s.getPath().getName(), bool(s.isDirectory()),
                  int(s.getModificationTime()))
            for s in self._fs.listStatus(path)
        ]  # fmt: skip
        return sorted(found, key=lambda e: e.name)

    def mkdirs(self, uri: str) -> None:
        self._fs.mkdirs(self._path(uri))

    def read_text(self, uri: str) -> str | None:
        """The file's text (UTF-8), None when it is missing, a directory, larger than MAX_READ_BYTES or
        unreadable (on a local disk, a file changed by hand fails its checksum file's check)."""
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

        path = self._path(uri)
        if not self._fs.exists(path):
            return None
        status = self._fs.getFileStatus(path)
        if status.isDirectory() or status.getLen() > MAX_READ_BYTES:
            return None
        stream = self._fs.open(path)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        except Py4JJavaError:
            return None
        finally:
            stream.close()
        return bytes(data).decode("utf-8", errors="replace")

    def write_text(self, uri: str, text: str) -> None:
        """The file written whole (replaced if there), its parent directories made."""
        stream = self._fs.create(self._path(uri), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def delete(self, uri: str) -> None:
        """The file or directory (with what it holds) removed; nothing when it is not there."""
        self._fs.delete(self._path(uri), True)

    def rename(self, source: str, target: str) -> bool:
        return bool(self._fs.rename(self._path(source), self._path(target)))

    def copy(self, source: str, target: str) -> None:
        """A file or directory copied to `target` (what was there first removed)."""
        self.delete(target)
        self._jvm.org.apache.hadoop.fs.FileUtil.copy(
            self._fs, self._path(source), self._fs, self._path(target), False, self._conf
        )


def _reason(e: BaseException) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        if "Exception: " in line:
            return line.split("Exception: ", 1)[1][:300]
    return (text.splitlines()[0] if text else type(e).__name__)[:300]

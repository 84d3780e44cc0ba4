"""The output directory as Hadoop sees it: `--out` is a Hadoop URI (`file:`, `hdfs:`, `s3a:`, ... whatever
the cluster's Hadoop configuration reaches) or a local path (made a `file:` URI), and every file the job
leaves there goes through Hadoop's FileSystem in the driver's JVM (Spark's own, with the session's Hadoop
configuration) or is written by Spark itself (the tables, `df.write`): never through Python's local file
calls, so the same command writes to a laptop's disk and to a cluster's HDFS or object store.

The files the driver writes itself are small (run.json, report.html, the redrive requests); reads are
bounded (MAX_READ_BYTES). A Hadoop error (no such filesystem, permissions, credentials) is an InsightsError
naming the URI and Hadoop's reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pipeline.errors import InsightsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_READ_BYTES = 1 << 20  # a run.json read back is far smaller; a larger file there is not ours
RAW_LOCAL = "org.apache.hadoop.fs.RawLocalFileSystem"  # file: without the .crc beside each file


def location(out: str | Path) -> str:
    """`out` as a URI without a trailing slash: a URI with a scheme as given, a local path as `file:` (made
    absolute, so Spark's default filesystem, which may be HDFS, never resolves it; not percent-encoded,
    which Hadoop's Path would keep literally)."""
    text = str(out)
    scheme = urlsplit(text).scheme
    if len(scheme) > 1:  # a drive letter is not a scheme
        return text.rstrip("/") or text
    return "file://" + str(Path(text).absolute())


def local(uri: str) -> Path | None:
    """The local path of a `file:` URI, else None."""
    parts = urlsplit(uri)
    return Path(parts.path) if parts.scheme == "file" and parts.netloc in ("", "localhost") else None


def join(uri: str, *names: str) -> str:
    return "/".join([uri.rstrip("/"), *names])


@dataclass(frozen=True)
class Entry:
    uri: str
    name: str
    is_dir: bool
    modified_ms: int


class Files:
    """Hadoop's FileSystem for the URIs under `root`, through the session's JVM."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root
        jvm: Any = spark._jvm
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()
        with self._hadoop(root):
            self._fs = jvm.org.apache.hadoop.fs.Path(root).getFileSystem(self._conf)
            # run.json, report.html and the requests are written and read past a local disk's .crc files
            # (none beside them, and one edited by hand is still read): file:'s filesystem (Hadoop's
            # LocalFileSystem, or Hive's wrapper of it, as Spark has it) unwrapped to the raw one
            self._text = self._fs
            if self._fs.getScheme() == "file":
                for _ in range(3):
                    if self._text.getClass().getName() == RAW_LOCAL:
                        break
                    self._text = self._text.getRawFileSystem()
                else:
                    self._text = self._fs

    @contextlib.contextmanager
    def _hadoop(self, uri: str) -> Iterator[None]:
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

        try:
            yield
        except Py4JJavaError as e:
            where = "" if uri == self.root else f"{uri}: "
            raise InsightsError(f"--out {self.root}: {where}{_reason(e)}") from None

    def _path(self, uri: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(uri)

    def exists(self, uri: str) -> bool:
        with self._hadoop(uri):
            return bool(self._fs.exists(self._path(uri)))

    def is_dir(self, uri: str) -> bool:
        with self._hadoop(uri):
            path = self._path(uri)
            return bool(self._fs.exists(path) and self._fs.getFileStatus(path).isDirectory())

    def children(self, uri: str) -> list[Entry]:
        """What the directory holds, by name; [] when it does not exist."""
        with self._hadoop(uri):
            path = self._path(uri)
            if not self._fs.exists(path):
                return []
            found = [
                Entry(join(uri, s.getPath().getName()), s.getPath().getName(), bool(s.isDirectory()),
                      int(s.getModificationTime()))
                for s in self._fs.listStatus(path)
            ]  # fmt: skip
        return sorted(found, key=lambda e: e.name)

    def newest_ms(self, uri: str) -> int:
        """When anything in the directory (or the file) last changed: an object store gives a directory no
        time of its own."""
        with self._hadoop(uri):
            path = self._path(uri)
            newest = int(self._fs.getFileStatus(path).getModificationTime())
            files = self._fs.listFiles(path, True)
            while files.hasNext():
                newest = max(newest, int(files.next().getModificationTime()))
        return newest

    def mkdirs(self, uri: str) -> None:
        with self._hadoop(uri):
            if not self._fs.mkdirs(self._path(uri)):
                raise InsightsError(f"--out {self.root}: cannot make the directory {uri}")

    def read_text(self, uri: str) -> str | None:
        """The file's text (UTF-8), None when it is missing, a directory or larger than MAX_READ_BYTES."""
        with self._hadoop(uri):
            path = self._path(uri)
            if not self._text.exists(path):
                return None
            status = self._text.getFileStatus(path)
            if status.isDirectory() or status.getLen() > MAX_READ_BYTES:
                return None
            stream = self._text.open(path)
            try:
                data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            finally:
                stream.close()
        return bytes(data).decode("utf-8", errors="replace")

    def write_text(self, uri: str, text: str) -> None:
        """The file written whole (replaced if there), its parent directories made."""
        with self._hadoop(uri):
            stream = self._text.create(self._path(uri), True)
            try:
                stream.write(bytearray(text.encode("utf-8")))
            finally:
                stream.close()

    def delete(self, uri: str) -> None:
        """The file or directory (with what it holds) removed; nothing when it is not there."""
        with self._hadoop(uri):
            self._fs.delete(self._path(uri), True)

    def rename(self, source: str, target: str) -> None:
        with self._hadoop(source):
            if not self._fs.rename(self._path(source), self._path(target)):
                raise InsightsError(f"--out {self.root}: cannot move {source} to {target}")


def _reason(e: BaseException) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        if "Exception: " in line:
            return line.split("Exception: ", 1)[1][:300]
    return (text.splitlines()[0] if text else type(e).__name__)[:300]

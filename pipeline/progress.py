"""The job's progress on a terminal: the step and its Spark stages' tasks done / all, redrawn twice a second;
elsewhere (a log, a pipe) each step on its own line."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Progress:
    """A context manager; `step(name)` says a step has started ("" when the last one ended). Every line
    starts with `label`; `quiet` says nothing at all."""

    def __init__(self, spark: SparkSession, *, label: str, quiet: bool = False, stream: TextIO | None = None):
        self.spark, self.label, self.quiet = spark, label, quiet
        self.stream = stream or sys.stderr
        self.current = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tty = self.stream.isatty()

    def __enter__(self) -> Progress:
        if self._tty and not self.quiet:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def step(self, name: str) -> None:
        self.current = name
        if name and not self._tty and not self.quiet:
            self.stream.write(f"{self.label}: {name} ...\n")
            self.stream.flush()

    def _run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(0.5):
            if not self.current:
                continue
            done = total = 0
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info:
                    done, total = done + info.numCompletedTasks, total + info.numTasks
            bar = f" [{'#' * (20 * done // total):<20}] {done}/{total} tasks" if total else ""
            self.stream.write(f"\r\033[K{self.label}: {self.current}{bar}")
            self.stream.flush()
        self.stream.write("\r\033[K")
        self.stream.flush()

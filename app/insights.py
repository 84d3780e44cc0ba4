"""`charon insights` and `charon export`: the commands over the DLQ insights library (pipeline/). They parse
their options, find the store (store_of) and print; the job is pipeline/job.py, the export pipeline/jsonl.py.

  charon insights --storage-uri redis://127.0.0.1:6379/0 --out ./insights          (local[*])
  spark-submit --master spark://host:7077 app/submit.py --storage-uri ... --out /shared/insights

Both run main(). The store is the service's: its Settings (CHARON_STORAGE_URI, CHARON_NAMESPACE, and with
CHARON_POOLING every pool of the catalogue in CHARON_MANAGEMENT_URI), --namespace taking the place of
CHARON_NAMESPACE; --storage-uri names one store, read as it is, pooling or not (store_of). The checks that
fail fast (the store, Java) run before Spark starts. --out is a local directory or a Hadoop URI; the tables
(and --keep-messages, and the records --since-last keeps) are written from the executors, so on a cluster it
must be a path every node sees (HDFS, s3a://, a shared mount).
Exit codes: 0 done, 1 cannot run (the message says why), 2 a usage error or the [insights] extra missing,
3 nothing to analyse. This module imports no third-party package of the extra, so that `charon --help` and
`charon insights --help` work without it; the commands check for it before anything else (missing_extra).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from app.settings import Settings
from core import sealing
from pipeline import DEFAULT_MAX_BODY_BYTES, load, trends
from pipeline.errors import InsightsError, NothingToAnalyse

EXIT_FAILED, EXIT_USAGE, EXIT_EMPTY = 1, 2, 3
# What each command needs of the `insights` extra (pyproject.toml), which serving never needs: export writes
# records through pyarrow only; insights runs Spark.
NEEDS = {"insights": ("pyspark", "pyarrow", "pandas"), "export": ("pyarrow",)}


def missing_extra(command: str) -> bool:
    """Says, in one line, how to install the `insights` extra when a package `command` needs is missing."""
    missing = [name for name in NEEDS[command] if importlib.util.find_spec(name) is None]
    if missing:
        _say(
            command,
            f"needs the insights extra ({', '.join(missing)} not installed): run `make insights`, or "
            "`pip install -e '.[insights]'` in Charon's checkout (the image: its `insights` target)",
        )
    return bool(missing)


def _say(command: str, text: str) -> None:
    sys.stderr.write(f"charon {command}: {text}\n")
    sys.stderr.flush()


def _exit_code(e: InsightsError) -> int:
    return EXIT_EMPTY if isinstance(e, NothingToAnalyse) else EXIT_FAILED


def bounded(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`, else argparse's usage error naming the bounds."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not from {low} to {high}")
        return value

    return parse


def store_of(args: argparse.Namespace, command: str) -> load.DeadLetterStore:
    """The store the service would open (with CHARON_POOLING, every pool of its catalogue), --namespace in
    place of its setting; --storage-uri names one store, read as it is, pooling or not. With none configured,
    the embedded store a `charon serve` runs under CHARON_DATA_DIR (its unix socket), said on stderr."""
    try:
        settings = Settings()
    except (ValidationError, ValueError) as e:
        raise InsightsError(f"the CHARON_ settings are not valid: {e}") from None
    sealing.use(settings.encryption.keyring())  # encrypted bodies opened (pipeline/records.py)
    namespace = args.namespace or settings.namespace
    if args.storage_uri:
        return load.DeadLetterStore(args.storage_uri, namespace)
    uri = settings.store_uri()
    if uri is not None:
        return load.DeadLetterStore(uri, namespace, pooled=settings.pooling)
    from app.embedded import EmbeddedRedis

    uri = EmbeddedRedis.running(settings.data_dir)
    if uri is None:
        raise InsightsError(
            f"no store is configured (CHARON_STORAGE_URI) and no `charon serve` runs an embedded one under "
            f"{settings.data_dir.resolve()} (CHARON_DATA_DIR): say where the dead letters are with "
            "--storage-uri URI" + (", or --input FILE.jsonl" if command == "insights" else "")
        )
    _say(command, f"reading the embedded store of `charon serve` at {uri}")
    return load.DeadLetterStore(uri, namespace)


STORAGE_URI_HELP = (
    "read this one store (default: the service's: CHARON_STORAGE_URI, or with CHARON_POOLING every pool of "
    "the catalogue in CHARON_MANAGEMENT_URI, else the embedded store `charon serve` runs in CHARON_DATA_DIR)"
)
NAMESPACE_HELP = "key/collection prefix (default: CHARON_NAMESPACE or charon)"


# -- charon insights ---------------------------------------------------------------------------------------


def add_insights_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--storage-uri", help=STORAGE_URI_HELP)
    src.add_argument("--input", nargs="+", metavar="JSONL", help="read `charon export` files instead")
    p.add_argument("--namespace", help=NAMESPACE_HELP)
    p.add_argument("--project", help="one project only (default: all)")
    p.add_argument(
        "--queue",
        action="append",
        dest="queues",
        metavar="DLQ",
        help="a DLQ to read (repeatable; default: every DLQ)",
    )
    p.add_argument("--out", default="insights", help="output directory (default: ./insights)")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument(
        "--partitions", type=bounded(1, 100_000), help="read partitions (default: 4 per core Spark has)"
    )
    p.add_argument(
        "--max-body-bytes",
        type=bounded(1, 64 * 1024 * 1024),
        default=DEFAULT_MAX_BODY_BYTES,
        help="longer bodies are counted as huge (at most 64 MiB)",
    )
    p.add_argument(
        "--top",
        type=bounded(1, 1000),
        default=15,
        help="signatures and repeat offenders in the report (1-1000)",
    )
    p.add_argument("--keep-messages", action="store_true", help="also write every analysed message (Parquet)")
    p.add_argument(
        "--since-last",
        action="store_true",
        help="read only what was dead-lettered since the previous run into --out with the same --project "
        "and --queue (per DLQ, from the marker that run stopped at) and add it to the records that run kept, "
        "so the tables count every dead letter seen; exit 3 when nothing was",
    )
    p.add_argument(
        "--keep-runs",
        type=bounded(1, trends.MAX_RUNS),
        default=trends.KEEP_RUNS,
        help=f"runs kept in <out>/runs for the next to compare with (default {trends.KEEP_RUNS}, "
        f"at most {trends.MAX_RUNS})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run_insights(args: argparse.Namespace) -> int:
    """The command: the job run (pipeline/job.py: the store probed, Spark started, the tables and report
    written), then a summary on stdout. Progress goes to stderr, what the JVM prints to spark.log (in --out
    when it is a local directory, else in this user's temporary one)."""
    if missing_extra("insights"):
        return EXIT_USAGE
    from pipeline import job, output

    try:
        if args.since_last and args.input:
            _say("insights", "--since-last reads a store (--storage-uri), not --input files")
            return EXIT_USAGE
        insights = job.run(
            job.Job(
                out=args.out,
                store=None if args.input else store_of(args, "insights"),
                inputs=args.input or (),
                project=args.project,
                queues=args.queues,
                master=args.master,
                partitions=args.partitions,
                max_body_bytes=args.max_body_bytes,
                top=args.top,
                keep_messages=args.keep_messages,
                since_last=args.since_last,
                keep_runs=args.keep_runs,
            ),
            say=None if args.quiet else functools.partial(_say, "insights"),
        )
    except InsightsError as e:
        _say("insights", str(e))
        return _exit_code(e)
    sys.stdout.write(output.summary(insights, args.out, top=5) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`charon insights` on its own, as spark-submit runs it (app/submit.py)."""
    parser = argparse.ArgumentParser(
        prog="charon insights", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_insights_arguments(parser)
    return run_insights(parser.parse_args(argv))


# -- charon export -----------------------------------------------------------------------------------------


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-uri", help=STORAGE_URI_HELP)
    p.add_argument("--namespace", help=NAMESPACE_HELP)
    p.add_argument("--project", help="one project only (default: every project with such a queue)")
    p.add_argument(
        "--queue", action="append", dest="queues", metavar="DLQ", required=True, help="the DLQ (repeatable)"
    )
    p.add_argument("--out", default="-", help="output file (default: standard output)")


def run_export(args: argparse.Namespace) -> int:
    """`charon export`: the DLQs' messages as JSON Lines on --out (pipeline/jsonl.py), a count on stderr."""
    if missing_extra("export"):
        return EXIT_USAGE
    from pipeline import jsonl

    try:
        exported = jsonl.export(
            store_of(args, "export"),
            sys.stdout.buffer if args.out == "-" else Path(args.out),
            project=args.project,
            queues=args.queues,
        )
    except InsightsError as e:
        _say("export", str(e))
        return _exit_code(e)
    _say("export", f"{exported.messages:,} messages from {exported.queues} queue(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

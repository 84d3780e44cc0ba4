"""DLQ insights: a library of PySpark steps that read dead-lettered messages and find why they died. The
commands over it (`charon insights`, `charon export`) are app/insights.py: they parse and print.

job.py          `charon insights` from its options (Job) to the tables and report written: the steps below
records.py      the one record layout every input becomes (Arrow schema + Spark DDL)
datasource.py   the Spark Python data source `charon` over a store's dead-letter export (storage/export.py;
                one partition per marker range of a DLQ)
jsonl.py        the records as JSON Lines both ways: a store's DLQs written (`charon export`, pyarrow only),
                and such files read back, parsed in Spark SQL
load.py         what the job reads: a store (DeadLetterStore, its DLQs probed first) or export files
spark.py        the SparkSession: Java checked, the data source registered, the code shipped to executors
analysis.py     the aggregates, as DataFrame -> DataFrame functions in Spark SQL (no Python UDFs)
aggregate.py    every aggregate over the records, cached, with a bounded view collected
insights.py     what a run collects (Insights), and the view sizes aggregate.py and report.py share
purepython.py   the same aggregates in one Python process: the benchmark's baseline and the tests' oracle
report.py       the HTML report (inline SVG charts) from the collected views
output.py       the tables (by Spark) and report written to the output URI, and the printed summary
hadoop.py       the output URI through Hadoop's FileSystem (file:, hdfs:, s3a:, ...)
progress.py     the job's progress on stderr
errors.py       why the job cannot run (InsightsError, NothingToAnalyse, JobFailed)
"""

from core.signatures import DEFAULT_MAX_BODY_BYTES  # a longer body is counted as "huge", not parsed

__all__ = ["DEFAULT_MAX_BODY_BYTES"]

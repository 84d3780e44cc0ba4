"""DLQ insights: a PySpark job that reads dead-lettered messages and finds why they died.

records.py      the one record layout every input becomes (Arrow schema + Spark DDL), and its JSON Lines form
sources.py      plain readers of a store's dead letters, in marker ranges (Redis and MongoDB, sync clients)
datasource.py   the Spark Python data source `charon` over those readers (one partition per range)
jsonl.py        the same records from a `charon export` file, parsed in Spark SQL
analysis.py     the aggregates, as DataFrame -> DataFrame functions in Spark SQL (no Python UDFs)
purepython.py   the same aggregates in one Python process: the benchmark's baseline and the tests' oracle
report.py       the HTML report (inline SVG charts) from the collected aggregates
job.py          run the whole job (`charon insights`, or `spark-submit pipeline/job.py` on a cluster)
export.py       `charon export`: a DLQ as JSON Lines
"""

DEFAULT_MAX_BODY_BYTES = 65_536  # a longer body is counted as "huge", not parsed

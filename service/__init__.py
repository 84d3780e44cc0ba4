"""The use cases that span several storage calls or run in the background: a queue's metadata write with
its DLQ cycle check (queues.py), redrive preview, start and run (redrive.py), the sweeper (sweeper.py).
The API, the CLI and the background runners call them; they call only core/ and storage/."""

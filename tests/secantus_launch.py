"""Runs a SecantusDB server (a MongoDB wire-protocol server on WiredTiger) for the tests: in memory, on
127.0.0.1:<port>, as a single-node replica set (or standalone). The `secantusd-py` CLI does not pass the TTL
sweep interval through, hence this launcher. Prints "listening <uri>" once it accepts connections.

A transaction whose client died (the kill -9 tests) stays open, and every write that touches what it wrote
waits on it: SecantusDB, as mongod, retries such a write without bound. mongod aborts a transaction idle
for its lifetime (60 s) in a periodic job; SecantusDB only when another transaction's command arrives, so a
write could wait forever. The launcher runs that job every second, with a 15 s lifetime: a write in any test
waits at most that long on a dead client's transaction, well inside the tests' 60 s store timeout, and no
live transaction of the tests idles that long."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from secantus import SecantusDBServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttl-sweep", type=float, default=1.0)
    parser.add_argument("--transaction-lifetime", type=float, default=15.0, help="seconds idle before abort")
    parser.add_argument("--standalone", action="store_true", help="no replica set (so no transactions)")
    args = parser.parse_args()
    server = SecantusDBServer(
        host="127.0.0.1",
        port=args.port,
        storage_path=":memory:",
        ttl_sweep_seconds=args.ttl_sweep,
        replica_set_name=None if args.standalone else "secantus",
        transaction_lifetime_seconds=args.transaction_lifetime,
    )

    def stop(*_: Any) -> None:
        server.stop()
        sys.exit(0)

    def reap() -> None:
        while True:
            server.transactions.prune_expired()
            threading.Event().wait(1.0)

    signal.signal(signal.SIGTERM, stop)
    server.start()
    threading.Thread(target=reap, daemon=True, name="abort-expired-transactions").start()
    print("listening", server.uri, flush=True)
    server.wait()


if __name__ == "__main__":
    main()

"""Runs a SecantusDB server (a MongoDB wire-protocol server on WiredTiger) for the tests: in memory, on
127.0.0.1:<port>, as a single-node replica set (or standalone). The `secantusd-py` CLI does not pass the TTL
sweep interval through, hence this launcher. Prints "listening <uri>" once it accepts connections."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from secantus import SecantusDBServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttl-sweep", type=float, default=1.0)
    parser.add_argument("--standalone", action="store_true", help="no replica set (so no transactions)")
    args = parser.parse_args()
    server = SecantusDBServer(
        host="127.0.0.1",
        port=args.port,
        storage_path=":memory:",
        ttl_sweep_seconds=args.ttl_sweep,
        replica_set_name=None if args.standalone else "secantus",
    )

    def stop(*_: Any) -> None:
        server.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.start()
    print("listening", server.uri, flush=True)
    server.wait()


if __name__ == "__main__":
    main()

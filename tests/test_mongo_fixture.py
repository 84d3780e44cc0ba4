"""The MongoDB test server (tests/secantus_launch.py): a transaction left open by a client that was killed
holds up writes to what it wrote for a bounded time, as mongod's, not until the next transaction arrives."""

from __future__ import annotations

import subprocess
import sys

import pymongo
import pytest

from tests.servers import MongoServer

pytestmark = pytest.mark.slow

OPEN_AND_DIE = """
import sys, pymongo
client = pymongo.MongoClient(sys.argv[1])
client.db.q.insert_one({"_id": 0})
session = client.start_session()
session.start_transaction()
client.db.q.update_one({"_id": 0}, {"$set": {"held": True}}, session=session)
print("open", flush=True)
sys.stdin.read()
"""


def test_a_killed_clients_transaction_is_aborted_and_writes_go_on() -> None:
    server = MongoServer().start()
    try:
        args = [sys.executable, "-c", OPEN_AND_DIE, server.url]
        with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as dead:
            assert dead.stdout is not None
            assert dead.stdout.readline() == b"open\n"
            dead.kill()
        # The write conflicts with the dead transaction until the server aborts it (15 s idle in the tests'
        # servers); without the periodic abort it waited past any timeout.
        with pymongo.MongoClient(server.url, timeoutMS=45_000) as client:
            assert client.db.q.update_one({"_id": 0}, {"$set": {"after": True}}).modified_count == 1
            assert client.db.q.find_one({"_id": 0}) == {"_id": 0, "after": True}  # the dead one's undone
    finally:
        server.stop()

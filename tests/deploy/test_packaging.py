"""What the service's install needs: serving imports nothing of pipeline/ or of the `insights` extra (so that
`pip install charon-queue` without it serves), and the insights commands still parse their options."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.cli import main

SERVING = """
import sys
from app.cli import main
from app.main import create_app
from fastapi.testclient import TestClient

main(["openapi"])  # the CLI and the whole app, every route declared
sys.stdout.flush()
with TestClient(create_app()) as client:  # and its lifespan: the store opened, the background tasks started
    assert client.get("/livez").status_code == 204
loaded = sorted({name.split(".")[0] for name in sys.modules} & {"pipeline", "pyspark", "pyarrow", "pandas"})
print("LOADED", loaded, file=sys.stderr)
"""


def test_serving_imports_neither_pipeline_nor_the_insights_extra(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVING],
        capture_output=True,
        text=True,
        env={"CHARON_STORAGE_URI": redis_url, "CHARON_NAMESPACE": "packaging", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LOADED []" in done.stderr, done.stderr[-2000:]


def test_the_insights_commands_parse_their_options(capsys: pytest.CaptureFixture[str]) -> None:
    for command, option in (("insights", "--since-last"), ("export", "--queue")):
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0
        assert option in capsys.readouterr().out

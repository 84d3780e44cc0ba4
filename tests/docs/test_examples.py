"""The examples cannot rot: every bash and Python block of the README and of the docs' pages runs here, as a
user would paste it, against a live `charon serve` on its embedded default store (BASE names it, as the
examples read it). A page's bash blocks run in order in one shell (a variable set in one is there in the
next); its Python blocks each in a process of their own. curl fails the example on an HTTP error (4xx or
5xx), and a status a `# NNN` comment says a `-w '%{http_code}'` command prints must be printed. The store is
emptied between pages.

A block fenced ```bash {.keystone} (or python) runs against a live service in Keystone mode and the tests'
real Keystone (OS_AUTH_URL, OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME name a user of project alpha), with
CHARON_SIGNED_URL_KEY set. A block fenced {.norun} cannot run here: a server that runs until stopped, an
external SMTP server or object store; its page says why."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.keystone import PASSWORD, KeystoneServer
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]+)[ \t]*(?P<attrs>\{[^}\n]*\})?[ \t]*\n"
    r"(?P<code>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
# curl as the examples run it: quiet, but an HTTP error fails the command (and so the example), unless it
# prints the status (-w), whose `# NNN` comment then says what it must be
PRELUDE = """set -euo pipefail
curl() {
  case " $* " in *" -w "*|*" --write-out "*) command curl --show-error "$@" ;;
                 *) command curl --show-error --fail-with-body "$@" ;; esac
  echo >&2
}
"""
STATUS = re.compile(r"-w\s+'%\{http_code\}\\n'.*#\s*(\d{3})\b")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path, kind: str = "") -> Iterator[Block]:
    """The runnable blocks of `page` of `kind` ("" the plain ones, ".keystone"), in order; never {.norun}."""
    text = page.read_text()
    for m in FENCE.finditer(text):
        lang = RUNNABLE.get(m["lang"])
        attrs = m["attrs"] or ""
        if lang is None or ".norun" in attrs or ((kind not in attrs) if kind else (".keystone" in attrs)):
            continue
        indent = len(m["indent"])
        code = "\n".join(line[indent:] for line in m["code"].splitlines())
        yield Block(page, text.count("\n", 0, m.start()) + 1, lang, code)


PAGES_WITH_EXAMPLES = [p for p in PAGES if any(True for _ in blocks(p))]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CharonProcess]:
    """`make run`'s service: the embedded store, noauth, one worker."""
    data = tmp_path_factory.mktemp("examples")
    # a key, for docs/encryption.md's queue (a test key: 32 bytes of 7)
    key = {"CHARON_ENCRYPTION__KEYS": "docs:" + base64.b64encode(bytes([7] * 32)).decode()}
    service = CharonProcess(None, data_dir=data, env={"CHARON_SWEEP_INTERVAL": "0.2", **key}).start()
    try:
        yield service
    finally:
        service.stop()


def expected_statuses(code: str) -> list[str]:
    """The statuses the block's `-w '%{http_code}\\n'` commands say they print, in order."""
    commands = re.sub(r"\\\n", " ", code)  # a command continued on the next line is one command
    return [m[1] for line in commands.splitlines() if (m := STATUS.search(line))]


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_of_the_page_runs_as_written(
    page: Path, service: CharonProcess, tmp_path: Path
) -> None:
    data_dir = Path(service.env["CHARON_DATA_DIR"])
    with redis.Redis(unix_socket_path=str(data_dir / "redis.sock")) as store:
        store.flushall()  # each page starts from an empty store, as a user following it would
    env = dict(os.environ, BASE=service.url)
    env.pop("CHARON_STORAGE_URI", None)
    env["CHARON_DATA_DIR"] = str(data_dir)  # `charon export` finds the service's embedded store
    run(list(blocks(page)), env, tmp_path)


def test_the_keystone_examples_run_against_a_real_keystone(keystone: KeystoneServer, tmp_path: Path) -> None:
    service_env = {
        "CHARON_AUTH": "keystone",
        "CHARON_KEYSTONE__AUTH_URL": keystone.url,
        "CHARON_KEYSTONE__PASSWORD": PASSWORD,
        "CHARON_SIGNED_URL_KEY": "docs-examples",
    }
    service = CharonProcess(None, data_dir=tmp_path / "data", env=service_env).start()
    try:
        env = dict(os.environ, BASE=service.url, OS_AUTH_URL=keystone.url, OS_USERNAME="alice")
        env.update(OS_PASSWORD=PASSWORD, OS_PROJECT_NAME="alpha")
        found = [b for page in PAGES for b in blocks(page, ".keystone")]
        assert found, "no {.keystone} block: the Keystone examples are gone"
        for page in PAGES:
            run(list(blocks(page, ".keystone")), env, tmp_path)
    finally:
        service.stop()


def run(page_blocks: list[Block], env: dict[str, str], cwd: Path) -> None:
    """`page_blocks` as a user runs them: the bash ones in one shell, in order; each Python one alone."""
    env = dict(env, PATH=f"{Path(sys.executable).parent}:{env['PATH']}")  # `charon` as the venv installs it
    shell = [b for b in page_blocks if b.lang == "bash"]
    if shell:
        script = PRELUDE + "\n".join(f"# {b}\n{b.code}" for b in shell)
        done = subprocess.run(
            ["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
        )
        where = ", ".join(str(b) for b in shell)
        assert done.returncode == 0, (
            f"{where} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        statuses = [s for b in shell for s in expected_statuses(b.code)]
        printed = [line.strip() for line in done.stdout.splitlines() if re.fullmatch(r"\s*\d{3}\s*", line)]
        missing = set(statuses) - set(printed)
        assert not missing, f"{where}: the comments say {sorted(missing)}, never printed ({printed})"
    for block in (b for b in page_blocks if b.lang == "python"):
        done = subprocess.run(
            [sys.executable, "-c", block.code], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{block} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_blocks_that_do_not_run_are_few_and_said_so() -> None:
    """A page marks a block {.norun} only with a reason next to it; most examples run."""
    fenced = runnable = 0
    for page in PAGES:
        for m in FENCE.finditer(page.read_text()):
            if m["lang"] in RUNNABLE:
                fenced += 1
                runnable += ".norun" not in (m["attrs"] or "")
    assert runnable >= fenced // 2, (runnable, fenced)

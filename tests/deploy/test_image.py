"""deploy/Dockerfile without a container builder: for each target, exactly the files its stages copy from the
build context go into an empty directory, the stages' `pip install` commands install them into a fresh
virtualenv, and `charon serve` from that virtualenv (run outside the repository) serves requests. A
Dockerfile that forgets a package fails here, as its image would."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.servers import CharonProcess

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"

pytestmark = pytest.mark.slow


@dataclass
class Stage:
    name: str
    base: str  # an image, or an earlier stage's name
    workdir: str = "/"
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # (sources, destination)
    needs: list[str] = field(default_factory=list)  # the stages it copies from
    installs: list[str] = field(default_factory=list)  # the package specs of its `pip install`s


def stages(dockerfile: str) -> dict[str, Stage]:
    """The Dockerfile's stages by name: what each copies from the context and from other stages, and what its
    RUN lines `pip install`."""
    text = re.sub(r"\\\n", " ", dockerfile)
    found: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        instruction, args = words[0].upper(), words[1:]
        if instruction == "FROM":
            stage = Stage(name=args[2] if len(args) > 2 else f"stage{len(found)}", base=args[0])
            found[stage.name] = stage
            if stage.base in found:
                stage.workdir = found[stage.base].workdir
        elif stage is None:
            continue
        elif instruction == "WORKDIR":
            stage.workdir = args[0]
        elif instruction == "COPY":
            source = next((a.split("=", 1)[1] for a in args if a.startswith("--from=")), None)
            paths = [a for a in args if not a.startswith("--")]
            if source is None:
                stage.copies.append((paths[:-1], paths[-1]))
            else:
                stage.needs.append(source)
        elif instruction == "RUN":
            stage.installs += re.findall(r"pip install (?:--[\w-]+ )*\"?(\.[^\s\"]*)", line)
    return found


def chain(found: dict[str, Stage], target: str) -> list[Stage]:
    """The stages `target` is built from, in build order."""
    order: list[Stage] = []

    def visit(name: str) -> None:
        stage = found[name]
        for parent in [stage.base, *stage.needs]:
            if parent in found and found[parent] not in order:
                visit(parent)
        if stage not in order:
            order.append(stage)

    visit(target)
    return order


def install(dockerfile: str, target: str, into: Path) -> Path:
    """The target's files copied from the context into `into`/src, its pip installs run in a new
    virtualenv `into`/venv (build args at their defaults: no extras); the virtualenv's python."""
    src = into / "src"
    src.mkdir(parents=True)
    built = chain(stages(dockerfile), target)
    for stage in built:
        for sources, destination in stage.copies:
            assert stage.workdir == "/src", f"stage {stage.name} copies into {stage.workdir}, not /src"
            for source in sources:
                origin = ROOT / source
                at = src / destination / Path(source).name if destination.endswith("/") else src / destination
                if origin.is_dir():
                    shutil.copytree(origin, at, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(origin, at)
    venv = into / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    specs = [spec.replace("${EXTRAS:+[$EXTRAS]}", "") for stage in built for spec in stage.installs]
    assert specs, f"no pip install in the stages of {target}"
    for spec in specs:
        pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-compile", "--disable-pip-version-check"]
        done = subprocess.run([*pip, spec], cwd=src, capture_output=True, text=True)
        if done.returncode:
            raise AssertionError(f"pip install {spec} of target {target} failed:\n{done.stderr[-3000:]}")
    return venv / "bin" / "python"


def serves(python: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> CharonProcess:
    """`charon serve` of that virtualenv on its embedded store, started outside the repository (so that the
    repository's packages are not the ones imported)."""
    monkeypatch.chdir(workdir)
    return CharonProcess(None, data_dir=workdir / "data", python=str(python)).start()


@pytest.mark.parametrize("target", ["service", "insights"])
def test_each_image_target_installs_from_its_copied_files_and_serves(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = install(DOCKERFILE.read_text(), target, tmp_path)
    charon = serves(python, tmp_path, monkeypatch)
    try:
        headers = {"Client-ID": "3381af92-2b9e-11e3-b191-71861300734c", "X-Project-ID": "image"}
        assert httpx.get(f"{charon.url}/livez").status_code == 204
        assert httpx.get(f"{charon.url}/readyz").status_code == 204
        posted = httpx.post(
            f"{charon.url}/v2/queues/orders/messages",
            json={"messages": [{"body": {"n": 1}}]},
            headers=headers,
        )
        assert posted.status_code == 201, posted.text
        claimed = httpx.post(f"{charon.url}/v2/queues/orders/claims", json={}, headers=headers)
        assert [m["body"] for m in claimed.json()["messages"]] == [{"n": 1}]
        analysed = subprocess.run(
            [python.parent / "charon", "export", "--storage-uri", "redis://127.0.0.1:1/0", "--queue", "d"],
            capture_output=True,
            text=True,
        )
    finally:
        charon.stop()
    # python -P: the virtualenv's packages only, not the working directory's
    imported = subprocess.run(
        [str(python), "-P", "-c", "import app, pipeline.spark as s; print(app.__file__, s.LOG4J2.is_file())"],
        capture_output=True,
        text=True,
    )
    assert str(tmp_path / "venv") in imported.stdout
    assert imported.stdout.split()[-1] == "True"  # the Spark driver's logging set-up is installed too
    if target == "service":  # without the [insights] extra: the one-line message, exit 2
        assert analysed.returncode == 2
        assert "make insights" in analysed.stderr
        assert len(analysed.stderr.strip().splitlines()) == 1
    else:  # the extra is there: the command runs, and fails on the unreachable store (1), not on the extra
        assert analysed.returncode == 1, analysed.stderr
        assert "insights extra" not in analysed.stderr


def test_a_dockerfile_that_forgets_a_package_fails(tmp_path: Path) -> None:
    forgetful = DOCKERFILE.read_text().replace("COPY service service\n", "")
    assert forgetful != DOCKERFILE.read_text()
    with pytest.raises(AssertionError, match="pip install"):
        install(forgetful, "service", tmp_path)


def test_the_service_target_is_the_default_and_has_no_java_or_spark() -> None:
    text = DOCKERFILE.read_text()
    found = stages(text)
    assert list(found)[-1] == "service"  # `docker build` without --target builds the last stage
    service = chain(found, "service")
    assert "build-insights" not in {s.name for s in service}
    assert not any(s.installs and "insights" in " ".join(s.installs) for s in service)
    service_text = text[text.index("AS service") :]
    assert "openjdk" not in service_text
    assert "HEALTHCHECK" in service_text
    assert "/livez" in service_text
    assert re.search(r"^USER charon$", service_text, re.M)

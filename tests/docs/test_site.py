"""The docs site: the configuration page is what the settings model generates, and the site builds with
`mkdocs build --strict` (a broken link or anchor, or a page missing from the nav, fails it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.settings_doc import render

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_page_is_generated_from_the_settings() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == render(), "docs/configuration.md is stale: run `make docs`"


def test_every_setting_has_a_description() -> None:
    assert "|  |\n" not in render(), "a setting in app/settings.py has no description"


def test_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [
            str(mkdocs),
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "configuration" / "index.html").is_file()

"""What a user sees of the settings through the CLI: a typo'd CHARON_ variable or config-file key stops every
subcommand (exit 2) with the nearest real name, Kubernetes' service-link variables are not settings, `charon
config` says each value's source with secrets masked, the TOML file sits under the environment, and every
subcommand has --version and a --help naming the variables."""

from __future__ import annotations

import pytest

from app.cli import main
from app.settings import Settings, settings

SUBCOMMANDS = ("serve", "notify", "config", "openapi", "policy", "insights", "export")
ARGUMENTS = {"export": ["--queue", "dlq"]}  # what a subcommand needs besides


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CHARON_ variable of the test run's own environment."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("CHARON_"):
            monkeypatch.delenv(name)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_a_typo_stops_every_subcommand_naming_the_nearest_setting(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, CHARON_STORGE_URI was ignored and the service started its embedded store instead."""
    monkeypatch.setenv("CHARON_STORGE_URI", "redis://127.0.0.1:1/0")
    code, out, err = run([command, *ARGUMENTS.get(command, [])], capsys)
    assert code == 2
    assert "unknown setting CHARON_STORGE_URI (did you mean CHARON_STORAGE_URI?)" in err, err
    assert out == ""


def test_a_typo_in_a_group_and_a_name_like_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHARON_METRICS__MAX_QUEUS", "5")
    monkeypatch.setenv("charon_xyzzy", "1")
    code, _, err = run(["config"], capsys)
    assert code == 2
    assert "CHARON_METRICS__MAX_QUEUS (did you mean CHARON_METRICS__MAX_QUEUES?)" in err
    assert "unknown setting CHARON_XYZZY (`charon config` lists every setting)" in err


def test_kubernetes_service_links_are_not_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a pod gets for a Service named `charon` (and `charon-redis`) when enableServiceLinks is left on:
    CHARON_PORT=tcp://... would otherwise be read as the port to bind, and fail."""
    links = {
        "CHARON_SERVICE_HOST": "10.0.0.1",
        "CHARON_SERVICE_PORT": "8888",
        "CHARON_SERVICE_PORT_HTTP": "8888",
        "CHARON_PORT": "tcp://10.0.0.1:8888",
        "CHARON_PORT_8888_TCP": "tcp://10.0.0.1:8888",
        "CHARON_PORT_8888_TCP_PROTO": "tcp",
        "CHARON_PORT_8888_TCP_PORT": "8888",
        "CHARON_PORT_8888_TCP_ADDR": "10.0.0.1",
        "CHARON_REDIS_SERVICE_HOST": "10.0.0.2",
        "CHARON_REDIS_PORT": "tcp://10.0.0.2:6379",
        "CHARON_REDIS_PORT_6379_TCP_ADDR": "10.0.0.2",
    }
    for name, value in links.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(["config"], capsys)
    assert code == 0, err
    assert line_of(out, "CHARON_PORT") == ["CHARON_PORT", "8888", "(default)"]
    assert Settings().port == 8888
    monkeypatch.setenv("CHARON_PORT", "9999")  # a port of one's own is still a setting
    assert Settings().port == 9999


def line_of(out: str, variable: str) -> list[str]:
    [line] = [line for line in out.splitlines() if line.split()[0] == variable]
    return line.split()


def test_config_says_where_each_value_came_from_and_masks_secrets(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "charon.toml"  # type: ignore[operator]
    toml.write_text(
        'storage_uri = "redis://:filepassword@10.0.0.5:6379/0"\nnamespace = "from-file"\n'
        '[metrics]\nmax_queues = 7\nbearer_token = "scrape-secret"\n'
    )
    monkeypatch.setenv("CHARON_NAMESPACE", "from-env")
    monkeypatch.setenv("CHARON_SIGNED_URL_KEY", "sign-secret")
    code, out, err = run(["config", "--config", str(toml)], capsys)
    assert code == 0, err
    assert line_of(out, "CHARON_NAMESPACE") == ["CHARON_NAMESPACE", "from-env", "(environment)"]
    assert line_of(out, "CHARON_STORAGE_URI") == [
        "CHARON_STORAGE_URI", "redis://***@10.0.0.5:6379/0", "(file", f"{toml})"
    ]  # fmt: skip
    assert line_of(out, "CHARON_METRICS__MAX_QUEUES")[1:] == ["7", "(file", f"{toml})"]
    assert line_of(out, "CHARON_METRICS__BEARER_TOKEN")[1] == "***"
    assert line_of(out, "CHARON_SIGNED_URL_KEY")[1:] == ["***", "(environment)"]
    assert line_of(out, "CHARON_WORKERS") == ["CHARON_WORKERS", "1", "(default)"]
    for secret in ("filepassword", "scrape-secret", "sign-secret"):
        assert secret not in out
    assert len(out.splitlines()) == len(list(settings()))  # every setting, once


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('storge_uri = "redis://x"\n', "unknown setting storge_uri (did you mean storage_uri?)"),
        (
            "[metrics]\nmax_queus = 3\n",
            "unknown setting metrics.max_queus (did you mean metrics.max_queues?)",
        ),
        ("port = \n", "is not TOML"),
        ('port = "many"\n', "port in "),  # named as the file has it, not as a variable nobody set
        ('[limits]\nmax_claim_ttl = "long"\n', "limits.max_claim_ttl in "),
    ],
)
def test_a_bad_config_file_stops_the_command(
    text: str,
    said: str,
    tmp_path: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    toml = tmp_path / "charon.toml"  # type: ignore[operator]
    toml.write_text(text)
    code, out, err = run(["config", "--config", str(toml)], capsys)
    assert code == 2
    assert said in err, err
    assert out == ""


def test_a_missing_config_file_stops_the_command(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.toml"  # type: ignore[operator]
    code, _, err = run(["serve", "--config", str(missing)], capsys)
    assert code == 2
    assert f"the config file {missing} cannot be read" in err, err


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("CHARON_STORAGE_URI", "http://x", "CHARON_STORAGE_URI: Unsupported storage URI scheme 'http'"),
        ("CHARON_MANAGEMENT_URI", "memcached://x", "CHARON_MANAGEMENT_URI: Unsupported storage URI scheme"),
        ("CHARON_PORT", "99999", "CHARON_PORT: Input should be less than or equal to 65535"),
        ("CHARON_WORKERS", "0", "CHARON_WORKERS: Input should be greater than or equal to 1"),
        (
            "CHARON_NOTIFICATIONS__ALLOWED_NETWORKS",
            "10.0.0.0/8",
            "CHARON_NOTIFICATIONS__ALLOWED_NETWORKS: not JSON",
        ),
    ],
)
def test_a_bad_value_stops_serve_in_one_line_before_anything_starts(
    variable: str, value: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a URI no driver opens started the service, which then failed with a traceback; port 99999
    was bound as some other port, and 0 workers silently ran one."""
    monkeypatch.setenv(variable, value)
    code, _, err = run(["serve"], capsys)
    assert code == 2
    assert said in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_config_masks_passwords_in_a_uri_query_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = "redis+sentinel://:primarypw@s1:26379/mymaster/0?sentinel_password=sentinelpw"
    monkeypatch.setenv("CHARON_STORAGE_URI", uri)
    code, out, _ = run(["config"], capsys)
    assert code == 0
    assert (
        line_of(out, "CHARON_STORAGE_URI")[1]
        == "redis+sentinel://***@s1:26379/mymaster/0?sentinel_password=***"
    )
    assert line_of(out, "CHARON_NOTIFICATIONS__SMTP_HOST")[1] == "(empty)"


def test_version_and_help_name_the_variables(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    code, out, _ = run(["--version"], capsys)
    assert (code, out.strip()) == (0, f"charon {version('charon-queue')}")
    for command in SUBCOMMANDS:
        code, out, _ = run([command, "--help"], capsys)
        assert code == 0
        assert "CHARON_CONFIG_FILE" in out, (command, out)
        assert "charon config" in out, (command, out)
    _, out, _ = run(["serve", "--help"], capsys)
    for variable in ("CHARON_HOST", "CHARON_PORT", "CHARON_WORKERS", "CHARON_LOG_LEVEL"):
        assert variable in out

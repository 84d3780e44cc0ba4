"""`charon serve` runs the service; `charon config` prints the effective settings; `charon openapi` prints
the published API as YAML; `charon insights` analyses dead letters with PySpark and `charon export` writes a
DLQ as JSON Lines (pipeline/, the `insights` extra: make insights).

Every subcommand reads the same settings (app/settings.py: CHARON_* variables over an optional TOML file,
`--config`), and stops with exit 2 on an unknown CHARON_ variable or an invalid value first."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from app import logs
from app.settings import CONFIG_FILE_VARIABLE, Settings, not_valid, sources, unknown_variables
from core.errors import CharonError

APP = "app.main:create_app"
API_APP = "app.main:api_app"
EPILOG = "Every setting is a CHARON_* environment variable (or a key of the --config file): `charon config`."

log = logging.getLogger("charon")


def load(command: str) -> Settings | None:
    """The settings, or None once what is wrong with them is said on stderr (the caller exits 2)."""
    from pydantic import ValidationError

    try:
        return Settings()
    except (ValidationError, ValueError) as exc:
        print(
            f"charon {command}: the configuration is not valid: {not_valid(exc)}", file=sys.stderr, flush=True
        )
        return None


def serve(args: argparse.Namespace) -> int:
    from app.workers import share_metrics

    share_metrics(args.workers or None)  # first: before anything imports prometheus-client
    from app.embedded import EmbeddedRedis
    from app.http import CharonConfig
    from app.main import authenticator
    from core.clock import SystemClock

    settings = load("serve")
    if settings is None:
        return 2
    try:
        authenticator(
            settings, SystemClock()
        )  # the policy file and the auth settings, before anything starts
    except ValueError as exc:
        print(f"charon serve: the configuration is not valid: {not_valid(exc)}", file=sys.stderr, flush=True)
        return 2
    level = args.log_level or settings.log_level
    logs.configure(settings.log_format, level)
    embedded = None
    if settings.store_uri() is None:
        # Started here, once, so that every worker process shares the one embedded store.
        embedded = EmbeddedRedis(settings.data_dir, settings.redis_server)
        try:
            os.environ["CHARON_STORAGE_URI"] = embedded.start()
        except CharonError as exc:
            log.error("%s", exc)
            return 1
        log.info("embedded redis-server at %s (AOF in %s)", embedded.uri, embedded.data_dir)
        embedded.supervise()
    # uvicorn re-raises SIGTERM after its graceful shutdown; turning it into SystemExit lets `finally` stop
    # the embedded store.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host, port = args.host or settings.host, args.port or settings.port
    if settings.auth == "noauth" and not _is_loopback(host):
        log.warning(
            "serving on %s with CHARON_AUTH=noauth: any caller can act in any project by naming it in "
            "X-Project-ID. Use CHARON_AUTH=keystone (or trusted-proxy behind a gateway).",
            host,
        )
    workers = args.workers or settings.workers
    # the workers' app delivers; API_APP leaves it to a notifier process, this one's or one run apart
    app = APP if settings.notifications.in_workers else API_APP
    supervised = None
    if settings.notifications.own_process:
        from app.notify import Supervised

        parent = str(os.getpid())
        supervised = Supervised([sys.executable, "-m", "app.cli", "notify", "--nice", "--parent", parent])
        supervised.start()
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "workers": workers,
        "log_level": level,
        "log_config": logs.config(settings.log_format, level),
        "access_log": False,
        "timeout_graceful_shutdown": settings.shutdown_timeout,
    }
    try:
        return _run(CharonConfig(app, factory=True, bounds=settings.http, **options))
    finally:
        if supervised is not None:
            supervised.stop()
        if embedded is not None:
            embedded.stop()


def _run(config: Any) -> int:
    """Serve `config` (app/http.py CharonConfig) until stopped: its workers under app/workers.py's
    supervisor, or one process as uvicorn.run would. 1 when it could not start."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    if config.workers > 1 and hasattr(socket, "SO_REUSEPORT"):
        from app.workers import run_workers

        return run_workers(config)
    if config.workers > 1:  # no SO_REUSEPORT: uvicorn's own supervisor, on one shared socket
        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return 0
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else STARTUP_FAILURE  # as uvicorn.run: its error is logged


def notify(args: argparse.Namespace) -> int:
    """A notifier and nothing else (app/notify.py), against the configured store."""
    from app import notify as notifying

    settings = load("notify")
    if settings is None:
        return 2
    if args.parent is None and settings.store_uri() is None:
        # alone it would start an embedded store of its own, which no API writes to
        print(
            "charon notify: set CHARON_STORAGE_URI to the store the API uses (charon serve's embedded store "
            "has a notifier of its own)",
            file=sys.stderr,
            flush=True,
        )
        return 2
    try:
        return notifying.main(settings, nice=args.nice, parent=args.parent)
    except CharonError as exc:
        print(f"charon notify: {exc}", file=sys.stderr, flush=True)
        return 1


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def config(_: argparse.Namespace) -> int:
    """The effective settings, one a line: the variable, the value (secrets masked), where it came from."""
    settings = load("config")
    if settings is None:
        return 2
    rows = [(s.variable, value, where) for s, value, where in sources(settings)]
    width = max(len(name) for name, _, _ in rows)
    for name, value, where in rows:
        print(f"{name:<{width}}  {value}  ({where})")
    return 0


def policy(_: argparse.Namespace) -> int:
    """The default policy, as a policy file an operator starts from (every rule commented out, as
    oslopolicy-sample-generator writes it)."""
    from api.policy import rule_defaults

    settings = load("policy")
    if settings is None:
        return 2
    for rule in rule_defaults(settings.admin_role):
        description = getattr(rule, "description", None)
        if description:
            print(f"# {description}")
        for operation in getattr(rule, "operations", ()):
            print(f"# {operation['method']}  {operation['path']}")
        print(f'#"{rule.name}": "{rule.check_str}"\n')
    return 0


def openapi(_: argparse.Namespace) -> int:
    import yaml

    from app.main import create_app

    sys.stdout.write(yaml.safe_dump(create_app().openapi(), sort_keys=False, allow_unicode=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="charon", description=__doc__, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"charon {version('charon-queue')}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        help=f"a TOML file of settings ({CONFIG_FILE_VARIABLE}); the CHARON_* environment overrides it",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, about: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=about, description=about, epilog=EPILOG, parents=[common])

    p = command("serve", "run the HTTP API (uvicorn)")
    p.add_argument("--host", help="the address to bind (CHARON_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="the port to bind (CHARON_PORT, default 8888)")
    p.add_argument("--workers", type=int, help="worker processes (CHARON_WORKERS, default 1)")
    p.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        help="the least severe log lines written (CHARON_LOG_LEVEL, default info)",
    )
    p.set_defaults(func=serve)
    p = command(
        "notify", "deliver notifications to subscribers (what `charon serve` runs beside its workers)"
    )
    p.add_argument("--nice", action="store_true", help="lower the CPU priority by CHARON_NOTIFICATIONS__NICE")
    p.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # charon serve's PID: exit when it does
    p.set_defaults(func=notify)
    command("config", "print the effective settings and where each came from (secrets masked)").set_defaults(
        func=config
    )
    command("openapi", "print the OpenAPI document as YAML").set_defaults(func=openapi)
    command("policy", "print the default policy rules (a policy file to start from)").set_defaults(
        func=policy
    )
    # app/insights.py (and pipeline/ under it) is imported only when one of its commands runs: nothing on
    # the serving path imports pipeline/ (tests/deploy/test_packaging.py).
    words = sys.argv[1:] if argv is None else argv
    analyse = command("insights", "why messages died: a PySpark job over dead letters")
    export = command("export", "a DLQ's messages as JSON Lines, with their provenance")
    if next((w for w in words if not w.startswith("-")), None) in ("insights", "export"):
        from app import insights

        insights.add_insights_arguments(analyse)
        analyse.set_defaults(func=insights.run_insights)
        insights.add_export_arguments(export)
        export.set_defaults(func=insights.run_export)
    args = parser.parse_args(argv)
    if args.config:  # for this process and those it starts (workers, the notifier)
        os.environ[CONFIG_FILE_VARIABLE] = str(Path(args.config).resolve())
    unknown = unknown_variables(os.environ)
    if unknown:
        for problem in unknown:
            print(f"charon {args.command}: {problem}", file=sys.stderr, flush=True)
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())

"""`charon serve` runs the service; `charon openapi` prints the published API as YAML; `charon insights`
analyses dead letters with PySpark and `charon export` writes a DLQ as JSON Lines (pipeline/, the
`insights` extra: make insights)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Any

from app.settings import Settings
from core.errors import CharonError

APP = "app.main:create_app"
API_APP = "app.main:api_app"


def serve(args: argparse.Namespace) -> int:
    from app.workers import share_metrics

    share_metrics(args.workers or None)  # first: before anything imports prometheus-client
    import uvicorn
    from pydantic import ValidationError

    from app.embedded import EmbeddedRedis
    from app.main import authenticator
    from core.clock import SystemClock

    try:
        settings = Settings()
        authenticator(
            settings, SystemClock()
        )  # the policy file and the auth settings, before anything starts
    except (ValidationError, ValueError) as exc:
        print(f"charon: the configuration is not valid: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    embedded = None
    if settings.store_uri() is None:
        # Started here, once, so that every worker process shares the one embedded store.
        embedded = EmbeddedRedis(settings.data_dir, settings.redis_server)
        try:
            os.environ["CHARON_STORAGE_URI"] = embedded.start()
        except CharonError as exc:
            print(f"charon: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"charon: embedded redis-server at {embedded.uri} (AOF in {embedded.data_dir})", flush=True)
    # uvicorn re-raises SIGTERM after its graceful shutdown; turning it into SystemExit lets `finally` stop
    # the embedded store.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host, port = args.host or settings.host, args.port or settings.port
    if settings.auth == "noauth" and not _is_loopback(host):
        print(
            f"charon: WARNING: serving on {host} with CHARON_AUTH=noauth: any caller can act in any project "
            "by naming it in X-Project-ID. Use CHARON_AUTH=keystone (or trusted-proxy behind a gateway).",
            file=sys.stderr,
            flush=True,
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
        "log_level": args.log_level,
        "access_log": False,
        "timeout_graceful_shutdown": settings.shutdown_timeout,
    }
    try:
        if workers > 1 and hasattr(socket, "SO_REUSEPORT"):
            from app.workers import run_workers

            return run_workers(uvicorn.Config(app, factory=True, **options))
        uvicorn.run(app, factory=True, **options)
    finally:
        if supervised is not None:
            supervised.stop()
        if embedded is not None:
            embedded.stop()
    return 0


def notify(args: argparse.Namespace) -> int:
    """A notifier and nothing else (app/notify.py), against the configured store."""
    from pydantic import ValidationError

    from app import notify as notifying

    try:
        settings = Settings()
    except (ValidationError, ValueError) as exc:
        print(f"charon: the configuration is not valid: {_one_line(exc)}", file=sys.stderr, flush=True)
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


def _one_line(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(
            f"CHARON_{'__'.join(str(p) for p in e['loc']).upper()}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
    return str(exc)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def policy(_: argparse.Namespace) -> int:
    """The default policy, as a policy file an operator starts from (every rule commented out, as
    oslopolicy-sample-generator writes it)."""
    from api.policy import rule_defaults

    for rule in rule_defaults(Settings().admin_role):
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
    parser = argparse.ArgumentParser(prog="charon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the HTTP API (uvicorn)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=serve)
    p = sub.add_parser(
        "notify", help="deliver notifications to subscribers (what `charon serve` runs beside its workers)"
    )
    p.add_argument("--nice", action="store_true", help="lower the CPU priority by CHARON_NOTIFICATIONS__NICE")
    p.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # charon serve's PID: exit when it does
    p.set_defaults(func=notify)
    sub.add_parser("openapi", help="print the OpenAPI document as YAML").set_defaults(func=openapi)
    sub.add_parser(
        "policy", help="print the default policy rules (a policy file to start from)"
    ).set_defaults(func=policy)
    # app/insights.py (and pipeline/ under it) is imported only when one of its commands runs: nothing on
    # the serving path imports pipeline/ (tests/unit/test_packaging.py).
    words = sys.argv[1:] if argv is None else argv
    analyse = sub.add_parser("insights", help="why messages died: a PySpark job over dead letters")
    export = sub.add_parser("export", help="a DLQ's messages as JSON Lines, with their provenance")
    if next((w for w in words if not w.startswith("-")), None) in ("insights", "export"):
        from app import insights

        insights.add_insights_arguments(analyse)
        analyse.set_defaults(func=insights.run_insights)
        insights.add_export_arguments(export)
        export.set_defaults(func=insights.run_export)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())

"""The peer of Charon's `GET /v2/ping` in the benchmark: a bare FastAPI app with that one route, served the
way `charon serve` serves Charon (uvicorn, one SO_REUSEPORT socket per worker, same defaults).

Run: .venv/bin/python -m bench.bare_app --port 8890 --workers 2
"""

from __future__ import annotations

import argparse

from fastapi import FastAPI, Response

app = FastAPI()


@app.get("/v2/ping")
async def ping() -> Response:
    return Response(status_code=204)


if __name__ == "__main__":
    import uvicorn

    from app.workers import run_workers

    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8890)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    options = {"host": args.host, "port": args.port, "log_level": "warning", "access_log": False}
    if args.workers > 1:
        raise SystemExit(run_workers(uvicorn.Config("bench.bare_app:app", workers=args.workers, **options)))
    uvicorn.run("bench.bare_app:app", **options)

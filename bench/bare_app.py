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
    from app.cli import run_worker, supervise

    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8890)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    if args.workers > 1:
        supervise(args.workers, args.host, args.port, "warning", "bench.bare_app:app")
    else:
        run_worker(args.host, args.port, "warning", "bench.bare_app:app")

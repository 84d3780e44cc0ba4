"""The peer of Charon's `GET /v2/ping` in the benchmark: a bare FastAPI app with the one route, served by
the same server with the same settings (`uvicorn bench.bare_app:app`)."""

from fastapi import FastAPI, Response

app = FastAPI()


@app.get("/v2/ping")
async def ping() -> Response:
    return Response(status_code=204)

"""The listener of websocket connections' own subscriptions (api/ws_notices.py), spoken to over real HTTP:
what reaches a connection, and what is refused."""

from __future__ import annotations

import httpx

from api.ws_notices import Notices


async def test_a_notification_reaches_its_connection_and_nothing_else_does() -> None:
    got: list[bytes] = []

    async def push(body: bytes) -> bool:
        got.append(body)
        return True

    async def gone(_body: bytes) -> bool:
        return False

    notices = Notices(max_body=1024)
    try:
        url = (await notices.subscriber("k1", push)).replace("websocket://", "http://")
        other = (await notices.subscriber("k2", gone)).replace("websocket://", "http://")
        assert url.startswith("http://127.0.0.1:")
        base = url.rsplit("/", 1)[0]
        async with httpx.AsyncClient() as client:  # one kept-alive connection, as the notifier's
            assert (await client.post(url, content=b'{"n": 1}')).status_code == 200
            assert (await client.post(url, content=b'{"n": 2}')).status_code == 200
            assert (await client.post(f"{base}/unknown", content=b"{}")).status_code == 404
            assert (await client.post(other, content=b"{}")).status_code == 404  # closed meanwhile
            assert (await client.get(url)).status_code == 405
            assert (await client.post(url, content=b"x" * 2048)).status_code == 413
        notices.forget("k1")
        async with httpx.AsyncClient() as client:
            assert (await client.post(url, content=b"{}")).status_code == 404
        assert got == [b'{"n": 1}', b'{"n": 2}']
    finally:
        await notices.aclose()

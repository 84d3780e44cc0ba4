"""HEAD wherever GET: a HEAD request is served by the GET route and answered without its body, as HTTP asks
(RFC 9110 9.3.2); python-zaqarclient's `queue.exists()` sends one. The OpenAPI document lists the GET."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEAD_KEY = "charon.head"  # in the scope of a HEAD served by its GET route (a pre-signed URL checks it)


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        # a copy: the server keeps its own view of the request as HEAD (and sends no body either)
        await self.app({**scope, "method": "GET", HEAD_KEY: True}, receive, without_body)

"""Zaqar's websocket answers from the HTTP call's (api/websocket.py): what a client reads, and what a bug in
the shaping can never hide (a post that was stored), and which browser pages may open a websocket."""

from __future__ import annotations

import pytest

from api.websocket import ACTIONS, _origin_allowed, _zaqar_body


def test_answers_take_zaqars_websocket_shapes() -> None:
    posted = b'{"resources": ["/v2/queues/q/messages/a1", "/v2/queues/q/messages/b2"]}'
    assert _zaqar_body("message_post", ACTIONS["message_post"], 201, {}, posted, {}) == {
        "message_ids": ["a1", "b2"]
    }
    made = _zaqar_body("queue_create", ACTIONS["queue_create"], 201, {}, b"", {"queue_name": "jobs"})
    assert made == "Queue jobs created."
    error = b'{"title": "Invalid API request", "description": "ttl must be between 60 and 1209600; got 5."}'
    refused = _zaqar_body("message_post", ACTIONS["message_post"], 400, {}, error, {})
    assert refused["error"] == refused["exception"] == "ttl must be between 60 and 1209600; got 5."


def test_a_shaping_bug_still_answers_what_the_call_did() -> None:
    """The post was stored (201): an answer the shaping does not expect is passed on as it came, never a 500
    that would hide it."""
    unexpected = b'{"stored": ["a1"]}'
    assert _zaqar_body("message_post", ACTIONS["message_post"], 201, {}, unexpected, {}) == {"stored": ["a1"]}
    assert _zaqar_body("ping_node", ACTIONS["ping_node"], 200, {}, b"not json", {}) == "not json"


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "ok"),
    [
        ("http://127.0.0.1:8888", "127.0.0.1:8888", (), True),  # the service's own page
        ("http://127.0.0.1:3000", "127.0.0.1:8888", (), False),  # another port is another origin
        ("https://evil.example.com", "127.0.0.1:8888", (), False),
        ("https://console.example.com", "charon.example.com", ("https://console.example.com",), True),
        ("https://charon.example.com", "charon.example.com", (), True),  # behind a proxy that drops the port
        ("https://evil.example.com", "charon.example.com", ("*",), True),
        ("null", "127.0.0.1:8888", (), False),  # a sandboxed page or a file
    ],
)
def test_which_browser_pages_may_open_a_websocket(
    origin: str, host: str, allowed: tuple[str, ...], ok: bool
) -> None:
    assert _origin_allowed(origin, host, allowed) is ok

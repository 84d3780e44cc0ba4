"""The direct path (api/direct.py) serves exactly the routes FastAPI would have picked for those requests."""

from __future__ import annotations

import re

from starlette.routing import Match

from api.direct import direct_routes
from app.main import create_app
from app.settings import Settings


def test_direct_routes_are_the_hot_routes_and_the_ones_fastapi_would_pick() -> None:
    app = create_app(Settings(storage_uri="redis://unused"))
    routes = direct_routes(app)
    assert {endpoint.__name__ for _, _, endpoint, _ in routes} == {
        "post_messages",
        "delete_message",
        "create_claim",
        "release_claim",
        "ping",
    }
    for regex, methods, endpoint, _ in routes:
        path = re.sub(r"\(\?P<\w+>\[\^/\]\+\)", "x", regex.pattern.strip("^$"))
        for method in methods:
            scope = {"type": "http", "path": path, "method": method, "root_path": "", "path_params": {}}
            first = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
            assert getattr(first, "endpoint", None) is endpoint, (method, path)

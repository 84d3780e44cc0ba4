"""Domain models -> wire dicts (core/wire.py), encoded with orjson (hot paths skip pydantic serialisation)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response

from core.wire import EPOCH, Shown, iso, message, message_href, messages, stamp

__all__ = ["EPOCH", "Shown", "iso", "json_response", "message", "message_href", "messages", "stamp"]


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(content), status_code=status_code, headers=headers, media_type="application/json"
    )

"""Schemathesis hooks for the contract fuzz (tests/acceptance/test_contract_fuzz.py).

- Zaqar's JSON-patch media type, and the JSON-home document of GET /v2, are JSON on the wire.
- A message body is any JSON value, but an integer literal beyond 64 bits is refused (400: it could not come
  back exactly), which JSON Schema cannot say (to it, 1e30 and 1000000000000000000000000000000 are one
  number): bodies with such literals are kept out of the cases that must be accepted.
"""

from __future__ import annotations

from typing import Any

import orjson
import schemathesis

from api.deps import INT_RANGE
from api.errors import JSON_PATCH

schemathesis.serializer.alias(JSON_PATCH, "application/json")


@schemathesis.deserializer("application/json-home")
def json_home(ctx: Any, response: Any) -> Any:
    return orjson.loads(response.content)


def _fits(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and not INT_RANGE[0] <= item <= INT_RANGE[1]:
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    return _fits(body)

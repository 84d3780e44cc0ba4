"""Zaqar's queue-list filters: `name` (a part of the queue's name) and `key=value` pairs on its metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from core.errors import InvalidInput

MAX_FILTERS = 20
MAX_FILTER_VALUE = 256


def _spelled(value: str) -> tuple[Any, ...]:
    """What a filter value matches: the string itself and, when it spells one, the JSON scalar (`1` -> 1,
    `true` -> true, `null` -> null): a query string cannot say which was meant."""
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return (value,)
    if isinstance(parsed, dict | list) or parsed == value:
        return (value,)
    return value, parsed


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1 in Python; JSON keeps them apart
        return a is b
    return bool(a == b)


@dataclass(frozen=True, slots=True)
class QueueFilter:
    name: str | None = None  # queues whose name holds this text
    metadata: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # key -> the values it may have

    @classmethod
    def of(cls, name: str | None, pairs: list[tuple[str, str]]) -> QueueFilter:
        if len(pairs) > MAX_FILTERS:
            raise InvalidInput(
                f"A queue listing takes at most {MAX_FILTERS} metadata filters; got {len(pairs)}."
            )
        for key, value in pairs:  # each key once: the route's QuerySpec refuses a=1&a=2
            if not key:
                raise InvalidInput("A metadata filter needs a key: key=value.")
            if len(value) > MAX_FILTER_VALUE or len(key) > MAX_FILTER_VALUE:
                raise InvalidInput(f"Metadata filter {key[:40]!r}: at most {MAX_FILTER_VALUE} characters.")
        if name is not None and not 1 <= len(name) <= 64:
            raise InvalidInput(
                f"name filters by a part of a queue name: 1 to 64 characters; got {len(name)}."
            )
        return cls(name, tuple((key, _spelled(value)) for key, value in pairs))

    @property
    def active(self) -> bool:
        return self.name is not None or bool(self.metadata)

    def matches(self, name: str, metadata: dict[str, Any] | None) -> bool:
        if self.name is not None and self.name not in name:
            return False
        meta = metadata or {}
        return all(key in meta and any(_same(meta[key], v) for v in values) for key, values in self.metadata)

"""A store whose every storage call is an OpenTelemetry span (CHARON_TRACING; app/tracing.py wraps the app's
store in one only then, so a service without tracing pays nothing).

`TracedStore` satisfies the `Store` protocol by delegating each of its coroutine methods, read from the
protocol itself (a method added to `storage.base.Store` is traced without a change here), inside a span
`store.<method>` with the queue's `charon.project` and `charon.queue` when the call names a queue. Anything
else (`wakeups()`, a driver's own members such as a `PooledStore`'s catalogue) is the wrapped store's.
Whoever asks what kind of store it has (`isinstance(store, PooledStore)`) asks `unwrapped(store)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from core.models import QueueRef
from storage.base import Store

if TYPE_CHECKING:
    from opentelemetry.trace import SpanKind, Tracer

# Every coroutine method of the protocol (its own and its parents'), in a stable order.
TRACED = tuple(
    name
    for name in sorted(dir(Store))
    if not name.startswith("_") and inspect.iscoroutinefunction(getattr(Store, name))
)


class TracedStore:
    def __init__(self, inner: Store, tracer: Tracer) -> None:
        from opentelemetry.trace import SpanKind  # only with tracing: the module imports nothing of it

        self.inner = inner
        self.tracer = tracer
        self.kind: SpanKind = SpanKind.CLIENT  # a call to another service

    def __getattr__(self, name: str) -> Any:  # only for what the class does not define
        return getattr(self.inner, name)


def _traced(name: str) -> Callable[..., Awaitable[Any]]:
    span_name = f"store.{name}"

    async def call(self: TracedStore, *args: Any, **kwargs: Any) -> Any:
        q = args[0] if args and isinstance(args[0], QueueRef) else None
        attributes = {"charon.project": q.project, "charon.queue": q.name} if q is not None else None
        with self.tracer.start_as_current_span(span_name, kind=self.kind, attributes=attributes):
            return await getattr(self.inner, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


for _name in TRACED:
    setattr(TracedStore, _name, _traced(_name))


def traced(store: Store, tracer: Tracer) -> Store:
    """`store` with a span around each call."""
    return cast(Store, TracedStore(store, tracer))


def unwrapped(store: Store) -> Store:
    """The store a TracedStore wraps; any other store itself."""
    return store.inner if isinstance(store, TracedStore) else store

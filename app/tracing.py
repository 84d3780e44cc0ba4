"""CHARON_TRACING: OpenTelemetry traces over OTLP/HTTP, from the `tracing` extra (imported only when on).

The app is instrumented with opentelemetry-instrumentation-fastapi, whose middleware wraps the whole app and
names each request's span by the route it matched, a plain Starlette route (api/routing.py) as well as a
FastAPI one (it matches the app's own route table); the store is wrapped in a `storage.traced.TracedStore`,
so each storage call is a child span `store.<method>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.trace import TracerProvider

    from app.settings import Settings

SERVICE_NAME = "charon"
STORE_TRACER = "charon.store"  # the tracer of the store's spans (app/main.py)


def exporting_provider(settings: Settings) -> SDKTracerProvider:
    """A tracer provider that batches spans to the OTLP/HTTP endpoint of the settings (or the exporter's
    default, from OTEL_EXPORTER_OTLP_* or localhost:4318). OTEL_SERVICE_NAME names the service, else
    `charon`."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource({"service.name": SERVICE_NAME}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=Resource.create().merge(resource))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.tracing_endpoint)))
    return provider


def instrument(app: FastAPI, provider: TracerProvider) -> None:
    """Trace every request of `app` with `provider`."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    # no spans of their own for each ASGI receive and send: a request's span and its storage calls'
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider, exclude_spans=["receive", "send"])

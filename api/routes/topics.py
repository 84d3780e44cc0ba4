"""Zaqar's topics (`/v2/topics`, since Stein): create, list, get, patch, delete, stats, purge; post, list,
get and delete messages; subscriptions, each told of every message posted (fan-out).

A topic is a queue of the project's topic space (core.models.topics_of): every route here is the queue
route of the same shape served again at the topic's path (api/routing.served_at), whose endpoint reads the
topic from the path (api/deps.py `in_topics`). So a topic is kept, counted, expired, notified and purged on
every store exactly as a queue, and no project's queues are another's topics. What a topic lacks: claims,
and so dead letters and redrive (a topic refuses the keys that act on them, service/queues.py), and
pre-signed URLs. Rules: Zaqar's `topics:*` for the topic itself, `messages:*` and `subscription:*` for its
messages and subscriptions, as Zaqar enforces them."""

from __future__ import annotations

from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from api.routes import messages, queues, subscriptions
from api.routing import RULE_KEY, PlainRoute, served_at
from api.schemas import TopicsPage

Q = "/v2/queues/{queue_name}"
T = "/v2/topics/{topic_name}"
S = "/subscriptions/{subscription_id}"
TOPIC_METADATA_BODY = {  # the queue's metadata without the keys that act on claims (api/contract.py)
    "requestBody": {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TopicMetadata"}}}
    }
}

# (method, the queue route's path, the topic route's rule, its summary, what it changes besides)
ROUTES: tuple[tuple[str, str, str, str, dict[str, Any]], ...] = (
    (
        "GET",
        "/v2/queues",
        "topics:get_all",
        "List the project's topics (filters: `name`, and `key=value` on metadata, as for queues)",
        {"response_model": TopicsPage},
    ),
    (
        "PUT",
        Q,
        "topics:create",
        "Create a topic (201), or leave an existing one as it is (204)",
        {"openapi_extra": TOPIC_METADATA_BODY},
    ),
    ("GET", Q, "topics:get", "Topic metadata, reserved keys filled with their defaults", {}),
    ("PATCH", Q, "topics:update", "Update a topic's metadata (JSON patch)", {}),
    ("DELETE", Q, "topics:delete", "Delete a topic with its messages and subscriptions", {}),
    ("GET", f"{Q}/stats", "topics:stats", "A topic's stats", {}),
    ("POST", f"{Q}/purge", "topics:purge", "Delete a topic's messages, subscriptions or both", {}),
    ("POST", f"{Q}/messages", "messages:create", "Post messages to a topic: each subscriber is told", {}),
    ("GET", f"{Q}/messages", "messages:get_all", "List a topic's messages, or get them by ids", {}),
    ("DELETE", f"{Q}/messages", "messages:delete_all", "Delete a topic's messages by ids, or pop", {}),
    ("GET", f"{Q}/messages/{{message_id}}", "messages:get", "Get one message of a topic", {}),
    ("DELETE", f"{Q}/messages/{{message_id}}", "messages:delete", "Delete one message of a topic", {}),
    ("POST", f"{Q}/subscriptions", "subscription:create", "Subscribe to a topic", {}),
    ("GET", f"{Q}/subscriptions", "subscription:get_all", "List a topic's subscriptions", {}),
    ("GET", f"{Q}{S}", "subscription:get", "Get a subscription of a topic", {}),
    ("PATCH", f"{Q}{S}", "subscription:update", "Change a subscription of a topic", {}),
    ("DELETE", f"{Q}{S}", "subscription:delete", "Unsubscribe from a topic", {}),
    (
        "PUT",
        f"{Q}{S}/confirm",
        "subscription:confirm",
        "Confirm (or end) a subscription of a topic",
        {},
    ),
)


def _method(route: BaseRoute) -> str:
    if isinstance(route, PlainRoute):
        return route.method
    assert isinstance(route, APIRoute)
    return next(iter(route.methods or ()))


def topic_routes() -> list[BaseRoute]:
    """The topic routes, each the queue route of its row served at the topic's path."""
    declared = {
        (_method(r), getattr(r, "path", "")): r
        for module in (queues, messages, subscriptions)
        for r in module.router.routes
    }
    routes = []
    for method, path, rule, summary, changes in ROUTES:
        route = declared[(method, path)]
        changes = dict(changes)
        extra = {
            **(changes.pop("openapi_extra", None) or route.declared.get("openapi_extra") or {}),
            RULE_KEY: rule,
        }
        routes.append(
            served_at(
                route,
                path.replace("/v2/queues/{queue_name}", T).replace("/v2/queues", "/v2/topics"),
                summary=summary,
                description=f"As `{method} {path}`, on a topic.",
                tags=["topics"],
                openapi_extra=extra,
                **changes,
            )
        )
    return routes

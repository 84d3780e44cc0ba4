"""Who may call what: oslo.policy, with Zaqar's rule names and defaults (zaqar/common/policies/) and rules of
the same form for Charon's extensions. An operator's policy file (CHARON_POLICY_FILE, oslo.policy's YAML)
overrides any of them; `oslopolicy-sample-generator`'s format is what `charon policy` prints (the defaults).

Each route names its rule where it is declared (api/routing.py looks it up here by method and path), and a
test holds every operation of openapi.yaml to a rule. The policy file is read once, when the service starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from oslo_config import cfg
from oslo_policy import policy

from core.errors import PolicyDenied

UNPROTECTED = ""  # Zaqar's: any caller the authentication let in (projects are kept apart by the store)
ADMIN = "role:{admin}"  # Zaqar's ROLE_ADMIN, with the operator's admin role (CHARON_ADMIN_ROLE)
ANYONE = "@"  # oslo.policy's "always": under it the API docs ask no credentials (api/routes/docs.py)

Q = "/v2/queues/{queue_name}"
T = "/v2/topics/{topic_name}"  # a topic's messages and subscriptions are under the queues' rules, as in Zaqar

# (name, check, method, path, description): Zaqar's rules first, in its order, then Charon's (EXT).
RULES: tuple[tuple[str, str, str, str, str], ...] = (
    ("queues:get_all", UNPROTECTED, "GET", "/v2/queues", "List queues."),
    ("queues:create", UNPROTECTED, "PUT", Q, "Create a queue."),
    ("queues:get", UNPROTECTED, "GET", Q, "Get a queue's metadata."),
    ("queues:delete", UNPROTECTED, "DELETE", Q, "Delete a queue."),
    ("queues:update", UNPROTECTED, "PATCH", Q, "Update a queue's metadata."),
    ("queues:stats", UNPROTECTED, "GET", f"{Q}/stats", "Get a queue's stats."),
    ("queues:share", UNPROTECTED, "POST", f"{Q}/share", "Create a pre-signed URL for a queue."),
    ("queues:purge", UNPROTECTED, "POST", f"{Q}/purge", "Purge a queue's resources."),
    ("messages:get_all", UNPROTECTED, "GET", f"{Q}/messages", "List messages (and a DLQ's dead letters)."),
    ("messages:create", UNPROTECTED, "POST", f"{Q}/messages", "Post messages."),
    ("messages:get", UNPROTECTED, "GET", f"{Q}/messages/{{message_id}}", "Get a message."),
    ("messages:delete", UNPROTECTED, "DELETE", f"{Q}/messages/{{message_id}}", "Delete a message."),
    ("messages:delete_all", UNPROTECTED, "DELETE", f"{Q}/messages", "Delete (acknowledge) messages by id."),
    ("claims:create", UNPROTECTED, "POST", f"{Q}/claims", "Claim messages (long polling with wait)."),
    ("claims:get", UNPROTECTED, "GET", f"{Q}/claims/{{claim_id}}", "Get a claim."),
    ("claims:delete", UNPROTECTED, "DELETE", f"{Q}/claims/{{claim_id}}", "Release or acknowledge a claim."),
    ("claims:update", UNPROTECTED, "PATCH", f"{Q}/claims/{{claim_id}}", "Renew a claim."),
    ("subscription:get_all", UNPROTECTED, "GET", f"{Q}/subscriptions", "List a queue's subscriptions."),
    ("subscription:create", UNPROTECTED, "POST", f"{Q}/subscriptions", "Subscribe to a queue."),
    ("subscription:get", UNPROTECTED, "GET", f"{Q}/subscriptions/{{subscription_id}}", "Get a subscription."),
    ("subscription:delete", UNPROTECTED, "DELETE", f"{Q}/subscriptions/{{subscription_id}}", "Unsubscribe."),
    ("subscription:update", UNPROTECTED, "PATCH", f"{Q}/subscriptions/{{subscription_id}}", "Change one."),
    (
        "subscription:confirm",
        UNPROTECTED,
        "PUT",
        f"{Q}/subscriptions/{{subscription_id}}/confirm",
        "Confirm (or unsubscribe) a subscription.",
    ),
    ("topics:get_all", UNPROTECTED, "GET", "/v2/topics", "List all topics."),
    ("topics:create", UNPROTECTED, "PUT", T, "Create a topic."),
    ("topics:get", UNPROTECTED, "GET", T, "Get details about a specific topic."),
    ("topics:delete", UNPROTECTED, "DELETE", T, "Delete a topic."),
    ("topics:update", UNPROTECTED, "PATCH", T, "Update a topic."),
    ("topics:stats", UNPROTECTED, "GET", f"{T}/stats", "Get statistics about a specific topic."),
    ("topics:purge", UNPROTECTED, "POST", f"{T}/purge", "Purge resources from a particular topic."),
    ("pools:get_all", ADMIN, "GET", "/v2/pools", "List pools."),
    ("pools:create", ADMIN, "PUT", "/v2/pools/{pool_name}", "Register a pool."),
    ("pools:get", ADMIN, "GET", "/v2/pools/{pool_name}", "Get a pool."),
    ("pools:delete", ADMIN, "DELETE", "/v2/pools/{pool_name}", "Remove a pool."),
    ("pools:update", ADMIN, "PATCH", "/v2/pools/{pool_name}", "Change a pool."),
    ("flavors:get_all", UNPROTECTED, "GET", "/v2/flavors", "List flavors."),
    ("flavors:create", ADMIN, "PUT", "/v2/flavors/{flavor_name}", "Create a flavor."),
    ("flavors:get", UNPROTECTED, "GET", "/v2/flavors/{flavor_name}", "Get a flavor."),
    ("flavors:delete", ADMIN, "DELETE", "/v2/flavors/{flavor_name}", "Delete a flavor."),
    ("flavors:update", ADMIN, "PATCH", "/v2/flavors/{flavor_name}", "Change a flavor."),
    ("health:get", UNPROTECTED, "GET", "/v2/health", "Whether the storage answers (EXT: any caller)."),
    ("home:get", UNPROTECTED, "GET", "/v2", "The v2 home document (EXT)."),
    # Charon's extensions
    (
        "health:get_detailed",
        ADMIN,
        "GET",
        "/v2/health",
        "See the pool catalogue and each pool in the health answer (Zaqar's admin-only health).",
    ),
    (
        "metrics:get",
        ADMIN,
        "GET",
        "/metrics",
        "Read the service's Prometheus metrics, every project's queues in them (EXT; a scraper's bearer "
        "token or loopback address may be let in without it: CHARON_METRICS__*).",
    ),
    (
        "messages:release",
        UNPROTECTED,
        "POST",
        f"{Q}/messages/{{message_id}}/release",
        "Release one claimed message, optionally with a delay (EXT).",
    ),
    (
        "messages:dead_letter",
        UNPROTECTED,
        "POST",
        f"{Q}/messages/{{message_id}}/dead_letter",
        "Reject a claimed message: move it to the queue's DLQ now (EXT).",
    ),
    ("quotas:get", UNPROTECTED, "GET", "/v2/quotas/{project}", "Read a project's quotas, its own (EXT)."),
    (
        "quotas:get_any",
        ADMIN,
        "GET",
        "/v2/quotas/{project}",
        "Read another project's quotas too (EXT; checked after quotas:get).",
    ),
    ("quotas:update", ADMIN, "PUT", "/v2/quotas/{project}", "Set a project's quotas (EXT)."),
    ("quotas:delete", ADMIN, "DELETE", "/v2/quotas/{project}", "Remove a project's quotas (EXT)."),
    ("redrive:create", UNPROTECTED, "POST", f"{Q}/redrive", "Redrive a DLQ's messages, or preview it (EXT)."),
    ("redrive:get_all", UNPROTECTED, "GET", f"{Q}/redrive", "List a DLQ's redrive tasks (EXT)."),
    ("redrive:get", UNPROTECTED, "GET", f"{Q}/redrive/{{task_id}}", "Get a redrive task (EXT)."),
    ("redrive:delete", UNPROTECTED, "DELETE", f"{Q}/redrive/{{task_id}}", "Cancel a redrive task (EXT)."),
    (
        "docs:get",
        ANYONE,
        "GET",
        "/docs",
        "Read the API documentation: Swagger UI (/docs), ReDoc (/redoc) and their assets (EXT; without "
        "credentials while the rule lets anyone in: api/routes/docs.py).",
    ),
    (
        "console:get",
        ANYONE,
        "GET",
        "/console",
        "Load the dead-letter console's page and its files (EXT; without credentials while the rule lets "
        "anyone in: the page then calls the API with the operator's own, api/routes/console.py).",
    ),
)

# Routes no rule guards: they answer without credentials (the version document, ping, the probes, the API
# document).
PUBLIC = frozenset(
    {("GET", "/"), ("GET", "/v2/ping"), ("GET", "/livez"), ("GET", "/readyz"), ("GET", "/openapi.json")}
)


def rule_defaults(admin_role: str) -> list[policy.RuleDefault]:
    base = [
        policy.RuleDefault("context_is_admin", ADMIN.format(admin=admin_role)),
        policy.RuleDefault("admin_or_owner", "is_admin:True or project_id:%(project_id)s"),
    ]
    return base + [
        policy.DocumentedRuleDefault(
            name=name,
            check_str=check.format(admin=admin_role),
            description=description,
            operations=[{"path": path, "method": method}],
        )
        for name, check, method, path, description in RULES
    ]


def rule_for(method: str, path: str) -> str | None:
    """The rule guarding a route (the first of RULES naming its operation); None for a public one. A route
    with neither is a programming error."""
    path = path.rstrip("/") or "/"  # /v2/ is /v2
    if (method, path) in PUBLIC:
        return None
    for name, _check, m, p, _description in RULES:
        if (m, p) == (method, path):
            return name
    raise LookupError(f"no policy rule names {method} {path}: add one to api/policy.py RULES")


class Policy:
    """`authorize(rule, creds)`: PolicyDenied (403 naming the rule) unless the rule lets the caller in.

    The rules are loaded once (defaults, then the operator's file over them); after that oslo.policy is
    told not to look at its configuration again (`use_conf`): it would otherwise search for the file on
    every check (about 50 us). Decisions are kept per caller: a check is a pure function of the rule, the
    target (the caller's own project) and the credentials."""

    def __init__(self, admin_role: str, policy_file: Path | None = None) -> None:
        conf = cfg.ConfigOpts()
        conf([], project="charon", default_config_files=[], default_config_dirs=[])
        self._enforcer = policy.Enforcer(conf, policy_file=str(policy_file) if policy_file else None)
        conf.set_override("policy_dirs", [], group="oslo_policy")
        self._enforcer.register_defaults(rule_defaults(admin_role))
        try:
            self._enforcer.load_rules()
            self._enforcer.check_rules(raise_on_violation=True)
        except policy.InvalidDefinitionError as exc:
            raise ValueError(
                f"the policy file {policy_file} refers to rules it does not define: {exc}"
            ) from None
        except (ValueError, TypeError, AttributeError) as exc:  # YAML that is not a mapping of strings
            raise ValueError(f"the policy file {policy_file} could not be read: {exc}") from None
        broken = [
            name
            for name, rule in self._enforcer.file_rules.items()
            if str(self._enforcer.rules[name]) == "!" and rule.check_str.strip() != "!"
        ]
        if broken:  # oslo.policy reads a rule it cannot parse as "deny everyone" and goes on
            raise ValueError(
                f"the policy file {policy_file} has rules that do not parse: {', '.join(broken)}"
            )
        self._enforcer.use_conf = False
        self._decisions: dict[tuple[Any, ...], bool] = {}
        unknown = set(self._enforcer.file_rules) - set(self._enforcer.registered_rules)
        self.unknown_rules = sorted(unknown)  # names in the operator's file that no operation checks

    def check_str(self, rule: str) -> str:
        return str(self._enforcer.rules[rule])

    def lets_anyone_in(self, rule: str) -> bool:
        """Whether `rule` is "always" (`@`, or an empty check), so a caller need not say who it is."""
        return self.check_str(rule) == ANYONE

    def allows(self, rule: str, project: str | None, user: str | None, roles: Iterable[str]) -> bool:
        key = (rule, project, user, *roles)
        decision = self._decisions.get(key)
        if decision is None:
            roles = list(roles)
            creds = {"project_id": project, "user_id": user, "roles": roles, "is_admin": False}
            creds["is_admin"] = self._enforcer.authorize("context_is_admin", {}, creds)
            decision = bool(self._enforcer.authorize(rule, {"project_id": project}, creds))
            if len(self._decisions) >= 10_000:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def authorize(self, rule: str, project: str | None, user: str | None, roles: Iterable[str]) -> None:
        if not self.allows(rule, project, user, roles):
            raise PolicyDenied(
                f"The policy rule {rule!r} does not allow this call to your credentials "
                f"(rule: {self.check_str(rule) or 'any caller'}).",
                rule,
            )

"""Every Redis key name, built in one place (the Lua side derives the same names; see lua/lib.lua).

All keys of a project share the hash tag ``{<project>}``, so every script's keys, a queue's DLQ included,
live in one Redis Cluster slot. The trade-off: one project is one slot, so a single very large tenant cannot
spread over a cluster's shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.models import QueueRef

KEY_LAYOUT_VERSION = 1


def _tag(project: str) -> str:
    # '{' and '}' would end the hash tag early and '%' is the escape itself; the rest is kept as is.
    return project.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def project_prefix(namespace: str, project: str) -> str:
    return f"{namespace}:{{{_tag(project)}}}:"


def projects_key(namespace: str) -> str:
    """SET of every project that has had a queue; the sweeper's periodic full scan walks it."""
    return f"{namespace}:projects"


def touched_key(namespace: str) -> str:
    """SET of projects some script ran on since the sweeper last took the set: their due times may be new."""
    return f"{namespace}:touched"


def due_projects_key(namespace: str) -> str:
    """ZSET project -> its earliest due time as the sweeper last saw it."""
    return f"{namespace}:due-projects"


def tasks_key(namespace: str) -> str:
    """ZSET of running redrive tasks, as JSON [project, queue, task id] -> when their runner's lease ends
    (0: not taken yet). An index only: each task's own hash is the truth."""
    return f"{namespace}:tasks"


def task_key(namespace: str, project: str, task_id: str) -> str:
    return f"{project_prefix(namespace, project)}t:{task_id}"


def task_index_key(namespace: str, project: str, queue: str) -> str:
    """ZSET task id -> created ms: the redrive tasks of DLQ `queue` (task_create.lua writes it too)."""
    return f"{project_prefix(namespace, project)}tasks:{queue}"


def sweeper_lease_key(namespace: str) -> str:
    return f"{namespace}:sweeper-lease"


def health_key(namespace: str) -> str:
    """STRING written by GET /v2/health to see whether Redis takes writes (expires after 10 s)."""
    return f"{namespace}:health"


def full_scan_key(namespace: str) -> str:
    return f"{namespace}:sweeper-full-scan"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    prefix: str
    name: str

    @classmethod
    def of(cls, namespace: str, q: QueueRef) -> QueueKeys:
        return cls(project_prefix(namespace, q.project), q.name)

    @property
    def queue(self) -> str:
        return f"{self.prefix}q:{self.name}"

    @property
    def queues(self) -> str:
        return f"{self.prefix}queues"

    def idempotency(self, key: str) -> str:
        """HASH fp (the post's fingerprint), ids, until: an Idempotency-Key's record (post_messages.lua)."""
        return f"{self.queue}:idem:{key}"

    def all(self) -> list[str]:
        """The KEYS every queue script takes, in lib.lua's keys_from() order."""
        base = self.queue
        return [
            base,
            f"{base}:msgs",
            f"{base}:ready",
            f"{base}:delayed",
            f"{base}:claimed",
            f"{base}:expiry",
            self.queues,
            f"{self.prefix}due",
        ]

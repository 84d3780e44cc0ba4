"""The notifier's settings, nested in the app's Settings as `notifications`: CHARON_NOTIFICATIONS__<NAME>."""

from __future__ import annotations

from pydantic import BaseModel, Field, IPvAnyNetwork, SecretStr


class NotificationSettings(BaseModel):
    model_config = {"frozen": True}

    process: bool = Field(
        True,
        description="`charon serve` delivers from a process of its own (`charon notify`, restarted if it "
        "dies), at a lower CPU priority than the API workers (`nice`), so that a burst of notifications "
        "never slows posting and claiming: on a saturated machine deliveries wait (durably, in the outbox) "
        "and catch up. false: every API worker delivers in its own event loop.",
    )
    external: bool = Field(
        False,
        description="Deliveries are made by `charon notify` processes run apart (a container or a pod of "
        "their own, as deploy/kubernetes runs them): `charon serve` starts no notifier and its workers "
        "deliver nothing, whatever `process` says. Posts still write the outbox, which those processes "
        "drain.",
    )
    nice: int = Field(
        19,
        ge=0,
        le=19,
        description="How much lower the notifier process's CPU priority is than the API workers' (added "
        "to its nice value; 19, the most: it runs on what they leave; 0: the same).",
    )
    require_confirmation: bool = Field(
        False,
        description="Whether a new subscription is told nothing but its confirmation request until it is "
        "confirmed (PUT .../subscriptions/{id}/confirm, which the request's pre-signed URL allows); needs "
        "CHARON_SIGNED_URL_KEY. Zaqar's default: off.",
    )
    webhook_timeout: float = Field(
        5.0,
        gt=0,
        le=300,
        description="Seconds a webhook delivery may take in all (connecting, sending, the answer); past it "
        "the delivery is tried again later. Also the longest a delivery waits for a free slot.",
    )
    max_concurrent: int = Field(
        32,
        ge=1,
        le=10_000,
        description="Most deliveries in flight at once in one process (webhook and mail).",
    )
    max_per_subscriber: int = Field(
        4,
        ge=1,
        le=1000,
        description="Most deliveries in flight at once to one subscription, so that a subscriber that hangs "
        "holds at most this many of the max_concurrent slots.",
    )
    allowed_networks: tuple[IPvAnyNetwork, ...] = Field(
        (),
        description='Networks (CIDRs, a JSON list: \'["127.0.0.0/8", "::1/128"]\') a webhook may reach '
        "although they are loopback, link-local, unspecified, multicast or reserved, which are refused "
        "otherwise, and the DENIED_NETWORKS: an allowed network is the exception to every refusal. Private "
        "networks (10/8, 172.16/12, 192.168/16, fc00::/7) are allowed unless denied.",
    )
    denied_networks: tuple[IPvAnyNetwork, ...] = Field(
        (),
        description='Networks (CIDRs, a JSON list: \'["10.0.0.0/8", "172.16.0.0/12"]\') a webhook may not '
        "reach, private ones included: a Charon beside internal services keeps tenants from aiming webhooks "
        "at them. ALLOWED_NETWORKS makes exceptions. Checked at subscribing (an IP given in the URL) and at "
        "each delivery (every address a name resolves to).",
    )
    smtp_host: str = Field(
        "",
        description="The SMTP server mailto: notifications are sent through; empty: mail is off, and a "
        "mailto: subscriber is refused (400) when a subscription is created or changed.",
    )
    smtp_port: int = Field(25, ge=1, le=65535, description="The SMTP server's port (465 with smtp_tls).")
    smtp_username: str = Field("", description="The SMTP login; empty: no login.")
    smtp_password: SecretStr = Field(SecretStr(""), description="The SMTP login's password.")
    smtp_starttls: bool = Field(False, description="Upgrade the SMTP connection with STARTTLS (port 587).")
    smtp_tls: bool = Field(
        False,
        description="Implicit TLS from the start (SMTPS, port 465; what Zaqar's smtplib.SMTP_SSL does).",
    )
    smtp_sender: str = Field(
        "charon@localhost",
        description="The From address of a notification mail whose subscription options give no `from`.",
    )
    smtp_timeout: float = Field(10.0, gt=0, le=300, description="Seconds sending one mail may take in all.")

    @property
    def own_process(self) -> bool:
        """Whether `charon serve` starts a notifier process of its own beside its workers."""
        return self.process and not self.external

    @property
    def in_workers(self) -> bool:
        """Whether the API workers deliver, in their own event loops."""
        return not self.process and not self.external

"""Who a Keystone token belongs to: validated with keystoneauth1 (OpenStack's own client library), the
service's own credentials in a keystoneauth1 Session, and each answer cached until the token expires (or for
`cache_seconds`, whichever comes first) in a bounded cache.

keystonemiddleware's `auth_token` is not used: it is WSGI middleware, and its in-process cache (used when no
memcached is configured) has no size bound and walks every entry on each read. The validation is the same
call it makes (GET /v3/auth/tokens with X-Subject-Token), and `cache_seconds` defaults to its
`token_cache_time`: a token revoked after it was cached is still honoured that long, as with
keystonemiddleware.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

import cachetools
from keystoneauth1 import access
from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3
from pydantic import BaseModel, Field, SecretStr

from core.errors import IdentityUnavailable, NotAuthorized, Unauthenticated

log = logging.getLogger("charon.keystone")
INVALID_CACHE_SECONDS = 60  # how long a token Keystone refused is refused without asking again
CREDENTIALS_RETRY_S = 10.0  # after Keystone refused the service user's password
LOG_EVERY_S = 10.0  # Keystone failures are logged at most this often (one line, with how many since)


class KeystoneSettings(BaseModel):
    """CHARON_KEYSTONE__*: where Keystone is and the service user Charon validates tokens as."""

    auth_url: str = Field(
        "http://127.0.0.1:5000/v3", description="Keystone's v3 API, e.g. http://keystone:5000/v3."
    )
    www_authenticate_uri: str | None = Field(
        None,
        description="The Keystone URL a 401 sends clients to (WWW-Authenticate: Keystone uri=...); unset: "
        "auth_url.",
    )
    username: str = Field("charon", description="The service user that validates tokens.")
    password: SecretStr = Field(SecretStr(""), description="Its password.")
    project_name: str = Field("service", description="The project its own token is scoped to.")
    user_domain_name: str = Field("Default", description="The service user's domain.")
    project_domain_name: str = Field("Default", description="The service project's domain.")
    cache_seconds: float = Field(
        300,
        ge=0,
        le=3600,
        description="Longest a validated token is trusted without asking Keystone again (never past its "
        "expiry); a token revoked meanwhile is honoured until then (keystonemiddleware's token_cache_time).",
    )
    cache_size: int = Field(10_000, ge=1, le=1_000_000, description="Most tokens kept validated.")
    timeout: float = Field(
        5, gt=0, le=60, description="Seconds Keystone may take to answer before the request gets 503."
    )
    max_concurrent: int = Field(
        8, ge=1, le=64, description="Validations in flight at once per process (each holds a thread)."
    )

    @property
    def authenticate_uri(self) -> str:
        """Where a 401 sends clients for a token."""
        return self.www_authenticate_uri or self.auth_url


@dataclass(frozen=True, slots=True)
class TokenInfo:
    project: str
    roles: tuple[str, ...]
    user: str | None
    expires: float  # Unix time


class TokenValidator:
    """`await validator.validate(token) -> TokenInfo`, or Unauthenticated (401), NotAuthorized (403: not
    scoped to a project) or IdentityUnavailable (503). One call to Keystone per token however many requests
    carry it at once; at most `max_concurrent` calls at a time (keystoneauth1 is blocking: each runs in a
    thread)."""

    def __init__(self, settings: KeystoneSettings) -> None:
        if not settings.password.get_secret_value():
            raise ValueError(
                "CHARON_AUTH=keystone needs the service user's password in CHARON_KEYSTONE__PASSWORD (and "
                "its CHARON_KEYSTONE__AUTH_URL, USERNAME, PROJECT_NAME)"
            )
        self.settings = settings
        self.authenticate_uri = settings.authenticate_uri
        auth = v3.Password(
            auth_url=settings.auth_url,
            username=settings.username,
            password=settings.password.get_secret_value(),
            project_name=settings.project_name,
            user_domain_name=settings.user_domain_name,
            project_domain_name=settings.project_domain_name,
        )
        self._session = ks_session.Session(auth=auth, timeout=settings.timeout)
        self._url = settings.auth_url.rstrip("/") + "/auth/tokens"
        self._cache: cachetools.TLRUCache[bytes, TokenInfo] = cachetools.TLRUCache(
            settings.cache_size, ttu=self._until, timer=time.time
        )
        # tokens Keystone refused (malformed, unknown, expired, revoked): a refusal cannot turn into a
        # validation, so they are refused again without a call for a minute (keystonemiddleware caches
        # invalid tokens too); bounded apart, so that junk tokens do not push valid ones out
        self._refused: cachetools.TTLCache[bytes, str] = cachetools.TTLCache(
            settings.cache_size, ttl=INVALID_CACHE_SECONDS, timer=time.monotonic
        )
        self._pending: dict[bytes, asyncio.Future[TokenInfo]] = {}
        self._slots = asyncio.Semaphore(settings.max_concurrent)
        self._failures = 0
        self._logged_at = 0.0
        # Keystone refused the service user's own password: not tried again for a while, so that a wrong
        # password does not become a login attempt per request (and lock the account where Keystone locks)
        self._credentials_refused_until = 0.0

    def _until(self, _key: bytes, info: TokenInfo, now: float) -> float:
        return min(info.expires, now + self.settings.cache_seconds)

    async def validate(self, token: str) -> TokenInfo:
        key = hashlib.sha256(token.encode("latin-1")).digest()  # tokens are not kept in memory
        info = self._cache.get(key)
        if info is not None:
            return info
        refused = self._refused.get(key)
        if refused is not None:
            raise Unauthenticated(refused, self.authenticate_uri)
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[TokenInfo] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            info = await self._ask_in_a_slot(token)
        except BaseException as exc:
            if isinstance(exc, Unauthenticated):
                self._refused[key] = str(exc)
            elif isinstance(exc, IdentityUnavailable):
                self._log_failure(exc)
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        else:
            future.set_result(info)
            if self.settings.cache_seconds > 0:
                self._cache[key] = info
            return info
        finally:
            del self._pending[key]

    async def _ask_in_a_slot(self, token: str) -> TokenInfo:
        """Keystone's answer, from one of the `max_concurrent` slots; 503 when none frees up within the
        timeout (a stalled Keystone must not queue requests for ever)."""
        try:
            await asyncio.wait_for(self._slots.acquire(), self.settings.timeout)
        except TimeoutError:
            raise IdentityUnavailable(
                f"Keystone is answering too slowly: all {self.settings.max_concurrent} validations in flight "
                f"stayed busy for {self.settings.timeout:g} s."
            ) from None
        try:
            return await asyncio.to_thread(self._ask_keystone, token)
        finally:
            self._slots.release()

    def _log_failure(self, exc: IdentityUnavailable) -> None:
        self._failures += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning("token validation failed (%d since the last report): %s", self._failures, exc)
            self._failures, self._logged_at = 0, now

    def _ask_keystone(self, token: str) -> TokenInfo:
        if time.monotonic() < self._credentials_refused_until:
            raise IdentityUnavailable(
                "Keystone refused the service's own credentials a moment ago (CHARON_KEYSTONE__USERNAME, "
                f"PASSWORD, PROJECT_NAME); they are tried again every {CREDENTIALS_RETRY_S:g} s."
            )
        try:
            resp = self._session.get(
                self._url, headers={"X-Subject-Token": token}, authenticated=True, raise_exc=False
            )
        except ks_exceptions.Unauthorized:
            self._credentials_refused_until = time.monotonic() + CREDENTIALS_RETRY_S
            raise IdentityUnavailable(
                "Keystone refused the service's own credentials (CHARON_KEYSTONE__USERNAME, PASSWORD, "
                "PROJECT_NAME), so no token can be validated."
            ) from None
        except ks_exceptions.ClientException as exc:  # connection refused, timeout, discovery, SSL
            raise IdentityUnavailable(
                f"Keystone at {self.settings.auth_url} could not be asked to validate the token "
                f"({type(exc).__name__})."
            ) from None
        if resp.status_code == 404:
            raise Unauthenticated(
                "The X-Auth-Token is not valid: it is malformed, expired or revoked. Get a new token from "
                "Keystone.",
                self.authenticate_uri,
            )
        if resp.status_code != 200:
            raise IdentityUnavailable(
                f"Keystone answered {resp.status_code} when asked to validate the token (a 401 or 403 here "
                "means the service user may not validate tokens)."
            )
        try:
            info = access.create(resp=resp, auth_token=token)
            expires = info.expires
        except (ValueError, KeyError, TypeError):
            raise IdentityUnavailable("Keystone's answer to a token validation could not be read.") from None
        if not info.project_scoped or not info.project_id:
            raise NotAuthorized(
                "The token is not scoped to a project; every queue lives inside a project: get a "
                "project-scoped token (e.g. openstack token issue with --os-project-name)."
            )
        return TokenInfo(
            project=info.project_id,
            roles=tuple(info.role_names or ()),
            user=info.user_id,
            expires=expires.timestamp() if expires else time.time(),
        )

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
import time
from dataclasses import dataclass

import cachetools
from keystoneauth1 import access
from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3
from pydantic import BaseModel, Field, SecretStr

from core.errors import IdentityUnavailable, NotAuthorized, Unauthenticated


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
        self.settings = settings
        self.authenticate_uri = settings.www_authenticate_uri or settings.auth_url
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
        self._pending: dict[bytes, asyncio.Future[TokenInfo]] = {}
        self._slots = asyncio.Semaphore(settings.max_concurrent)

    def _until(self, _key: bytes, info: TokenInfo, now: float) -> float:
        return min(info.expires, now + self.settings.cache_seconds)

    async def validate(self, token: str) -> TokenInfo:
        key = hashlib.sha256(token.encode("latin-1")).digest()  # tokens are not kept in memory
        info = self._cache.get(key)
        if info is not None:
            return info
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[TokenInfo] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            async with self._slots:
                info = await asyncio.to_thread(self._ask_keystone, token)
        except BaseException as exc:
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

    def _ask_keystone(self, token: str) -> TokenInfo:
        try:
            resp = self._session.get(
                self._url, headers={"X-Subject-Token": token}, authenticated=True, raise_exc=False
            )
        except ks_exceptions.Unauthorized:
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

    def close(self) -> None:
        self._session.session.close()

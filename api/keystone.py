"""Who a Keystone token belongs to: validated with keystoneauth1 (OpenStack's own client library), the
service's own credentials in a keystoneauth1 Session, and each answer cached until the token expires (or for
`cache_seconds`, whichever comes first) in a bounded cache. And the Keystone trusts of `trust+` subscribers
(`Trustee`): the service user is their trustee, as Zaqar's [trustee] user is.

keystonemiddleware's `auth_token` is not used: it is WSGI middleware, and its in-process cache (used when no
memcached is configured) has no size bound and walks every entry on each read. The validation is the same
call it makes (GET /v3/auth/tokens with X-Subject-Token), and `cache_seconds` defaults to its
`token_cache_time`: a token revoked after it was cached is still honoured that long, as with
keystonemiddleware.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import cachetools
from keystoneauth1 import access
from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3
from pydantic import BaseModel, Field, SecretStr

from core.errors import IdentityUnavailable, NotAuthorized, Unauthenticated

log = logging.getLogger("charon.keystone")
T = TypeVar("T")
INVALID_CACHE_SECONDS = 60  # how long a token Keystone refused is refused without asking again
CREDENTIALS_RETRY_S = 10.0  # after Keystone refused the service user's password
LOG_EVERY_S = 10.0  # Keystone failures are logged at most this often (one line, with how many since)
TRUST_TOKEN_MARGIN_S = 60.0  # a trust's token is got again this long before it expires
MAX_TRUST_TOKENS = 10_000  # trust-scoped tokens kept per process (one per trust+ subscription notified)


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


def service_session(settings: KeystoneSettings) -> ks_session.Session:
    """A keystoneauth1 Session authenticated as the service user (its token got, and renewed, as needed)."""
    auth = v3.Password(
        auth_url=settings.auth_url,
        username=settings.username,
        password=settings.password.get_secret_value(),
        project_name=settings.project_name,
        user_domain_name=settings.user_domain_name,
        project_domain_name=settings.project_domain_name,
    )
    return ks_session.Session(auth=auth, timeout=settings.timeout)


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
        self._session = service_session(settings)
        self._url = settings.auth_url.rstrip("/") + "/auth/tokens"
        self._cache: cachetools.TLRUCache[bytes, TokenInfo] = cachetools.TLRUCache(
            settings.cache_size, ttu=self._until, timer=time.time
        )
        # tokens refused (Keystone's 404: malformed, unknown, expired, revoked; or not scoped to a project):
        # a refusal cannot turn into a validation, so they are refused again without a call for a minute
        # (keystonemiddleware caches invalid tokens too); bounded apart, so that junk tokens do not push
        # valid ones out
        self._refused: cachetools.TTLCache[bytes, Unauthenticated | NotAuthorized] = cachetools.TTLCache(
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
            raise refused.with_traceback(None)  # the same refusal, its traceback not grown by each raise
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[TokenInfo] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            info = await self._ask_in_a_slot(token)
        except BaseException as exc:
            if isinstance(exc, Unauthenticated | NotAuthorized):
                self._refused[key] = exc
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


class Trustee:
    """The service user as the trustee of Keystone trusts, for Zaqar's `trust+http(s)` subscribers: `make`
    creates a trust with the caller's own token (the caller is its trustor: its roles on its project are
    delegated to the service user, with impersonation, until the subscription expires: Zaqar's
    create_trust_id), and `token` gets a token scoped to a trust (the caller's identity, for the webhook to
    act as it), kept until a minute before it expires. keystoneauth1 is blocking: each call runs in a
    thread of the Trustee's own pool of `max_concurrent` (a call given up on still ends within Keystone's
    timeout, and never holds the threads the loop resolves names with).

    Every token is a login with the service user's password: when Keystone refuses that password (it was
    changed), no login is tried again for CREDENTIALS_RETRY_S, so that retried deliveries do not lock the
    service user out where Keystone locks; a trust Keystone will not scope a token to (expired, deleted)
    is not asked about again for INVALID_CACHE_SECONDS."""

    def __init__(self, settings: KeystoneSettings) -> None:
        self.settings = settings
        self._session = service_session(settings)
        self._trusts = settings.auth_url.rstrip("/") + "/OS-TRUST/trusts"
        self._tokens: cachetools.TLRUCache[str, tuple[str, float]] = cachetools.TLRUCache(
            MAX_TRUST_TOKENS, ttu=lambda _trust, token, _now: token[1] - TRUST_TOKEN_MARGIN_S, timer=time.time
        )
        self._unusable: cachetools.TTLCache[str, bool] = cachetools.TTLCache(
            MAX_TRUST_TOKENS, ttl=INVALID_CACHE_SECONDS, timer=time.monotonic
        )
        self._credentials_refused_until = 0.0
        self._pool = ThreadPoolExecutor(settings.max_concurrent, thread_name_prefix="charon-trustee")

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if time.monotonic() < self._credentials_refused_until:
            raise IdentityUnavailable(
                "Keystone refused the service's own credentials a moment ago (CHARON_KEYSTONE__USERNAME, "
                f"PASSWORD); they are tried again every {CREDENTIALS_RETRY_S:g} s."
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def _credentials_refused(self) -> IdentityUnavailable:
        self._credentials_refused_until = time.monotonic() + CREDENTIALS_RETRY_S
        return IdentityUnavailable(
            "Keystone refused the service's own credentials (CHARON_KEYSTONE__USERNAME, PASSWORD), so no "
            "trust can be made or used for a trust+ subscriber."
        )

    async def make(
        self, token: str, user: str, project: str, roles: tuple[str, ...], expires: datetime
    ) -> str:
        """The id of a new trust from `user` (whose `token` this is) to the service user, of `roles` on
        `project`, ending at `expires`. NotAuthorized (403) when Keystone refuses it (its reason said),
        Unauthenticated when the token is no longer valid, IdentityUnavailable when Keystone cannot be
        asked: in every case no trust was made."""
        return await self._call(self._make, token, user, project, roles, expires)

    def _make(self, token: str, user: str, project: str, roles: tuple[str, ...], expires: datetime) -> str:
        trust = {
            "trustor_user_id": user,
            "project_id": project,
            "impersonation": True,
            "roles": [{"name": role} for role in roles],
            "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        try:
            trust["trustee_user_id"] = self._session.get_user_id()
            resp = self._session.post(
                self._trusts,
                json={"trust": trust},
                headers={"X-Auth-Token": token},
                authenticated=False,
                raise_exc=False,
            )
        except ks_exceptions.Unauthorized:
            raise self._credentials_refused() from None
        except ks_exceptions.ClientException as exc:
            raise IdentityUnavailable(
                f"Keystone at {self.settings.auth_url} could not be asked to make a trust for the trust+ "
                f"subscriber ({type(exc).__name__})."
            ) from None
        if resp.status_code == 201:
            try:
                return str(resp.json()["trust"]["id"])
            except (ValueError, KeyError, TypeError):
                raise IdentityUnavailable("Keystone's answer making a trust could not be read.") from None
        if resp.status_code == 401:
            raise Unauthenticated(
                "Keystone refused the X-Auth-Token when asked to make a trust with it (expired or revoked): "
                "get a new token.",
                self.settings.authenticate_uri,
            )
        if 400 <= resp.status_code < 500:
            raise NotAuthorized(
                "A trust+ subscriber is notified with a Keystone trust from the caller to this service, and "
                f"Keystone refused to make it ({resp.status_code}: {_keystone_error(resp)}). A token that is "
                "itself a trust's cannot make one."
            )
        raise IdentityUnavailable(f"Keystone answered {resp.status_code} when asked to make a trust.")

    async def forget(self, token: str, trust_id: str) -> None:
        """Delete a trust that serves nothing (its subscription was not made), with its trustor's token.
        Best effort: one left behind ends when it expires."""
        url = f"{self._trusts}/{trust_id}"
        try:
            await self._call(
                self._session.delete,
                url,
                headers={"X-Auth-Token": token},
                authenticated=False,
                raise_exc=False,
            )
        except (ks_exceptions.ClientException, IdentityUnavailable) as exc:
            log.warning("unused trust %s not deleted (%s): it ends when it expires", trust_id, exc)

    async def token(self, trust_id: str) -> str:
        """A token scoped to the trust: the trustor's identity, as the trust delegates it. Any exception
        when Keystone will not give one (the trust expired, was deleted, or Keystone is away): the caller
        tries again later."""
        cached = self._tokens.get(trust_id)
        if cached is not None:
            return cached[0]
        if trust_id in self._unusable:
            raise IdentityUnavailable(f"Keystone refused a token of trust {trust_id} a moment ago.")
        got = await self._call(self._trust_token, trust_id)
        self._tokens[trust_id] = got
        return got[0]

    def _trust_token(self, trust_id: str) -> tuple[str, float]:
        auth = v3.Password(
            auth_url=self.settings.auth_url,
            username=self.settings.username,
            password=self.settings.password.get_secret_value(),
            user_domain_name=self.settings.user_domain_name,
            trust_id=trust_id,
        )
        try:
            granted = auth.get_access(ks_session.Session(timeout=self.settings.timeout))
        except ks_exceptions.Unauthorized:
            # the password, or the trust? The service's own token says (a login only once it has expired)
            try:
                self._session.get_auth_headers()
            except ks_exceptions.Unauthorized:
                raise self._credentials_refused() from None
            self._unusable[trust_id] = True
            raise
        expires = granted.expires.timestamp() if granted.expires else time.time() + TRUST_TOKEN_MARGIN_S
        return str(granted.auth_token), expires


def _keystone_error(resp: object) -> str:
    """Keystone's error message from its answer, bounded."""
    try:
        message = resp.json()["error"]["message"]  # type: ignore[attr-defined]
    except Exception:
        return "no reason given"
    return str(message)[:300]

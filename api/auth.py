"""Who is calling, and may they: every guarded route runs `authorize(request, rule)` before anything else
(api/routing.py), which finds the caller's identity the configured way (CHARON_AUTH) and checks the route's
policy rule (api/policy.py). The identity is left in the request's scope for the dependencies (api/deps.py):
the project every queue of the request lives in comes from it, never from anywhere else.

- `noauth` (the embedded default, for development): the project is X-Project-ID and the roles are the roles
  header (X-Roles), as sent: anyone can be anyone.
- `keystone`: X-Auth-Token, validated with Keystone (api/keystone.py); project and roles come from the token.
  X-Project-ID may be sent but must name the token's project; the roles header is ignored.
- `trusted-proxy`: a gateway in front (keystonemiddleware's auth_token, or another) has authenticated the
  caller and set X-Identity-Status: Confirmed, X-Project-ID, X-User-ID and the roles header; anything else
  is 401. Only safe behind a gateway that strips those headers from what clients send.
- Then, in every mode, the project's request rate (service/ratelimit.py): past it, 429 and nothing done.
- In every mode, a request carrying URL-Signature is a pre-signed URL's (api/signed.py): allowed exactly
  the signed methods on the signed paths of the signed project until it expires, without a token.

An identity header sent twice is refused (400) in every mode: a proxy that appends its own instead of
replacing the client's must not let the client's win.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fastapi import Request

from api.head import HEAD_KEY
from api.keystone import TokenValidator
from api.policy import Policy
from api.signed import SignedGrant
from api.state import state_of
from core.clock import Clock
from core.errors import InvalidInput, NotAuthorized, Unauthenticated
from service.ratelimit import RateLimiter

IDENTITY = "charon.identity"  # the scope key of the request's Identity
UNCOUNTED = ("quotas:update", "quotas:delete")  # rules no request rate counts: a throttled admin still acts
MAX_VERIFIED_URLS = 10_000  # pre-signed URLs whose signature was checked, kept per process (then forgotten)
MAX_TOKEN_LEN = 8192  # a Keystone token is a few hundred characters; PKI-era ones some thousands


class AuthMode(StrEnum):
    NOAUTH = "noauth"
    KEYSTONE = "keystone"
    TRUSTED_PROXY = "trusted-proxy"


@dataclass(frozen=True, slots=True)
class Identity:
    project: str | None  # None only in noauth/trusted-proxy without X-Project-ID: api/deps.py says 400
    roles: tuple[str, ...]
    user: str | None
    client: str | None  # the Client-ID header, as sent (checked where a route needs it)


@dataclass(slots=True)
class _Sent:
    """The identity headers of a request, each None when absent."""

    project: str | None = None
    client: str | None = None
    roles: str | None = None
    token: str | None = None
    status: str | None = None
    user: str | None = None
    signature: str | None = None
    expires: str | None = None
    methods: str | None = None
    paths: str | None = None


_HEADERS = {
    b"x-project-id": ("project", "X-Project-ID"),
    b"client-id": ("client", "Client-ID"),
    b"x-auth-token": ("token", "X-Auth-Token"),
    b"x-identity-status": ("status", "X-Identity-Status"),
    b"x-user-id": ("user", "X-User-ID"),
    b"url-signature": ("signature", "URL-Signature"),
    b"url-expires": ("expires", "URL-Expires"),
    b"url-methods": ("methods", "URL-Methods"),
    b"url-paths": ("paths", "URL-Paths"),
}


class Authenticator:
    def __init__(
        self,
        mode: AuthMode,
        policy: Policy,
        *,
        roles_header: str,
        clock: Clock,
        validator: TokenValidator | None = None,
        signing_key: bytes | None = None,
        authenticate_uri: str = "",
        limiter: RateLimiter | None = None,
    ) -> None:
        assert (mode is AuthMode.KEYSTONE) == (validator is not None)
        self.mode = mode
        self.policy = policy
        self.validator = validator
        self.signing_key = signing_key
        self.authenticate_uri = authenticate_uri
        self.limiter = limiter
        self._clock = clock
        self._headers = {**_HEADERS, roles_header.lower().encode("latin-1"): ("roles", roles_header)}
        # verified pre-signed URLs: (signature, expires, methods, paths, project) -> (grant, expires in ms);
        # a signature is an HMAC of the rest, checked once (with the expiry's parse: 8 us of a request)
        self._verified: dict[tuple[str, ...], tuple[SignedGrant, int]] = {}

    def _read(self, request: Request) -> _Sent:
        sent = _Sent()
        headers = self._headers
        for name, value in request.scope["headers"]:  # ASGI: lowercase names, in the order received
            field = headers.get(name)
            if field is not None:
                if getattr(sent, field[0]) is not None:
                    raise sent_twice(field[1])
                setattr(sent, field[0], value.decode("latin-1"))
        return sent

    async def identify(self, request: Request) -> Identity:
        sent = self._read(request)
        if sent.signature is not None:
            return self._signed(request, sent)
        if self.mode is AuthMode.NOAUTH:
            return Identity(sent.project, _roles(sent.roles), None, sent.client)
        if self.mode is AuthMode.TRUSTED_PROXY:
            if sent.status is None or sent.status.strip().lower() != "confirmed":
                raise Unauthenticated(
                    "The gateway in front of this service did not confirm who is calling "
                    "(X-Identity-Status: Confirmed); send a valid X-Auth-Token.",
                    self.authenticate_uri,
                )
            return Identity(sent.project, _roles(sent.roles), sent.user, sent.client)
        return await self._keystone(sent)

    async def _keystone(self, sent: _Sent) -> Identity:
        assert self.validator is not None
        token = sent.token.strip(" \t") if sent.token is not None else None
        if not token:
            raise Unauthenticated(
                "This call needs an X-Auth-Token: get one from Keystone (openstack token issue).",
                self.authenticate_uri,
            )
        if len(token) > MAX_TOKEN_LEN or not token.isascii() or not token.isprintable():
            raise Unauthenticated(
                f"The X-Auth-Token is malformed (at most {MAX_TOKEN_LEN} printable ASCII characters).",
                self.authenticate_uri,
            )
        info = await self.validator.validate(token)
        if sent.project is not None and sent.project != info.project:
            raise NotAuthorized(
                "The X-Project-ID header names another project than the token's. Leave it out (the project "
                "comes from the token) or send the token's own project."
            )
        return Identity(info.project, info.roles, info.user, sent.client)

    def _signed(self, request: Request, sent: _Sent) -> Identity:
        signature = sent.signature or ""
        if self.signing_key is None:
            raise NotAuthorized(
                "Pre-signed URLs are off on this service (an operator turns them on with "
                "CHARON_SIGNED_URL_KEY)."
            )
        missing = [
            header
            for header, value in (
                ("URL-Expires", sent.expires),
                ("URL-Methods", sent.methods),
                ("URL-Paths", sent.paths),
                ("X-Project-ID", sent.project),
            )
            if not value
        ]
        if missing or not (sent.expires and sent.methods and sent.paths and sent.project):
            raise NotAuthorized(f"A pre-signed URL's request also sends {', '.join(missing)}.")
        key = (signature, sent.expires, sent.methods, sent.paths, sent.project)
        verified = self._verified.get(key)
        if verified is None:
            verified = self._verify(signature, sent.expires, sent.methods, sent.paths, sent.project)
            if len(self._verified) >= MAX_VERIFIED_URLS:
                self._verified.clear()
            self._verified[key] = verified
        grant, expires_ms = verified
        if expires_ms <= self._clock.now_ms():
            raise NotAuthorized(f"This pre-signed URL expired at {grant.expires} (UTC).")
        method = "HEAD" if request.scope.get(HEAD_KEY) else request.scope["method"]
        path = request.scope["path"]
        if not grant.allows(method, path):
            raise NotAuthorized(
                f"This pre-signed URL allows {', '.join(sorted(grant.methods))} on "
                f"{', '.join(sorted(grant.paths))} (and what is under them) only; not {method} {path[:200]}."
            )
        return Identity(grant.project, (), None, sent.client)

    def _verify(
        self, signature: str, expires: str, methods: str, paths: str, project: str
    ) -> tuple[SignedGrant, int]:
        """The grant the headers describe and when it expires (ms), once its signature is checked."""
        assert self.signing_key is not None
        grant = SignedGrant(
            paths=tuple(p.strip() for p in paths.split(",")),
            methods=tuple(m.strip() for m in methods.split(",")),
            project=project,
            expires=expires.strip(),
        )
        if not grant.verifies(self.signing_key, signature.strip()):
            raise NotAuthorized(
                "The URL-Signature does not match the URL-Paths, URL-Methods, URL-Expires and X-Project-ID "
                "sent with it: use them exactly as the share call answered."
            )
        try:
            return grant, int(grant.expires_at().timestamp() * 1000)
        except ValueError:
            raise NotAuthorized("URL-Expires is not a time as the share call answers it.") from None

    async def authorize(self, request: Request, rule: str) -> Identity:
        identity = await self.identify(request)
        self.policy.authorize(rule, identity.project, identity.user, identity.roles)
        # the project's request rate (429 past it); an admin's change of quotas is not counted, so that an
        # admin whose own project is throttled can still raise a limit
        if self.limiter is not None and identity.project and rule not in UNCOUNTED:
            waiting = self.limiter.admit(identity.project, request.scope["method"])
            if waiting is not None:
                await waiting
        request.scope[IDENTITY] = identity
        return identity


def sent_twice(header: str) -> InvalidInput:
    return InvalidInput(f"The {header} header is sent more than once; send it exactly once.")


def identity_of(request: Request) -> Identity:
    """The identity `authorize` found for this request (a guarded route's)."""
    identity: Identity = request.scope[IDENTITY]
    return identity


def may(request: Request, rule: str) -> bool:
    """Whether the request's caller passes `rule` too (a part of an answer with a rule of its own)."""
    identity = identity_of(request)
    return state_of(request).auth.policy.allows(rule, identity.project, identity.user, identity.roles)


def _roles(header: str | None) -> tuple[str, ...]:
    if not header:
        return ()
    return tuple(sorted({r.strip().lower() for r in header.split(",") if r.strip()}))

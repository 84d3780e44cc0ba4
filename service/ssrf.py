"""The guard that keeps webhook notifications from being aimed at the service's own side of the network
(server-side request forgery): a tenant must not make Charon POST to its loopback, to a cloud's metadata
service (169.254.169.254) or to other addresses no tenant's receiver can have.

Two checks:

- `check_subscriber`, when a subscription is created or changed (pure, no I/O): the URI's shape, and an IP
  literal host in a refused network is a 400 at once;
- at delivery time (`resolve_checked`, before every connect of service/delivery/http1.py): the host is
  resolved, refused when ANY of its addresses is loopback, link-local (169.254.0.0/16, fe80::/10),
  unspecified, multicast or reserved (or 0.0.0.0/8, which Linux treats as this host), and the connection is
  made to the address that was checked, so a name that resolves elsewhere a moment later (DNS rebinding)
  gains nothing.

Private networks (RFC 1918's 10/8, 172.16/12, 192.168/16, and IPv6 fc00::/7) are allowed: OpenStack
tenants' receivers often live there. An operator refuses more networks, private ones included, with
`denied` (CHARON_NOTIFICATIONS__DENIED_NETWORKS: a Charon beside internal services), and allows networks
with `allowed` (CHARON_NOTIFICATIONS__ALLOWED_NETWORKS), e.g. 127.0.0.0/8 for a receiver on the same host:
an allowed network is the exception to every refusal, the denied ones included.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from core.errors import InvalidInput
from core.limits import Limits

SUPPORTED_SCHEMES = ("http", "https", "mailto", "trust+http", "trust+https")
TRUST_PREFIX = "trust+"  # a webhook notified with a Keystone trust's token (Zaqar's trust notifier)


def is_trusted(subscriber: str) -> bool:
    """Whether `subscriber` is a trust+http(s) one: its URL follows TRUST_PREFIX."""
    return subscriber[: len(TRUST_PREFIX)].lower() == TRUST_PREFIX


FIELD = "subscriber"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # connecting to 0.x.x.x reaches this host on Linux
# Networks no check of the ipaddress module names, where clouds keep their metadata services: shared address
# space (100.64.0.0/10: Alibaba's 100.100.100.200) and AWS's IPv6 metadata address.
_METADATA = (ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("fd00:ec2::254/128"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 address in its last 32 bits
_REFUSED_KINDS = (
    ("is_loopback", "loopback"),
    ("is_link_local", "link-local"),
    ("is_unspecified", "unspecified"),
    ("is_multicast", "multicast"),
    ("is_reserved", "reserved"),
)
_LEGACY_IPV4 = re.compile(r"[0-9a-fx.]+")  # 127.1, 2130706433, 0x7f.0.0.1: forms inet_aton reads as IPv4
_ADDRESS = re.compile(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
MAX_ADDRESS = 254
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")  # urlsplit lowercases the host


class Refused(Exception):
    """A webhook's host is refused by the guard at delivery time; the message says which address and why."""


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries, and reaches through a relay or translator: IPv4-mapped
    (::ffff:a.b.c.d), 6to4 (2002::/16), Teredo (2001::/32: its client's address) and NAT64 (64:ff9b::/96)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal(address: Address, allowed: Iterable[Network] = (), denied: Iterable[Network] = ()) -> str | None:
    """Why `address` may not be reached ("loopback", ...), or None when it may: a network in `allowed`
    overrides every refusal, including a network in `denied` (the operator's). An IPv6 address that
    carries an IPv4 one (`embedded_ipv4`: IPv4-mapped, 6to4, Teredo, NAT64) is judged as that IPv4 address:
    2002:7f00:1:: is 127.0.0.1."""
    forms = [address]  # an operator's network may name either form
    if isinstance(address, ipaddress.IPv6Address) and (carried := embedded_ipv4(address)) is not None:
        address = carried
        forms.append(carried)
    if any(a.version == n.version and a in n for a in forms for n in allowed):
        return None
    if any(a.version == n.version and a in n for a in forms for n in denied):
        return "denied (CHARON_NOTIFICATIONS__DENIED_NETWORKS)"
    for attribute, kind in _REFUSED_KINDS:
        if getattr(address, attribute):
            return kind
    if isinstance(address, ipaddress.IPv4Address) and address in _THIS_NETWORK:
        return "this-network (0.0.0.0/8)"
    if any(address.version == n.version and address in n for n in _METADATA):
        return "shared or metadata-service"
    return None


def ip_literal(host: str) -> Address | None:
    """The address when `host` (as urlsplit gives it: lowercase, no brackets) is an IP literal, including
    the legacy IPv4 forms a resolver reads as one (127.1, 2130706433, 0x7f.1), and with a trailing dot
    (127.0.0.1., which resolvers read as the address too); pure, no lookup."""
    host = host[:-1] if host.endswith(".") else host
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _LEGACY_IPV4.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class Mailto:
    address: str
    subject: str | None


def parse_mailto(uri: str) -> Mailto:
    """A `mailto:` subscriber: exactly one plausible address and at most a `subject` header (Zaqar reads it
    with parse_qs, so `+` is a space). Raises InvalidInput naming `subscriber`."""
    parts = urlsplit(uri)
    address = unquote(parts.path)
    if parts.netloc or not _ADDRESS.fullmatch(address) or len(address) > MAX_ADDRESS:
        raise InvalidInput(
            f"{FIELD} must name exactly one e-mail address after mailto: (like mailto:ops@example.com); "
            f"got {_shown(uri)}."
        )
    subject: str | None = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() != "subject":
            raise InvalidInput(f"A mailto: {FIELD} may only have a subject header; got {_shown(key)}.")
        if subject is not None:
            raise InvalidInput(f"A mailto: {FIELD} may have one subject header; got two.")
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise InvalidInput(f"The subject of a mailto: {FIELD} must not contain control characters.")
        subject = value
    return Mailto(address, subject)


def check_subscriber(
    uri: str,
    limits: Limits,
    *,
    allowed_networks: Sequence[Network] = (),
    denied_networks: Sequence[Network] = (),
    mail: bool = True,
) -> str:
    """Validate a subscriber URI given to create or change a subscription, without I/O: http, https (or
    trust+http(s), a webhook notified with a Keystone trust's token, checked alike) or mailto (only when
    `mail`: the service has an SMTP server to send through); at most
    limits.max_subscriber_length characters; an http(s) URI has a host, no user:password@ and a port in
    range; a mailto: URI is what `parse_mailto` takes; an IP-literal host in a refused network (see
    `refusal`; private networks are allowed unless in `denied_networks`) is refused unless in
    `allowed_networks`. A host name is only
    checked when a notification is delivered. Returns `uri`; raises InvalidInput naming `subscriber`."""
    if not isinstance(uri, str) or not uri:
        raise InvalidInput(f"{FIELD} must be a non-empty string (an http, https or mailto URI).")
    if len(uri) > limits.max_subscriber_length:
        raise InvalidInput(
            f"{FIELD} must be at most {limits.max_subscriber_length} characters long; got {len(uri)}."
        )
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in uri):
        raise InvalidInput(f"{FIELD} must not contain spaces or control characters (percent-encode them).")
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - parsed here: ValueError when not a number or above 65535
    except ValueError as exc:
        raise InvalidInput(
            f"{FIELD} is not a valid URI: {str(exc)[:80]} (a port is a number from 1 to 65535, an IPv6 host "
            "is in brackets)."
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise InvalidInput(
            f"The {FIELD} type must be one of the supported ones: {', '.join(SUPPORTED_SCHEMES)}; got "
            f"{_shown(uri)}."
        )
    if scheme == "mailto":
        parse_mailto(uri)
        if not mail:
            raise InvalidInput(
                f"A mailto: {FIELD} needs an SMTP server to send through, and this service has none: its "
                "operator sets CHARON_NOTIFICATIONS__SMTP_HOST (every delivery would otherwise be given up)."
            )
        return uri
    if "@" in parts.netloc:
        raise InvalidInput(f"{FIELD} must not carry a user name or password (user:password@host).")
    host = parts.hostname
    if not host:
        raise InvalidInput(f"An {scheme} {FIELD} needs a host, like {scheme}://receiver.example.com/path.")
    if parts.port == 0:
        raise InvalidInput(
            f"The port of {FIELD} must be a number from 1 to 65535; got {_shown(parts.netloc)}."
        )
    address = ip_literal(host)
    if address is None and _HOST_NAME.fullmatch(host) is None:
        raise InvalidInput(
            f"The host of {FIELD} must be an IP address or a name of ASCII letters, digits, '-' and '.' "
            f"(an international name in its xn-- form); got {_shown(host)}."
        )
    if address is None and (host.rstrip(".") == "localhost" or host.rstrip(".").endswith(".localhost")):
        address = ipaddress.IPv4Address("127.0.0.1")  # RFC 6761: such names are loopback, whatever DNS says
    why = None if address is None else refusal(address, allowed_networks, denied_networks)
    if why is not None:
        raise InvalidInput(
            f"{FIELD} may not reach {host}, a {why} address: webhooks are refused loopback, link-local, "
            "unspecified, multicast and reserved addresses (an operator may allow networks with "
            "CHARON_NOTIFICATIONS__ALLOWED_NETWORKS)."
        )
    return uri


async def resolve_checked(
    host: str, port: int, allowed: Sequence[Network] = (), denied: Sequence[Network] = ()
) -> list[str]:
    """Every address `host` resolves to, in the resolver's order, once each, all of them checked
    (`check_addresses`). socket.gaierror (an OSError) when it does not resolve."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return check_addresses(host, [str(info[4][0]) for info in infos], allowed, denied)


def check_addresses(
    host: str, addresses: Sequence[str], allowed: Sequence[Network] = (), denied: Sequence[Network] = ()
) -> list[str]:
    """`addresses` (of `host`) once each; Refused when ANY of them is refused: a name with one good and one
    internal address could otherwise be steered to the internal one."""
    unique = list(dict.fromkeys(addresses))
    for text in unique:
        why = refusal(ipaddress.ip_address(text.split("%", 1)[0]), allowed, denied)  # without an IPv6 zone
        if why is not None:
            shown = host if host == text else f"{host} resolves to {text}, which"
            raise Refused(f"{shown} is a {why} address, refused to webhooks")
    return unique


def _shown(value: object) -> str:
    return repr(value[:80]) if isinstance(value, str) else repr(value)[:80]

"""Webhook notifications (http, https): the request Zaqar's webhook task makes, and what its answer means.

The body is the document as JSON (json.dumps, Zaqar's format); with the subscription's `post_data` option,
that string with its quoted placeholder `"$zaqar_message$"` replaced by the document's JSON, exactly as
Zaqar does. `post_headers` (an object of strings) are merged over Content-Type: application/json.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from core.errors import InvalidInput
from service.delivery.outcome import Outcome, delivered, failed, retry

PLACEHOLDER = '"$zaqar_message$"'  # quotes included: post_data is a JSON text with the message as a value
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name
_VALUE = re.compile(r"[\t\x20-\x7e]{0,4096}")  # visible ASCII, spaces and tabs: what every hop sends on as is
MAX_HEADERS = 32
# The request's framing and routing are the service's: a subscriber that set them could split one POST into
# two on a kept-alive connection (and read the next request sent on it, maybe another project's), or aim
# the request at another virtual host.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)


def webhook_request(
    options: Mapping[str, Any], document: Mapping[str, Any], auth: Mapping[str, str] | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of the POST for `document` (`auth`: a trust+ subscriber's X-Auth-Token, which
    post_headers may override, as in Zaqar); InvalidInput naming the option when `post_data` is not a
    string or `post_headers` not an object of header names to single-line strings."""
    text = json.dumps(document)
    post_data = options.get("post_data")
    if post_data is not None:
        if not isinstance(post_data, str):
            raise InvalidInput(
                f'options.post_data must be a string (a JSON text where "$zaqar_message$" stands for the '
                f"message); got {type(post_data).__name__}."
            )
        text = post_data.replace(PLACEHOLDER, text)
    headers = {**(auth or {}), "Content-Type": "application/json"}
    for name, value in check_post_headers(options.get("post_headers")).items():
        for same in [h for h in headers if h.lower() == name.lower()]:
            del headers[same]
        headers[name] = value
    return text.encode("utf-8"), headers


def check_post_headers(value: object) -> dict[str, str]:
    """`options.post_headers`: None, or an object of at most MAX_HEADERS header names (RFC 9110 tokens, none
    of RESERVED_HEADERS) to values of visible ASCII, spaces and tabs (at most 4,096)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(
            f"options.post_headers must be an object of header names to strings; got {value!r:.80}."
        )
    if len(value) > MAX_HEADERS:
        raise InvalidInput(f"options.post_headers may hold at most {MAX_HEADERS} headers; got {len(value)}.")
    for name, header in value.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise InvalidInput(f"options.post_headers has an invalid header name {name!r:.80}.")
        if name.lower() in RESERVED_HEADERS or name.lower().startswith("proxy-"):
            raise InvalidInput(
                f"options.post_headers.{name} is the service's to set (it frames and routes the request); "
                f"these may not be given: {', '.join(sorted(RESERVED_HEADERS))}, Proxy-*."
            )
        if not isinstance(header, str) or not _VALUE.fullmatch(header):
            raise InvalidInput(
                f"options.post_headers.{name} must be a string of at most 4,096 visible ASCII characters, "
                f"spaces or tabs; got {header!r:.80}."
            )
    return dict(value)


def outcome_of_status(status: int, location: str | None) -> Outcome:
    """What an answer's status means: 2xx delivered; 408, 429 and 5xx temporary; a redirect is not followed
    (the subscriber names where to POST), so it fails like any other 4xx."""
    if 200 <= status < 300:
        return delivered(f"HTTP {status}")
    if status in (408, 429) or status >= 500:
        return retry(f"HTTP {status}")
    if 300 <= status < 400:
        return failed(f"HTTP {status}: redirects are not followed (to {(location or 'nowhere')[:200]})")
    return failed(f"HTTP {status}")

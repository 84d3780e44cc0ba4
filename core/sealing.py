"""Message bodies encrypted at rest (`_enable_encrypt_messages`, docs/encryption.md): AES-256-GCM through the
`cryptography` library, with the id of the key beside each ciphertext, so keys rotate (every configured key
opens what it sealed; the last one listed seals).

A sealed body is stored as text, where the drivers keep a body's JSON text:

    "\\x01" <key id> "." <base64 of the 12-byte nonce, the ciphertext and its 16-byte tag>

JSON text never starts with a control character (orjson escapes them all), so a stored body is sealed
exactly when it starts with SEALED: nothing else marks it, and a queue's old clear messages stay readable
after encryption is turned on. The key id is the ciphertext's associated data.

Rotation is two steps over every process (docs/encryption.md): add the new key while the old one still
seals (CHARON_ENCRYPTION__CURRENT), then make the new one seal; so no process ever reads a body sealed with
a key it does not have yet. The process's keyring is set once, when the process reads its settings (`use`):
the API, the notifier, `charon insights` and the Spark executors each from CHARON_ENCRYPTION__KEYS. The
drivers seal when a queue's policy asks (`stored_body`) and open every body they read (`body_of`), so
everything above them sees clear bodies, whatever path reads them.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from core.errors import EncryptionUnavailable, InvalidInput, MessageUnreadable

SEALED = "\x01"
KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12
MAX_KEYS = 16
# A notification whose message's body this process cannot open is put off this long, again and again, until
# the key is back (never sent without its body, never holding up the others)
UNREADABLE_PUT_OFF_MS = 60_000
VARIABLE = "CHARON_ENCRYPTION__KEYS"


@dataclass(frozen=True)
class Keyring:
    """Keys by id, in the order configured: `current` seals (by default the last one), each opens what it
    sealed."""

    keys: Mapping[str, bytes] = field(repr=False)  # never in a log line or a traceback's locals
    current: str = ""  # the id of the key that seals; "": the last one
    _ciphers: dict[str, AESGCM] = field(init=False, repr=False, compare=False)  # one per key: made once

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a keyring needs at least one key")
        if not self.current:
            object.__setattr__(self, "current", list(self.keys)[-1])
        elif self.current not in self.keys:
            shown = repr(self.current) if KEY_ID.fullmatch(self.current) else "(not an id: never shown)"
            raise ValueError(f"the key that encrypts, {shown}, is not one of the keys listed")
        object.__setattr__(self, "_ciphers", {kid: AESGCM(key) for kid, key in self.keys.items()})

    @classmethod
    def parse(cls, text: str, current: str = "") -> Keyring:
        """`id:base64key,id:base64key,...` (each key 32 random bytes, base64; `openssl rand -base64 32`).

        Raises:
            ValueError: saying which entry is wrong and how (never showing a key).
        """
        keys: dict[str, bytes] = {}
        entries = [e.strip() for e in text.split(",") if e.strip()]
        if not entries:
            raise ValueError("lists no key: give id:base64key[,id:base64key...]")
        if len(entries) > MAX_KEYS:
            raise ValueError(f"lists {len(entries)} keys; at most {MAX_KEYS}")
        for i, entry in enumerate(entries, 1):
            kid, sep, encoded = entry.partition(":")
            if not sep or not KEY_ID.fullmatch(kid):
                raise ValueError(
                    f"entry {i} is not id:base64key with an id of 1 to 32 letters, digits, '-' or '_'"
                )
            if kid in keys:
                raise ValueError(f"key id {kid!r} is listed twice")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"key {kid!r} is not base64") from None
            if len(key) != KEY_BYTES:
                raise ValueError(f"key {kid!r} is {len(key)} bytes; AES-256 takes {KEY_BYTES}")
            keys[kid] = key
        return cls(keys, current)

    def seal(self, plain: bytes) -> str:
        kid = self.current
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[kid].encrypt(nonce, plain, kid.encode())
        return f"{SEALED}{kid}.{base64.b64encode(nonce + sealed).decode()}"

    def open(self, stored: str) -> bytes:
        """The clear bytes of a sealed body.

        Raises:
            MessageUnreadable: the key it names is not configured, or the ciphertext does not open.
        """
        kid, _, encoded = stored[1:].partition(".")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise MessageUnreadable(_missing(kid))
        try:
            raw = base64.b64decode(encoded)
            return cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], kid.encode())
        except (InvalidTag, binascii.Error, ValueError):  # another key's ciphertext, or one cut short
            raise MessageUnreadable(
                f"A message body sealed with key {kid!r} does not open with the key of that id: the key was "
                f"changed rather than rotated (rotate by adding a key with a new id to {VARIABLE}), or the "
                "stored body is damaged."
            ) from None


_keyring: Keyring | None = None


def use(keyring: Keyring | None) -> None:
    """Make `keyring` this process's (None: no key; sealed bodies then cannot be read, nor new ones made)."""
    global _keyring
    _keyring = keyring


def keyring() -> Keyring | None:
    return _keyring


def from_environment() -> Keyring | None:
    """The keyring of CHARON_ENCRYPTION__KEYS in this process's environment (a Spark executor's, which only
    opens: which key encrypts does not matter there), or None."""
    text = os.environ.get(VARIABLE)
    return Keyring.parse(text) if text else None


def require_key(name: str) -> None:
    """Raises InvalidInput (400) naming reserved key `name` when the service has no key to seal with."""
    if _keyring is None:
        raise InvalidInput(
            f"{name} needs an encryption key, and this service has none: its operator sets {VARIABLE} "
            "(docs/encryption.md)."
        )


_SEALED_BYTES = SEALED.encode()


def is_sealed(stored: str | bytes) -> bool:
    return stored[:1] in (SEALED, _SEALED_BYTES)


def stored_body(body: Any, *, seal: bool) -> bytes:
    """What a driver stores for `body` (UTF-8): its JSON text, or with `seal`, that text sealed by the
    current key.

    Raises:
        EncryptionUnavailable: `seal` without a configured key (removed after the queue asked for it).
    """
    text = orjson.dumps(body)
    if not seal:
        return text
    if _keyring is None:
        raise EncryptionUnavailable(
            f"This queue encrypts its messages (_enable_encrypt_messages), and this service has no key to "
            f"encrypt with; nothing was stored. Its operator sets {VARIABLE} again."
        )
    return _keyring.seal(text).encode()


def body_of(stored: str | bytes) -> Any:
    """The body a driver stored: parsed, opened first when sealed.

    Raises:
        MessageUnreadable: sealed, and this process has not the key that sealed it.
    """
    head = stored[:1]
    if head != SEALED and head != _SEALED_BYTES:  # is_sealed inlined: every read of every body passes here
        return orjson.loads(stored)
    return orjson.loads(open_text(stored if isinstance(stored, str) else stored.decode()))


def open_text(stored: str) -> bytes:
    """The clear JSON text of a sealed body (body_of before its parse)."""
    if _keyring is None:
        raise MessageUnreadable(_missing(key_id(stored)))
    return _keyring.open(stored)


def key_id(stored: str | bytes) -> str:
    """The id of the key a sealed body names."""
    text = stored if isinstance(stored, str) else stored.decode()
    return text[1:].partition(".")[0]


def _missing(kid: str) -> str:
    return (
        f"A message body is encrypted with key {kid!r}, which this process does not have: keep every key "
        f"that sealed a stored message in {VARIABLE} (rotate by adding one, never by removing one)."
    )

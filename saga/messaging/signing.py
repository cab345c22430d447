"""Message signing: HMAC-SHA256 over the exact bytes sent, with rotating keys.

A key ring lists ``key_id: secret`` pairs, newest first. The relay signs every
message with the newest key; consumers verify with whichever listed key the
signature names, before the body is decoded. Retiring a key means removing it
from the ring: messages signed with it are then rejected. With
``require=True`` an unsigned message is rejected too.

The signature travels in the message headers: ``signature_key`` (the key id)
and ``signature`` (hex digest).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from saga.db.sql import validate_name
from saga.errors import ConfigurationError, SignatureRejected

KEY_HEADER = "signature_key"
SIGNATURE_HEADER = "signature"


@dataclass(frozen=True)
class KeyRing:
    """Signing keys, newest first; ``require`` rejects unsigned messages."""

    keys: tuple[tuple[str, bytes], ...] = ()
    require: bool = False
    _by_id: dict[str, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id: dict[str, bytes] = {}
        for key_id, secret in self.keys:
            validate_name(key_id, "signing key id")
            if len(secret) < 16:
                raise ConfigurationError(f"signing key {key_id!r} is shorter than 16 bytes")
            if key_id in by_id:
                raise ConfigurationError(f"signing key id {key_id!r} is listed twice")
            by_id[key_id] = secret
        if self.require and not by_id:
            raise ConfigurationError("signatures are required but no signing key is configured")
        object.__setattr__(self, "_by_id", by_id)

    def __repr__(self) -> str:
        return f"KeyRing(key_ids={[k for k, _ in self.keys]}, require={self.require})"

    @classmethod
    def parse(cls, spec: str | None, *, require: bool = False) -> KeyRing:
        """``"k2:secret-two,k1:secret-one"`` (newest first) as a key ring."""
        pairs = []
        for item in (spec or "").split(","):
            if not item.strip():
                continue
            key_id, sep, secret = item.strip().partition(":")
            if not sep or not secret:
                raise ConfigurationError(
                    "signing keys look like 'key_id:secret,older_id:older_secret'"
                )
            pairs.append((key_id, secret.encode()))
        return cls(tuple(pairs), require=require)

    def sign(self, body: bytes) -> dict[str, str]:
        """Headers that sign ``body`` with the newest key (none when the ring is empty)."""
        if not self.keys:
            return {}
        key_id, secret = self.keys[0]
        return {KEY_HEADER: key_id, SIGNATURE_HEADER: _digest(secret, body)}

    def verify(self, body: bytes, headers: Mapping[str, Any] | None) -> None:
        """Raise :class:`SignatureRejected` unless ``body`` carries a valid signature.

        Unsigned messages pass only when signatures are not required.
        """
        headers = headers or {}
        key_id, signature = headers.get(KEY_HEADER), headers.get(SIGNATURE_HEADER)
        if key_id is None and signature is None:
            if self.require:
                raise SignatureRejected("MissingSignature", "the message is not signed")
            return
        secret = self._by_id.get(str(key_id))
        if secret is None:
            raise SignatureRejected(
                "UnknownSigningKey",
                f"signed with key {key_id!r}, which is not (or no longer) trusted",
            )
        # As bytes: compare_digest raises TypeError on a str holding non-ASCII characters.
        given = str(signature).encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(_digest(secret, body).encode(), given):
            raise SignatureRejected("BadSignature", f"signature by key {key_id!r} does not match")


def _digest(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()

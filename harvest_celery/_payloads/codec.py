"""Payload codecs: applied to every payload-bearing field on write, undone on read.

A codec turns a JSON value into a JSON envelope ``{"_harvest_codec": <codec id>, ...}`` and back.
``FernetCodec`` encrypts (``cryptography``'s Fernet: AES-128-CBC + HMAC-SHA256) with key rotation:
the envelope names the key id that encrypted it, new writes use the primary key, old keys still
decrypt. Nothing secret is ever logged; keys never leave the process.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from harvest_celery._errors import PayloadCodecError

CODEC_KEY = "_harvest_codec"


class Codec(Protocol):
    codec_id: str

    def encode(self, value: Any) -> dict[str, Any]: ...

    def decode(self, envelope: dict[str, Any]) -> Any: ...


def is_encoded(value: Any) -> bool:
    return isinstance(value, dict) and CODEC_KEY in value


class FernetCodec:
    """Encryption at rest. ``keys`` maps key id → Fernet key (``Fernet.generate_key()``);
    ``primary`` is the id new writes use. Rotate by adding a key and making it primary; remove an
    old key only after every payload it encrypted was rewritten or erased."""

    codec_id = "fernet"

    def __init__(self, keys: dict[str, str | bytes], primary: str) -> None:
        from cryptography.fernet import Fernet

        if primary not in keys:
            raise ValueError(f"primary key id {primary!r} is not among the keys")
        self._fernets = {kid: Fernet(key) for kid, key in keys.items()}
        self.primary = primary

    def encode(self, value: Any) -> dict[str, Any]:
        plain = json.dumps(value, separators=(",", ":")).encode()
        token = self._fernets[self.primary].encrypt(plain)
        return {CODEC_KEY: self.codec_id, "kid": self.primary, "ct": token.decode()}

    def decode(self, envelope: dict[str, Any]) -> Any:
        from cryptography.fernet import InvalidToken

        kid = str(envelope.get("kid", ""))
        fernet = self._fernets.get(kid)
        if fernet is None:
            raise PayloadCodecError(
                f"payload was encrypted with key {kid!r}, which this codec does not hold "
                f"(it holds {sorted(self._fernets)}); restore the key to read it",
                codec=self.codec_id,
                key_id=kid,
            )
        try:
            return json.loads(fernet.decrypt(str(envelope.get("ct", "")).encode()))
        except InvalidToken:
            raise PayloadCodecError(
                f"payload encrypted with key {kid!r} failed authentication "
                "(wrong key material or tampered data)",
                codec=self.codec_id,
                key_id=kid,
            ) from None


class CodecChain:
    """Codecs by id: the first encodes; any of them decodes what it wrote."""

    def __init__(self, codecs: list[Any] | None = None) -> None:
        self.codecs = list(codecs or [])
        self._by_id = {c.codec_id: c for c in self.codecs}

    def __bool__(self) -> bool:
        return bool(self.codecs)

    def encode(self, value: Any) -> Any:
        return self.codecs[0].encode(value) if self.codecs else value

    def decode(self, value: Any) -> Any:
        if not is_encoded(value):
            return value
        codec_id = value[CODEC_KEY]
        codec = self._by_id.get(codec_id)
        if codec is None:
            raise PayloadCodecError(
                f"payload is encoded with codec {codec_id!r} (key {value.get('kid')!r}), but no such "
                "codec is configured: configure it to read this history",
                codec=str(codec_id),
                key_id=str(value.get("kid", "")),
            )
        return codec.decode(value)

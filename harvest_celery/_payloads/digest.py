"""The input digest: what a second start of the same execution id is compared with.

Computed at start on the canonical JSON of the input (keys sorted, compact, ASCII), before any
codec runs, and kept in its own column (``harvest_executions.input_digest``) beside the encoded
input. So the comparison holds whether the input is stored encrypted, offloaded, or erased: the
digest is not a payload and erasure leaves it. It is salted with the execution id, so two runs
with the same input do not share a digest (a digest says nothing across runs); within one run it
can only confirm a guess of the whole input, as any equality check must. Pure.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PREFIX = "sha256:"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def limit_digest(name: str, key: str | None) -> str:
    """The ``harvest_limits.key_digest`` of a limited dispatch: ``""`` without a key (the
    name's own row), else ``sha256:<hex>`` of the limit name and the key, so the limit row never
    holds the key (a payload) and one key digests differently under two limits."""
    if key is None:
        return ""
    h = hashlib.sha256()
    h.update(name.encode("utf-8"))
    h.update(b"\x00")
    h.update(key.encode("utf-8"))
    return PREFIX + h.hexdigest()


def input_digest(execution_id: str, value: Any) -> str:
    """``sha256:<hex>`` of the execution id and the canonical JSON of ``value``."""
    h = hashlib.sha256()
    h.update(execution_id.encode("utf-8"))
    h.update(b"\x00")
    h.update(canonical_json(value).encode("ascii"))
    return PREFIX + h.hexdigest()

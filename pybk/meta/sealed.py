"""Sealed JSON records: the envelope every pybk metadata record is written in.

A sealed record is a JSON object behind a small binary header, so that a reader can tell
at once whose bytes these are, which format version wrote them, and whether they were
damaged or cut short.  All integers big-endian::

    offset  size  field
    0       4     magic: four bytes naming the kind of record (b"PBKL": a ledger)
    4       2     format version, unsigned
    6       4     body length n, unsigned
    10      4     CRC-32C of the body, unsigned
    14      n     body: one JSON object in UTF-8, keys sorted, no whitespace

:func:`unseal` raises :class:`~pybk.errors.MalformedMetadata` for anything else: another
magic, an unknown version (a newer writer adds a version rather than a key), a length or
checksum mismatch, a body that is not an object with exactly the expected keys.  The
helpers :func:`typed`, :func:`b64` and :func:`unb64` check and convert the values.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any, Mapping

from pybk.checksum import crc32c
from pybk.errors import MalformedMetadata

HEADER = struct.Struct(">4sHII")
assert HEADER.size == 14, "a sealed record's header is documented as 14 bytes"


def seal(magic: bytes, version: int, body: dict[str, Any]) -> bytes:
    """The sealed form of ``body`` (a JSON-serializable object)."""
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(magic, version, len(data), crc32c(data)) + data


def unseal(data: bytes, magic: bytes, version: int, keys: frozenset[str],
           what: str) -> dict[str, Any]:
    """The body of a sealed record: an object with exactly ``keys``.

    ``what`` names the record in errors ("ledger metadata").  Raises MalformedMetadata.
    """
    return unseal_versions(data, magic, {version: keys}, what)[1]


def unseal_versions(data: bytes, magic: bytes, keys: Mapping[int, frozenset[str]],
                    what: str) -> tuple[int, dict[str, Any]]:
    """The format version and body of a sealed record in one of the versions ``keys``
    names, whose body has exactly that version's keys.  Raises MalformedMetadata."""
    data = bytes(data)
    if len(data) < HEADER.size:
        raise MalformedMetadata(f"{what} of {len(data)} bytes is shorter than its "
                                f"{HEADER.size}-byte header")
    found_magic, found_version, length, checksum = HEADER.unpack_from(data)
    if found_magic != magic:
        raise MalformedMetadata(f"{what} starts with {found_magic!r}, not {magic!r}: these "
                                f"bytes are not pybk {what}")
    if found_version not in keys:
        known = " and ".join(str(v) for v in sorted(keys))
        raise MalformedMetadata(f"{what} in format version {found_version}; this pybk reads "
                                f"version {known} only (upgrade pybk)")
    body = data[HEADER.size:]
    if len(body) != length:
        raise MalformedMetadata(f"{what} body is {len(body)} bytes, its header says "
                                f"{length}: the record is truncated or padded")
    if crc32c(body) != checksum:
        raise MalformedMetadata(f"{what} fails its CRC-32C: the bytes were damaged after "
                                "they were written")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise MalformedMetadata(f"{what} body is malformed: not JSON ({e})") from e
    wanted = keys[found_version]
    if not isinstance(obj, dict) or obj.keys() != wanted:
        raise MalformedMetadata(f"{what} body is malformed: it must be an object with "
                                f"exactly the keys {sorted(wanted)}")
    return found_version, obj


def typed(name: str, value: Any, kind: type, nullable: bool = False) -> Any:
    """``value`` if it is a ``kind`` (bool is no int here), or None when ``nullable``;
    else ValueError naming ``name``."""
    if value is None and nullable:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name} is {value!r}, not a {kind.__name__}"
                         + (" or null" if nullable else ""))
    return value


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)

"""Entry digests: end-to-end integrity between the writer and every reader.

The bookie stores an entry as the client sent it; the client computes a digest when it
writes and checks it when it reads, so corruption anywhere in between (wire, disk,
bookie) is caught.  The entry format is BookKeeper's, big-endian::

    0   8  ledger id
    8   8  entry id
    16  8  last add confirmed (LAC) of the writer when it sent the entry (-1: none)
    24  8  length: bytes of the ledger up to and including this entry's payload
    32  D  digest of bytes 0..31 followed by the payload
    32+D   payload

The first 24 bytes are what the bookie reads (:mod:`pybk.storage.entries`).  Digest
types and their size D:

=======  ==  ===========================================================================
type     D   digest
=======  ==  ===========================================================================
CRC32    8   zlib CRC-32, as an unsigned 64-bit integer (BookKeeper's CRC32 layout)
CRC32C   4   CRC-32C (Castagnoli)
MAC      20  HMAC-SHA1 keyed with SHA-1(prefix + password): the prefix is b"mac"
             (BookKeeper's MAC key), or b"ledger" for ledgers of metadata format 1
             (:attr:`pybk.meta.ledger_metadata.LedgerMetadata.mac_key_prefix`)
DUMMY    0   none: the header and length are still checked
=======  ==  ===========================================================================
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from typing import NamedTuple

from pybk.checksum import crc32c
from pybk.errors import DigestMismatch
from pybk.meta.ledger_metadata import DigestType

HEADER = struct.Struct(">QQqq")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 32, "an entry's header is documented as 32 bytes before its digest"
_CRC32 = struct.Struct(">Q")
_CRC32C = struct.Struct(">I")
#: The most bytes any digest type adds to a payload (the header and an HMAC-SHA1).
MAX_OVERHEAD = HEADER_SIZE + 20


class DecodedEntry(NamedTuple):
    """An entry as a reader sees it after verification."""

    entry_id: int
    last_add_confirmed: int
    length: int
    data: bytes


class DigestManager:
    """Encodes and verifies the entries of one ledger."""

    def __init__(self, ledger_id: int, digest_type: DigestType, password: bytes,
                 mac_key_prefix: str = "mac") -> None:
        self.ledger_id = ledger_id
        self.digest_type = digest_type
        if digest_type is DigestType.CRC32:
            self._size, self._digest = 8, _crc32_digest
        elif digest_type is DigestType.CRC32C:
            self._size, self._digest = 4, _crc32c_digest
        elif digest_type is DigestType.MAC:
            # Not the master key, SHA-1(b"ledger" + password), which every bookie is given:
            # a bookie must not be able to forge a MAC.
            key = hashlib.sha1(mac_key_prefix.encode("ascii") + password).digest()
            self._size = 20
            self._digest = lambda header, payload: _mac_digest(key, header, payload)
        elif digest_type is DigestType.DUMMY:
            self._size, self._digest = 0, lambda header, payload: b""
        else:
            raise ValueError(f"unknown digest type {digest_type!r}")

    @property
    def overhead(self) -> int:
        """Bytes an entry carries besides its payload."""
        return HEADER_SIZE + self._size

    def encode(self, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        """The entry bytes to send to bookies (``length`` includes this payload)."""
        header = HEADER.pack(self.ledger_id, entry_id, lac, length)
        return b"".join((header, self._digest(header, payload), payload))

    def decode(self, entry_id: int, data: bytes) -> DecodedEntry:
        """Verify an entry read for ``entry_id``; raise DigestMismatch if anything is off."""
        if len(data) < self.overhead:
            raise DigestMismatch(f"ledger {self.ledger_id} entry {entry_id}: {len(data)} bytes "
                                 f"is shorter than the {self.overhead}-byte header")
        ledger_id, stored_entry, lac, length = HEADER.unpack_from(data)
        if (ledger_id, stored_entry) != (self.ledger_id, entry_id):
            raise DigestMismatch(f"asked for ledger {self.ledger_id} entry {entry_id}, got "
                                 f"ledger {ledger_id} entry {stored_entry}")
        payload = data[self.overhead:]
        digest = data[HEADER_SIZE:self.overhead]
        if not hmac.compare_digest(digest, self._digest(data[:HEADER_SIZE], payload)):
            raise DigestMismatch(f"ledger {self.ledger_id} entry {entry_id}: digest mismatch "
                                 f"({self.digest_type.name})")
        return DecodedEntry(entry_id, lac, length, payload)


def _crc32_digest(header: bytes, payload: bytes) -> bytes:
    return _CRC32.pack(zlib.crc32(payload, zlib.crc32(header)))


def _crc32c_digest(header: bytes, payload: bytes) -> bytes:
    return _CRC32C.pack(crc32c(payload, crc32c(header)))


def _mac_digest(key: bytes, header: bytes, payload: bytes) -> bytes:
    mac = hmac.new(key, header, hashlib.sha1)
    mac.update(payload)
    return mac.digest()

"""What the bookie reads from an entry's bytes.

As in BookKeeper, an entry starts with a 24-byte header written by the client, big-endian:
ledger id (8), entry id (8), the writer's last-add-confirmed (8, signed; -1 for none).
The rest (digest, payload) is the client's business: the bookie stores the bytes as they
came and reads back the same bytes.  It checks that the ids match the request and keeps
the highest LAC it has seen per ledger, which is what "read LAC" answers.
"""

from __future__ import annotations

import struct

ENTRY_HEADER = struct.Struct(">QQq")
ENTRY_HEADER_SIZE = ENTRY_HEADER.size
assert ENTRY_HEADER_SIZE == 24, "an entry's header is documented as 24 bytes"

#: Entry id meaning "the last entry this bookie holds for the ledger" (BookKeeper: -1).
LAST_ENTRY = -1


def make_entry(ledger_id: int, entry_id: int, lac: int, body: bytes) -> bytes:
    """An entry as the bookie expects it: the header, then ``body``."""
    return ENTRY_HEADER.pack(ledger_id, entry_id, lac) + body


def parse_header(entry: bytes) -> tuple[int, int, int]:
    """``(ledger id, entry id, LAC)`` of an entry."""
    return ENTRY_HEADER.unpack_from(entry)

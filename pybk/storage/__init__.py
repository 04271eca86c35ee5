"""pybk's storage engine: one bookie's journal, entry logs, LMDB index and housekeeping.

Start with :class:`Bookie` (and :func:`format_bookie` for a new one).

May import: the base modules only.
"""

from pybk.storage.bookie import Bookie, format_bookie
from pybk.storage.entries import LAST_ENTRY, make_entry, parse_header

__all__ = ["Bookie", "format_bookie", "LAST_ENTRY", "make_entry", "parse_header"]

"""``pybk simpletest``: write a ledger on a cluster, read it back, report the rates.

Like BookKeeper's ``bookkeeper shell simpletest``: a client connects to the cluster,
creates a ledger (E, Qw, Qa as asked), adds ``entries`` entries of ``entry_bytes`` each
with up to :data:`PIPELINE` in flight, closes the ledger, reads every entry back through
a new handle (catch-up reads: ``read_entries`` asks for many entries per request, with
several requests in flight) and compares it byte for byte, then deletes the ledger.  Any failure
raises; a :class:`SimpleTestReport` tells what was done and how fast.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from pybk.errors import BookKeeperError
from pybk.net.connect import connect
from pybk.settings import ClientSettings

if TYPE_CHECKING:
    from pybk.meta.zookeeper import ZooKeeperSettings
    from pybk.storage import Bookie

#: Most adds in flight at once.
PIPELINE = 256
PASSWORD = b"pybk-simpletest"


@dataclass(frozen=True)
class SimpleTestReport:
    ledger_id: int
    ensemble: tuple[str, ...]
    entries: int
    entry_bytes: int
    write_s: float
    read_s: float

    def __str__(self) -> str:
        size = self.entries * self.entry_bytes / (1024 * 1024)
        return (f"ledger {self.ledger_id} on {', '.join(self.ensemble)}: wrote "
                f"{self.entries} entries of {self.entry_bytes} bytes in {self.write_s:.2f} s "
                f"({_rate(self.entries, self.write_s)} entries/s, "
                f"{size / max(self.write_s, 1e-9):.1f} MiB/s); read them back in "
                f"{self.read_s:.2f} s ({_rate(self.entries, self.read_s)} entries/s); "
                "every entry matched")


def payload(entry_id: int, size: int) -> bytes:
    """The content of entry ``entry_id``: ``size`` bytes derived from the id."""
    seed = hashlib.sha256(b"%d" % entry_id).digest()
    return (seed * (size // len(seed) + 1))[:size]


def simple_test(address: str, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                entries: int = 1000, entry_bytes: int = 1024,
                settings: ClientSettings | None = None,
                local_bookies: Mapping[str, Bookie] | None = None,
                zk_settings: ZooKeeperSettings | None = None) -> SimpleTestReport:
    """Run the test against the cluster at ``address`` (see the module docstring).
    ``local_bookies``: bookies of this process, called directly and placed first in the
    ledger's ensemble (a bookie's own sanity test).  ``settings`` and ``zk_settings``
    carry the credentials (CURVE key pair, ZooKeeper digest) of a secured cluster."""
    with connect(address, settings, local_bookies=local_bookies,
                 zk_settings=zk_settings) as bk:
        lh = bk.create_ledger(ensemble, write_quorum, ack_quorum, password=PASSWORD)
        started = time.monotonic()
        in_flight: deque = deque()
        for entry_id in range(entries):
            if len(in_flight) >= PIPELINE:
                in_flight.popleft().result()
            in_flight.append(lh.add_entry_async(payload(entry_id, entry_bytes)))
        for future in in_flight:
            future.result()
        lh.close()
        write_s = time.monotonic() - started
        started = time.monotonic()
        reader = bk.open_ledger(lh.id, password=PASSWORD, recovery=False)
        if reader.metadata.last_entry_id != entries - 1:
            raise BookKeeperError(f"ledger {lh.id} closed at entry "
                                  f"{reader.metadata.last_entry_id}, not {entries - 1}")
        if entries:
            for entry in reader.read_entries(0, entries - 1):
                if entry.data != payload(entry.entry_id, entry_bytes):
                    raise BookKeeperError(f"ledger {lh.id} entry {entry.entry_id} reads back "
                                          "other bytes than were written")
        read_s = time.monotonic() - started
        bk.delete_ledger(lh.id)
        return SimpleTestReport(lh.id, tuple(lh.metadata.fragments[0].ensemble), entries,
                                entry_bytes, write_s, read_s)


def _rate(count: int, seconds: float) -> str:
    return f"{count / max(seconds, 1e-9):,.0f}"

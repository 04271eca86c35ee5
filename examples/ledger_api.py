"""The ledger API used directly: three bookies in this process, one replicated ledger.

Creates a ledger on an ensemble of 3 bookies with write quorum 2 and ack quorum 2,
writes entries (blocking and pipelined), closes it, then opens it as a reader with
recovery and reads everything back.

    python examples/ledger_api.py [DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile

import pybk
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.storage import Bookie, format_bookie


def start_bookie(directory: str) -> Bookie:
    settings = pybk.ServerSettings(journalDirectory=os.path.join(directory, "journal"),
                                   ledgerDirectories=(os.path.join(directory, "ledgers"),))
    if not os.path.exists(directory):
        format_bookie(settings)  # a new bookie: write its cookies
    return Bookie(settings)


def main(directory: str) -> None:
    bookies = {f"B{i}": start_bookie(os.path.join(directory, f"bookie{i}"))
               for i in (1, 2, 3)}
    try:
        with EmbeddedMetadataStore(os.path.join(directory, "metadata")) as store, \
                pybk.BookKeeper.in_process(bookies, store) as bk:
            with bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2,
                                  digest="crc32c", password=b"secret") as ledger:
                first = ledger.add_entry(b"hello")         # returns once 2 bookies have it
                futures = [ledger.add_entry_async(b"entry %d" % i) for i in range(1, 100)]
                last = max(f.result() for f in futures)
                print(f"ledger {ledger.id}: wrote entries {first}..{last} on ensemble "
                      f"{list(ledger.metadata.fragments[0].ensemble)}")
            reader = bk.open_ledger(ledger.id, password=b"secret", recovery=True)
            entries = list(reader.read_entries(0, reader.last_add_confirmed))
            print(f"read back {len(entries)} entries; entry 0 is {entries[0].data!r}, "
                  f"entry {entries[-1].entry_id} is {entries[-1].data!r}")
            print(f"ledgers in the metadata store: {bk.list_ledgers()}")
    finally:
        for bookie in bookies.values():
            bookie.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="pybk-ledgers-"))

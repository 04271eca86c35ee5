"""A deferred-sync WAL owner that stops between a sync and the next one:
``wal_deferred_child.py DIR ACKS SYNCED UNSYNCED``.

Opens the WAL in DIR with ``deferredSync=True``, appends SYNCED records and syncs, then
appends UNSYNCED more (each append returns once its record is written to the journal,
not synced) and waits to be killed.  ACKS gets a line ``<position> 0 <thread> <index>``
per record once its append returned (``tests/walutil.py``'s records and format): thread
0 for the synced records, written after the sync; thread 1 for the unsynced ones.
No sync is asked for those, and the checkpoint (which syncs the journal too) is an hour
away.
"""

from __future__ import annotations

import os
import sys
import time

from walutil import record

import pybk


def main(directory: str, acks_path: str, synced: int, unsynced: int) -> None:
    acks = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    wal = pybk.open(directory, deferredSync=True, flushInterval=3_600_000)

    def acked(positions: list, thread: int, first: int) -> None:
        os.write(acks, b"".join(b"%s 0 %d %d\n" % (str(p).encode(), thread, first + i)
                                for i, p in enumerate(positions)))

    positions = [wal.append(record(0, 0, i)) for i in range(synced)]
    wal.sync()
    acked(positions, 0, 0)
    acked([wal.append(record(0, 1, i)) for i in range(synced, synced + unsynced)], 1, synced)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

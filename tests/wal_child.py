"""A WAL writer to be killed: ``wal_child.py DIR ACKS ROUND THREADS [truncate] [sync=N]``.

Opens the WAL in DIR and appends records from THREADS threads until killed: thread 0
pipelines ``append_async`` (up to 64 in flight), the others call ``append``.  Each
acknowledged record gets a line ``<position> <round> <thread> <index>`` in ACKS, written
with O_APPEND after the acknowledgement (no fsync: SIGKILL keeps the page cache).

With ``truncate``, small entry logs, and one more thread that every 0.2 s truncates
the WAL before the record thread 0 had acknowledged 0.2 s earlier and asks the bookie
for garbage collection and a major compaction: whole segments and entry logs go while
the records after them are being written.

With ``sync=N`` (N from 1 to 64, the pipeline's window) the WAL is opened with
``deferredSync=True`` and a record counts as acknowledged only once a ``wal.sync()``
after it returned: each thread syncs after every N of its appends, then writes the
lines of the records that sync covered.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

from walutil import record

import pybk


def main(directory: str, acks_path: str, round_no: int, threads: int,
         truncating: bool, sync_every: int) -> None:
    acks = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    extra = dict(logSizeLimit=512 * 1024, maxEntrySizeBytes=128 * 1024,
                 batchMaxBytes=64 * 1024, recordMaxBytes=32 * 1024,
                 gcWaitTime=100) if truncating else {}
    wal = pybk.open(directory, flushInterval=200, journalMaxSizeMB=1,
                    segmentMaxBytes=256 * 1024, deferredSync=sync_every > 0, **extra)
    newest: list = []  # thread 0's last acknowledged position

    def acked(position, thread: int, index: int) -> None:
        os.write(acks, b"%s %d %d %d\n" % (str(position).encode(), round_no, thread, index))

    def blocking(thread: int) -> None:
        unsynced = []
        index = 0
        while True:
            unsynced.append((wal.append(record(round_no, thread, index)), index))
            index += 1
            if len(unsynced) >= sync_every:
                if sync_every:
                    wal.sync()
                for position, done_index in unsynced:
                    acked(position, thread, done_index)
                unsynced.clear()

    def pipelined() -> None:
        in_flight: collections.deque = collections.deque()
        index = 0
        while True:
            in_flight.append((index, wal.append_async(record(round_no, 0, index))))
            index += 1
            if sync_every and index % sync_every == 0:
                wal.sync()  # every append made so far is durable: all of them count
                while in_flight:
                    done_index, future = in_flight.popleft()
                    acked(future.result(), 0, done_index)
            if len(in_flight) >= 64:
                done_index, future = in_flight.popleft()
                position = future.result()
                acked(position, 0, done_index)
                newest[:] = [position]

    def truncator() -> None:
        while True:
            before = list(newest)
            time.sleep(0.2)
            if before:
                wal.truncate(before[0])
                wal.bookie.request_gc()

    workers = [threading.Thread(target=pipelined, daemon=True)] + [
        threading.Thread(target=blocking, args=(t,), daemon=True) for t in range(1, threads)]
    if truncating:
        workers.append(threading.Thread(target=truncator, daemon=True))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    options = sys.argv[5:]
    syncs = [int(option.split("=", 1)[1]) for option in options if option.startswith("sync=")]
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "truncate" in options,
         syncs[0] if syncs else 0)

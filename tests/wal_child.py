"""A WAL writer to be killed: ``wal_child.py DIR ACKS ROUND THREADS [truncate]``.

Opens the WAL in DIR and appends records from THREADS threads until killed: thread 0
pipelines ``append_async`` (up to 64 in flight), the others call ``append``.  Each
acknowledged record gets a line ``<position> <round> <thread> <index>`` in ACKS, written
with O_APPEND after the acknowledgement (no fsync: SIGKILL keeps the page cache).

With ``truncate``, small entry logs, and one more thread that every 0.2 s truncates
the WAL before the record thread 0 had acknowledged 0.2 s earlier and asks the bookie
for garbage collection and a major compaction: whole segments and entry logs go while
the records after them are being written.
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
         truncating: bool) -> None:
    acks = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    extra = dict(logSizeLimit=512 * 1024, maxEntrySizeBytes=128 * 1024,
                 batchMaxBytes=64 * 1024, recordMaxBytes=32 * 1024,
                 gcWaitTime=100) if truncating else {}
    wal = pybk.open(directory, flushInterval=200, journalMaxSizeMB=1,
                    segmentMaxBytes=256 * 1024, **extra)
    newest: list = []  # thread 0's last acknowledged position

    def acked(position, thread: int, index: int) -> None:
        os.write(acks, b"%s %d %d %d\n" % (str(position).encode(), round_no, thread, index))

    def blocking(thread: int) -> None:
        index = 0
        while True:
            acked(wal.append(record(round_no, thread, index)), thread, index)
            index += 1

    def pipelined() -> None:
        in_flight: collections.deque = collections.deque()
        index = 0
        while True:
            in_flight.append((index, wal.append_async(record(round_no, 0, index))))
            index += 1
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
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
         sys.argv[5:] == ["truncate"])

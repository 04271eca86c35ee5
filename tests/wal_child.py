"""A WAL writer to be killed: ``wal_child.py DIR ACKS ROUND THREADS``.

Opens the WAL in DIR and appends records from THREADS threads until killed: thread 0
pipelines ``append_async`` (up to 64 in flight), the others call ``append``.  Each
acknowledged record gets a line ``<position> <round> <thread> <index>`` in ACKS, written
with O_APPEND after the acknowledgement (no fsync: SIGKILL keeps the page cache).
"""

from __future__ import annotations

import collections
import os
import sys
import threading

from walutil import record

import pybk


def main(directory: str, acks_path: str, round_no: int, threads: int) -> None:
    acks = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    wal = pybk.open(directory, flushInterval=200, journalMaxSizeMB=1,
                    segmentMaxBytes=256 * 1024)

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
                acked(future.result(), 0, done_index)

    workers = [threading.Thread(target=pipelined, daemon=True)] + [
        threading.Thread(target=blocking, args=(t,), daemon=True) for t in range(1, threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

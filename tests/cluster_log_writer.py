"""A log writer on a cluster, there to be killed (run by tests/test_recovery_replaces.py).

    python tests/cluster_log_writer.py --zk ADDRESS --log NAME --acks FILE

Connects to the cluster, opens log NAME as its writer (E=3, Qw=2, Qa=2, up to 64
batches in flight), writes ``ledger <id>`` (its segment's ledger) to the acks file, then
appends ``clusterutil.payload(n)`` records for n = 0, 1, 2, ... with up to 256 in flight
until killed, appending ``<position> <n>`` to the acks file as each is acknowledged
(O_APPEND, no fsync: a SIGKILL keeps the page cache).  Any error exits with status 2 and
a traceback.
"""

from __future__ import annotations

import argparse
import os
import threading
import traceback
from concurrent.futures import Future

from clusterutil import payload, run_child

import pybk
from pybk.log import LogWriter
from pybk.settings import ClientSettings, LogSettings

RECORDS_IN_FLIGHT = 256
SETTINGS = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2,
                       maxOutstandingBatches=64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--acks", required=True)
    args = parser.parse_args()
    fd = os.open(args.acks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    bk = pybk.connect(args.zk, ClientSettings(addEntryTimeout=2.0, readTimeout=1.0))
    writer = LogWriter.open(bk, args.log, SETTINGS)
    os.write(fd, b"ledger %d\n" % writer.metadata.tail[-1].ledger_id)
    slots = threading.Semaphore(RECORDS_IN_FLIGHT)
    failed = threading.Event()

    def report(number: int, future: Future) -> None:
        error = future.exception()
        if error is not None:
            traceback.print_exception(error)
            failed.set()
        else:
            os.write(fd, b"%s %d\n" % (str(future.result()).encode(), number))
        slots.release()

    number = 0
    while not failed.is_set():
        if not slots.acquire(timeout=0.1):
            continue
        future = writer.append_async(payload(number))
        future.add_done_callback(lambda done, n=number: report(n, done))
        number += 1
    os._exit(2)


if __name__ == "__main__":
    run_child(main)

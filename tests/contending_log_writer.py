"""One of several log writers contending for one log (run by tests/test_partitions.py).

    python tests/contending_log_writer.py --zk ADDRESS --log NAME --name WRITER --acks FILE
        [--seed N]

Opens log NAME as its writer (E=3, Qw=2, Qa=2) and appends records ``b"<WRITER> <n>"``
for n = 0, 1, 2, ... (never one n twice, whatever fails) with up to 64 in flight,
appending ``<position> <n>`` to the acks file as each is acknowledged (O_APPEND, no
fsync: a SIGKILL keeps the page cache).  When an append fails (``LogFenced`` once another
writer took the log over, or any other error), it closes its writer, waits 0.3 to 1.5 s
(drawn from ``random.Random(seed)``) and opens the log again, which fences the others;
a connection or an open that fails is tried again the same way.  Each such event is a
line on standard error.  It runs until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import threading
from concurrent.futures import Future

import zkutil
from clusterutil import run_child

import pybk
from pybk.log import LogWriter
from pybk.settings import ClientSettings, LogSettings

RECORDS_IN_FLIGHT = 64
SETTINGS = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2)
CLIENT = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, zmqHeartbeatIntervalMs=300,
                        zmqHeartbeatTimeoutMs=1_500)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--acks", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    fd = os.open(args.acks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while True:  # the nemesis may cut it off before it ever connected
        try:
            bk = pybk.connect(args.zk, CLIENT, zk_settings=zkutil.settings())
            break
        except Exception as e:  # noqa: BLE001 - cut off: try again
            print(f"{args.name}: connect failed: {e!r}", file=sys.stderr, flush=True)
            threading.Event().wait(rng.uniform(0.3, 1.5))
    number = 0
    while True:
        try:
            writer = LogWriter.open(bk, args.log, SETTINGS)
        except Exception as e:  # noqa: BLE001 - cut off: try again
            print(f"{args.name}: open failed: {e!r}", file=sys.stderr, flush=True)
            threading.Event().wait(rng.uniform(0.3, 1.5))
            continue
        print(f"{args.name}: writing", file=sys.stderr, flush=True)
        slots = threading.Semaphore(RECORDS_IN_FLIGHT)
        failed: list[BaseException] = []

        def report(n: int, future: Future, failed=failed, slots=slots) -> None:
            error = future.exception()
            if error is not None:
                failed.append(error)
            else:
                os.write(fd, b"%s %d\n" % (str(future.result()).encode(), n))
            slots.release()

        while not failed:
            if not slots.acquire(timeout=0.1):
                continue
            try:
                future = writer.append_async(b"%s %d" % (args.name.encode(), number))
            except Exception as e:  # noqa: BLE001 - a writer that already failed
                failed.append(e)
                slots.release()
                break
            future.add_done_callback(lambda done, n=number: report(n, done))
            number += 1
        print(f"{args.name}: append failed: {failed[0]!r}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            writer.close()
        threading.Event().wait(rng.uniform(0.3, 1.5))


if __name__ == "__main__":
    run_child(main)

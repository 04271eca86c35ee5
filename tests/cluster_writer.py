"""A ledger writer on a cluster, there to be killed (run by tests/test_cluster.py).

    python tests/cluster_writer.py --zk ADDRESS --acks FILE [--zk-timeout-ms MS]

Connects to the cluster, creates a ledger (E=3, Qw=2, Qa=2), writes ``ledger <id>`` to
the acks file, then adds ``clusterutil.payload`` entries with up to 64 in flight until
killed, appending ``<entry id>`` to the acks file as each is acknowledged (O_APPEND, no
fsync: a SIGKILL keeps the page cache).  Any error exits with status 2 and a traceback.
``--zk-timeout-ms`` is its ZooKeeper session timeout (with zkutil's test settings; pybk's
defaults without it).
"""

from __future__ import annotations

import argparse
import os
import threading
import traceback

import zkutil
from clusterutil import PASSWORD, Writer, run_child

import pybk
from pybk.settings import ClientSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--acks", required=True)
    parser.add_argument("--zk-timeout-ms", type=int, default=0)
    args = parser.parse_args()
    fd = os.open(args.acks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    bk = pybk.connect(args.zk, ClientSettings(addEntryTimeout=2.0, readTimeout=1.0),
                      zk_settings=zkutil.settings(zkTimeout=args.zk_timeout_ms)
                      if args.zk_timeout_ms else None)
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    os.write(fd, b"ledger %d\n" % lh.id)
    failed = threading.Event()

    def report(entry_id: int | None, error: BaseException | None) -> None:
        if error is not None:
            traceback.print_exception(error)
            failed.set()
        else:
            os.write(fd, b"%d\n" % entry_id)

    Writer(lh, on_done=report)
    failed.wait()
    os._exit(2)


if __name__ == "__main__":
    run_child(main)

"""The ledger client a Spark task (or the driver's planning) uses, built from the
source's options where it runs: nothing of it is pickled, and nothing of it (threads,
ZeroMQ contexts, ZooKeeper sessions) exists before Spark forks a worker.

For ``metadataServiceUri`` it is a cluster client (ZooKeeper, bookies over ZeroMQ, with
the credentials the options name, read from files where it runs) that
knows its host (``clientHost``, unless the options name one: :func:`executor_host`), so
that the ledgers a task writes start on its host's bookie when one is registered there
(:mod:`pybk.spark.bookies`).  For ``path``, a batch read reads the WAL directory
read-only, beside its application if that runs (:func:`pybk.log.readonly.readonly_client`:
no lock, nothing written; what it sees: :mod:`pybk.log.readonly`); the other uses open
the directory's own bookie and metadata store in the task's process
(:func:`pybk.log.wal.open_storage`), held until the task is done: the tasks of a job take
the directory in turns, each waiting up to ``lockTimeoutSeconds``, and the WAL's
application must not be running.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from pybk.client import BookKeeper
from pybk.spark.holder import executor_host
from pybk.spark.options import READ, STREAM_WRITE, WRITE, PybkOptions


@contextlib.contextmanager
def connect(opts: PybkOptions) -> Iterator[BookKeeper]:
    """A client of the log's cluster or WAL directory, closed on exit."""
    if opts.uri is not None:
        from pybk.net.connect import connect as connect_cluster
        settings = opts.client_settings()
        if not settings.clientHost:
            settings = dataclasses.replace(settings, clientHost=executor_host())
        with connect_cluster(opts.uri, settings, zk_settings=opts.zookeeper_settings()) as bk:
            yield bk
    elif opts.use == READ:  # beside the WAL's application, if it runs
        from pybk.log.readonly import readonly_client
        assert opts.path is not None  # parse(): a cluster's address or a WAL's path
        with readonly_client(opts.path, **opts.client) as bk:
            yield bk
    else:
        from pybk.log.wal import open_storage
        assert opts.path is not None
        with open_storage(opts.path, create=opts.use in (WRITE, STREAM_WRITE),
                          lock_timeout=opts.get("lockTimeoutSeconds"), **opts.client) as bk:
            yield bk

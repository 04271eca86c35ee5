"""A bookie as a member of a cluster.

:class:`~pybk.cluster.node.BookieNode` serves a bookie over ZeroMQ and keeps it
registered (with its endpoint) in ZooKeeper, following its disk state and its session,
with autorecovery, metrics and the HTTP admin API beside it;
:mod:`~pybk.cluster.cookies` checks the directories' cookie against the cluster's copy;
:mod:`~pybk.cluster.admission` guards a bookie against stale writers of ledgers it does
not know; :mod:`~pybk.cluster.lifeline` and :mod:`~pybk.cluster.child` run bookies in
child processes that die with their parent.

May import: the base modules, :mod:`pybk.storage`, :mod:`pybk.meta`, :mod:`pybk.client`,
:mod:`pybk.net`, :mod:`pybk.autorecovery`, :mod:`pybk.admin`, :mod:`pybk.http`.
"""

from typing import Any

from pybk._moved import moved_attribute


def __getattr__(name: str) -> Any:
    # Before pybk.net existed these were pybk.cluster's: kept for one release.
    return moved_attribute(__name__, name, {"BookieServer": "pybk.net",
                                            "ClientLoop": "pybk.net",
                                            "ZmqBookieClient": "pybk.net"})

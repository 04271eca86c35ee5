"""A ledger client of a cluster: metadata on ZooKeeper, bookies over ZeroMQ.

:func:`connect` (also :func:`pybk.connect`) opens a session on the cluster's
ZooKeeper, one :class:`~pybk.net.client.ClientLoop` and a
:class:`~pybk.net.directory.BookieDirectory`, and returns a
:class:`~pybk.client.BookKeeper` over them whose :meth:`~ClusterBookKeeper.close` closes
all three.  New ensembles are chosen among the registry's writable bookies, read when
a ledger is created or its ensemble changes; a ledger's bookies are looked up in the
registry then too, and when it is opened
(:meth:`ClusterBookKeeper.resolve_bookies`), so ZooKeeper is not on the data path.

A process that hosts bookies (an embedded WAL promoted to a cluster member, an
application serving a :class:`~pybk.cluster.node.BookieNode`) passes them as
``local_bookies``: the client writes to them in-process
(:class:`~pybk.client.transport.InProcessBookieClient`: no serialization, no socket), and
to the others over ZeroMQ.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterable, Mapping

from pybk.client.bookkeeper import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import InvalidConfiguration
from pybk.meta.interface import MetadataStore
from pybk.meta.zkaddress import is_zookeeper_address
from pybk.meta.zookeeper import ZooKeeperMetadataStore, ZooKeeperSettings
from pybk.net.client import ClientLoop
from pybk.net.curve import load_key_pair
from pybk.net.directory import BookieDirectory
from pybk.settings import ClientSettings
from pybk.storage import Bookie

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class ClusterBookKeeper(BookKeeper):
    """A :class:`~pybk.client.BookKeeper` that owns its metadata store, ZeroMQ loop and
    bookie directory (made by :func:`connect`; ``own_store=False``: a store its maker
    keeps, as autorecovery does)."""

    def __init__(self, store: MetadataStore, loop: ClientLoop,
                 directory: BookieDirectory, settings: ClientSettings,
                 local_bookie: str | None = None, own_store: bool = True,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        super().__init__(store, directory, settings, local_bookie=local_bookie,
                         metrics_registry=metrics_registry)
        self.directory = directory
        self._owned: tuple = (directory, loop, store) if own_store else (directory, loop)

    def resolve_bookies(self, bookie_ids: Iterable[str]) -> None:
        """Look up the endpoints of those of ``bookie_ids`` not known yet (or due a
        refresh) in the registry, on this thread (:meth:`BookieDirectory.resolve`)."""
        self.directory.resolve(bookie_ids)

    def close(self) -> None:
        """Stop the client's threads, then close the bookie clients, the ZeroMQ loop and
        the ZooKeeper session (open handles are not closed)."""
        super().close()
        for part in self._owned:
            part.close()


def connect(address: str, settings: ClientSettings | None = None, *,
            zk_settings: ZooKeeperSettings | None = None,
            local_bookie: str | None = None,
            local_bookies: Mapping[str, Bookie] | None = None,
            metrics_registry: CollectorRegistry | None = None,
            move_logs: bool = True) -> ClusterBookKeeper:
    """A client of the cluster whose metadata is at ``address``
    (``zk://host:port[,host:port...]/ledgers``).  Raises MetadataUnavailable if ZooKeeper
    does not answer within ``zkTimeout``, MetadataError if the cluster is not formatted,
    InvalidConfiguration for an address that is not ``zk://``.

    ``local_bookies`` are bookies of this process by id (they must also serve the
    cluster, e.g. through a BookieNode, for other clients to reach them): this client
    calls them directly.  ``local_bookie`` is the one placement puts first in new
    ensembles; by default the only one of ``local_bookies``, if there is one.  With
    ``metrics_registry`` the client reports its metrics there (:mod:`pybk.client.metrics`).
    ``move_logs`` False for a client that changes no log: a cluster of pybk's former
    layout is left as it is (:mod:`pybk.meta.migrate`).

    With ``zmqCurveEnabled`` the key file is read here, so that a missing or malformed
    one is an InvalidConfiguration naming ``zmqCurveSecretKeyFile`` at once, not an
    error of every request later."""
    if not is_zookeeper_address(address):
        raise InvalidConfiguration(f"cannot connect to {address!r}: a cluster's address is "
                                   "zk://host:port[,host:port...]/root (an embedded store "
                                   "serves one process: use BookKeeper.in_process)")
    settings = settings or ClientSettings()
    if settings.zmqCurveEnabled:
        load_key_pair(settings.zmqCurveSecretKeyFile)
    local = {bookie_id: InProcessBookieClient(bookie_id, bookie)
             for bookie_id, bookie in (local_bookies or {}).items()}
    if local_bookie is None and len(local) == 1:
        local_bookie = next(iter(local))
    with contextlib.ExitStack() as opened:
        store = opened.enter_context(ZooKeeperMetadataStore(address, zk_settings,
                                                            move_logs=move_logs))
        loop = opened.enter_context(ClientLoop())
        directory = BookieDirectory(store, loop, settings, local)
        opened.callback(directory.close)
        client = ClusterBookKeeper(store, loop, directory, settings, local_bookie,
                                   metrics_registry=metrics_registry)
        opened.pop_all()
        return client

"""pybk: Apache BookKeeper's replicated log storage, in Python.

``pybk.open(path)`` opens an embedded WAL; ``pybk.open_readonly(path)`` reads one from
another process while its application runs; ``pybk.demote(path)`` turns a promoted one
whose cluster is gone back into an embedded WAL; ``pybk.connect(address)`` is a ledger
client of a cluster (:func:`pybk.net.connect.connect`).  :mod:`pybk.aio` is the same for
asyncio code (``await pybk.aio.open(path)``), :mod:`pybk.spark` the PySpark data source.
Readers give records as ``(position, value)`` pairs (``read()``) or as :class:`Record`
values with their keys, timestamps and headers (``records()``).

The packages, lowest layer first: :mod:`pybk.storage` (the bookie storage engine),
:mod:`pybk.meta` (metadata stores), :mod:`pybk.client` (the ledger protocol),
:mod:`pybk.net` (ZeroMQ), :mod:`pybk.autorecovery`, :mod:`pybk.admin`, :mod:`pybk.http`,
:mod:`pybk.cluster` (a bookie node), :mod:`pybk.log` (logs and the embedded WAL),
:mod:`pybk.spark`, :mod:`pybk.aio`; above this module, :mod:`pybk.testing` and
:mod:`pybk.cli` (the ``pybk`` command).  No module imports a layer above its own
(docs/DESIGN.md, "Layers").
"""

from typing import Any

from pybk import _moved
from pybk.client import BookKeeper, WriteFlag
from pybk.errors import BookKeeperError
from pybk.log import WAL, LogReader, LogWriter, Position, Record
from pybk.log.readonly import ReadOnlyWAL, open_readonly
from pybk.log.wal import demote, open
from pybk.settings import ClientSettings, LogSettings, ServerSettings

__version__ = "0.1.0"

_moved.install()  # old import paths of moved modules, for one release


def connect(address: str, settings: ClientSettings | None = None,
            **options: Any) -> BookKeeper:
    """A :class:`BookKeeper` client of the cluster whose metadata is at ``address``
    (``zk://host:port[,host:port...]/ledgers``): bookies are found in its registry and
    reached over ZeroMQ; closing it closes the session and connections.  See
    :func:`pybk.net.connect.connect` for ``options`` and errors."""
    # ZeroMQ and kazoo are imported only when a cluster is wanted: `import pybk` stays light.
    from pybk.net.connect import connect as connect_cluster
    return connect_cluster(address, settings, **options)


def __getattr__(name: str) -> Any:
    # pybk.aio imports asyncio: loaded on first use, so that `import pybk` stays light.
    if name == "aio":
        import pybk.aio
        return pybk.aio
    raise AttributeError(f"module 'pybk' has no attribute {name!r}")


__all__ = ["BookKeeper", "BookKeeperError", "ClientSettings", "LogReader", "LogSettings",
           "LogWriter", "Position", "ReadOnlyWAL", "Record", "ServerSettings", "WAL",
           "WriteFlag", "__version__", "connect", "demote", "open", "open_readonly"]

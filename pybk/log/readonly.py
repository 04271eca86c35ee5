"""A WAL read from another process while its application runs: ``pybk.open_readonly(path)``.

The owner (the process that opened the WAL with :func:`pybk.open`) holds the directory's
locks; a :class:`ReadOnlyWAL` takes none of them.  It reads the owner's files as they are
written (:mod:`pybk.storage.readonly` for the bookie's journal, entry logs and index;
the metadata store as an LMDB reader: :mod:`pybk.meta.embedded`), writes nothing, and
the owner never waits for it.  It works the same when no owner runs.

What it sees, and how fresh:

* Every record the owner made durable, in position order, each once, with the bytes
  that were appended; never a record whose append did not return (while the owner
  runs), never other bytes.
* While the owner runs, a record shows up once the ledger's LAC covers it: when a later
  entry of the same segment is journaled (it carries the LAC), or, once the owner's
  appends go idle, when the owner journals its explicit LAC (``explicitLacInterval``,
  50 ms, checked on its client's 50 ms timer: 50 to 100 ms after the last append).  It
  is read from the journal at once (no checkpoint is waited for), plus the reader's
  poll interval.
* Once no owner runs (closed, or killed), also the records whose acknowledgement died
  with it: an open segment is read to the last entry stored, where the owner's next
  open will close it (:mod:`pybk.storage.readonly`, "The LAC"), and a segment the owner
  died rolling away from is left there for the next (``LogReader``'s ``writerless``).
* Beside a ``deferredSync`` owner: while it runs, the records up to its last
  :meth:`~pybk.log.wal.WAL.sync` that returned (the LAC it journals is the durable
  one); once it is gone, also those appended after it, which its next open recovers
  (:mod:`pybk.storage.readonly`, "Deferred sync").
* Truncation, garbage collection and compaction under the reader: a segment truncated
  away is skipped (the reader goes on at the truncation point, as
  :class:`~pybk.log.reader.LogReader` does); an entry moved by compaction is looked up
  again; a record is only ever served after its checksum and ids were checked.

A WAL promoted to a cluster member is not read this way (its log is the cluster's:
read it through the cluster); InvalidConfiguration says so.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

from pybk.client import BookKeeper
from pybk.client.transport import BookieClient, _completed, failed_future
from pybk.errors import DirectoryLocked, LogClosed, NoSuchLog
from pybk.log import timeindex, walinfo
from pybk.log.position import Position
from pybk.log.reader import LogReader
from pybk.log.record import PositionedValue, Record
from pybk.log.wal import LOG_NAME, _check_embedded, _open_here, _split_settings
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.storage.readonly import BookieReader


def open_readonly(path: str | os.PathLike[str], **settings: Any) -> "ReadOnlyWAL":
    """Open the WAL in directory ``path`` for reading only, whether or not its
    application has it open (see the module docstring).

    ``settings``: those of :class:`~pybk.settings.ClientSettings` by name (``readTimeout``,
    ...), and the bookie's and log's as :func:`pybk.open` takes them (which change
    nothing here but must be valid).  Raises NoSuchLog if ``path`` holds no WAL."""
    return ReadOnlyWAL(path, **settings)


class ReadOnlyWAL:
    """A WAL opened read-only.  Thread-safe; close it (or use ``with``)."""

    def __init__(self, path: str | os.PathLike[str], **settings: Any) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.log_name = LOG_NAME
        resources = ExitStack()
        try:
            self._bk, self._storage = _open_client(self.path, settings, resources)
        except BaseException:
            resources.close()
            raise
        self._resources = resources
        self._closed = False

    # -- reading ------------------------------------------------------------------------

    def read(self, start: Position | str | None = None) -> Iterator[PositionedValue]:
        """``(position, data)`` of every record from ``start`` (the first one when None)
        to the last one visible now (see the module docstring), in order."""
        return self.reader(start).read()

    def records(self, start: Position | str | None = None) -> Iterator[Record]:
        """What :meth:`read` gives, as :class:`~pybk.log.record.Record` values: with
        each record's key, timestamp and headers."""
        return self.reader(start).records()

    def reader(self, start: Position | str | None = None) -> LogReader:
        """A reader from ``start`` that can also tail the WAL (:meth:`LogReader.tail`)."""
        self._check_open()
        return LogReader(self._bk, self.log_name, start, writerless=self._writerless)

    def position_at(self, timestamp: int) -> Position:
        """The position of the first record visible whose timestamp is at least
        ``timestamp``, or the end if none is (:meth:`pybk.log.wal.WAL.position_at`)."""
        self._check_open()
        return timeindex.position_at(self._bk, self.log_name, timestamp)

    def _writerless(self) -> bool:
        return not self._storage.owner_running

    @property
    def first_position(self) -> Position | None:
        """The position of the first record visible, or None if there is none."""
        self._check_open()
        return walinfo.first_position(self._bk, self.log_name, writerless=self._writerless)

    @property
    def last_position(self) -> Position | None:
        """The position of the last record visible, or None if there is none."""
        self._check_open()
        return walinfo.last_position(self._bk, self.log_name)

    @property
    def space_used(self) -> int:
        """Bytes the WAL's directory takes on disk (:func:`walinfo.space_used_bytes`)."""
        return walinfo.space_used_bytes(self.path)

    def stats(self) -> walinfo.WALStats:
        """The WAL's figures as this handle sees them (:class:`walinfo.WALStats`)."""
        return walinfo.WALStats(self.first_position, self.last_position, self.space_used,
                                journal_records_read=self._storage.stats.journal_records,
                                owner_running=self._storage.owner_running)

    # -- life cycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Release everything; closing again does nothing.  Readers made by this handle
        raise LogClosed from then on."""
        if not self._closed:
            self._closed = True
            self._resources.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"the read-only WAL at {self.path} is closed")

    def __enter__(self) -> "ReadOnlyWAL":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def readonly_client(path: str | os.PathLike[str], **settings: Any) -> Iterator[BookKeeper]:
    """The ledger client of a :class:`ReadOnlyWAL` (for a job that reads the WAL's log
    with :mod:`pybk.log.ranges`, a Spark batch read), closed on exit."""
    with ExitStack() as resources:
        yield _open_client(os.path.abspath(os.fspath(path)), settings, resources)[0]


def _open_client(path: str, settings: dict[str, Any], resources: ExitStack
                 ) -> tuple[BookKeeper, BookieReader]:
    """A ledger client over the WAL directory ``path`` read-only, and the bookie reader
    under it, each pushed on ``resources`` to be closed."""
    if not os.path.isdir(os.path.join(path, "bookie")):
        raise NoSuchLog(f"{path} holds no pybk WAL")
    if _open_here(path):  # LMDB opens an environment once per process
        raise DirectoryLocked(f"{path} is open in this process: read it through that WAL "
                              "(wal.read(), wal.reader()); open_readonly is for other "
                              "processes")
    server, client, _log = _split_settings(path, settings)
    storage = resources.enter_context(BookieReader(server, sole_copy=True))
    store = resources.enter_context(EmbeddedMetadataStore(os.path.join(path, "metadata"),
                                                          read_only=True))
    _check_embedded(path, store)
    bookie_id = f"bookie-{storage.instance_id}"
    bk = resources.enter_context(BookKeeper(
        store, {bookie_id: _ReadOnlyBookieClient(bookie_id, storage)}, client))
    return bk, storage


class _ReadOnlyBookieClient(BookieClient):
    """The ledger client's way to a :class:`BookieReader`: reads answered at once,
    changes refused with BookieReadOnly."""

    def __init__(self, bookie_id: str, reader: BookieReader) -> None:
        self.bookie_id = bookie_id
        self._reader = reader

    def add(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
            recovery: bool = False, *, deferred: bool = False) -> Future:
        return failed_future(self._reader.refuse("add"))

    def force_ledger(self, ledger_id: int, first: int = 0, last: int = -1) -> Future:
        return failed_future(self._reader.refuse("force"))

    def read(self, ledger_id: int, entry_id: int, fence: bool = False,
             master_key: bytes = b"") -> Future:
        if fence:
            return failed_future(self._reader.refuse("fence"))
        return _completed(lambda: self._reader.read_entry(ledger_id, entry_id))

    def read_lac(self, ledger_id: int) -> Future:
        return _completed(lambda: self._reader.read_lac(ledger_id))

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Future:
        return failed_future(self._reader.refuse("explicit LAC"))

    def delete_ledger(self, ledger_id: int) -> Future:
        return failed_future(self._reader.refuse("delete"))


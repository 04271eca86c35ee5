"""Logs built from ledgers, and the embedded WAL.

A log is a named, ordered list of ledgers (segments) in the metadata store
(:mod:`pybk.log.metadata`); one :class:`LogWriter` appends records to it in batches
(:mod:`pybk.log.batch`) and any number of :class:`LogReader` read or tail it.  Records
are addressed by :class:`Position`, found by time with :func:`position_at`
(:mod:`pybk.log.timeindex`); readers give them as ``(position, value)`` pairs or
as :class:`Record` values with their keys, timestamps and headers.  :func:`pybk.open`
gives the embedded WAL (:mod:`pybk.log.wal`).  Jobs that read a log with many tasks plan
their ranges with :mod:`pybk.log.ranges`; readers that commit how far they read register
as consumers (:mod:`pybk.log.consumers`), which truncation waits for.  Jobs that write
from many tasks at once append their ledgers in one commit (:mod:`pybk.log.commit`,
:mod:`pybk.log.jobs`).

May import: the base modules and every package of the library below it: :mod:`pybk.storage`,
:mod:`pybk.meta`, :mod:`pybk.client`, :mod:`pybk.net`, :mod:`pybk.autorecovery`,
:mod:`pybk.admin`, :mod:`pybk.http`, :mod:`pybk.cluster`.
"""

from pybk.log.position import Position
from pybk.log.reader import LogReader
from pybk.log.record import Record
from pybk.log.timeindex import position_at
from pybk.log.wal import WAL
from pybk.log.writer import LogWriter

__all__ = ["LogReader", "LogWriter", "Position", "Record", "WAL", "position_at"]

"""Consumers of a log: named readers whose committed position holds back truncation.

A consumer is a reader that records how far it has read (Pulsar's subscriptions, Kafka's
committed offsets): a streaming Spark query with the ``consumerId`` option commits the
end of every micro-batch here.  :meth:`LogWriter.truncate <pybk.log.writer.LogWriter.truncate>`
never truncates past the slowest registered consumer: what a consumer has not read yet
stays in the log until it reads it or is removed (``pybk consumers remove``).  A
consumer that stops for good must be removed, or the log grows without bound.

Records, one per consumer, sealed (:mod:`pybk.meta.sealed`, magic b"PBKC", version 1)::

    /logs/<name>/consumers/<consumer id>

    "consumer"          its id (a record name: no '/', not empty)
    "position"          [segment, entry, slot]: everything before it was read; the
                        next record it reads is at or after it
    "updated_unix_ms"   when the position was last set (wall clock, for people)

Setting a position replaces the record whatever it held (the last commit wins, also
backwards: a consumer that starts again from an older checkpoint holds back truncation
from there).  Only the log's own records are touched: a consumer record is never read on
the data path, only when truncating and by the tools.

What is not held back: a Spark job writing with mode ``overwrite`` replaces the log's
content in its commit, whatever consumers have read (a consumer behind it finds its
position truncated away: its query fails, or skips ahead with ``failOnDataLoss=false``);
and :func:`pybk.log.metadata.delete_log` deletes a log with its consumers.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from pybk.errors import MalformedMetadata, NodeExists, NoNode, NoSuchLog
from pybk.log.metadata import consumer_path, consumers_path, log_path
from pybk.log.position import Position
from pybk.meta import paths
from pybk.meta.interface import ANY_VERSION, MetadataStore
from pybk.meta.sealed import seal, typed, unseal

MAGIC = b"PBKC"
FORMAT_VERSION = 1
_KEYS = frozenset(("consumer", "position", "updated_unix_ms"))


class Consumer(NamedTuple):
    """A consumer's record: its id, committed position, and when that was set."""

    consumer_id: str
    position: Position
    updated_unix_ms: int

    def to_bytes(self) -> bytes:
        return seal(MAGIC, FORMAT_VERSION, {"consumer": self.consumer_id,
                                            "position": list(self.position),
                                            "updated_unix_ms": self.updated_unix_ms})

    @classmethod
    def from_bytes(cls, data: bytes, consumer_id: str) -> "Consumer":
        obj = unseal(data, MAGIC, FORMAT_VERSION, _KEYS, "consumer record")
        try:
            found = typed("consumer", obj["consumer"], str)
            position = typed("position", obj["position"], list)
            if len(position) != 3:
                raise ValueError(f"position is {position!r}, not [segment, entry, slot]")
            record = cls(found, Position(*(typed("position", n, int) for n in position)),
                         typed("updated_unix_ms", obj["updated_unix_ms"], int))
        except ValueError as e:
            raise MalformedMetadata(f"consumer record body is malformed: {e}") from e
        if found != consumer_id:
            raise MalformedMetadata(f"the record of consumer {consumer_id!r} names "
                                    f"{found!r}")
        return record


def set_position(store: MetadataStore, log: str, consumer_id: str,
                 position: Position | str) -> None:
    """Record ``position`` as consumer ``consumer_id``'s of log ``log`` (registering it if
    new).  NoSuchLog if the log does not exist."""
    position = Position.of(position, "position")
    path = consumer_path(log, paths.check_name(consumer_id))
    data = Consumer(consumer_id, position, int(time.time() * 1000)).to_bytes()
    if not store.exists(log_path(log)):  # creating the record would create the log's path
        raise NoSuchLog(f"there is no log named {log!r}")
    try:
        store.set(path, data, ANY_VERSION)
    except NoNode:
        try:
            store.create(path, data)
        except NodeExists:  # registered meanwhile: the last commit wins
            store.set(path, data, ANY_VERSION)


def get(store: MetadataStore, log: str, consumer_id: str) -> Consumer | None:
    """Consumer ``consumer_id`` of log ``log``, or None if it is not registered."""
    try:
        data, _version = store.get(consumer_path(log, consumer_id))
    except NoNode:
        return None
    return Consumer.from_bytes(data, consumer_id)


def list_consumers(store: MetadataStore, log: str) -> list[Consumer]:
    """Every consumer of log ``log``, by id."""
    try:
        names = store.children(consumers_path(log))
    except NoNode:
        return []
    return [c for c in (get(store, log, name) for name in names) if c is not None]


def remove(store: MetadataStore, log: str, consumer_id: str) -> bool:
    """Unregister consumer ``consumer_id`` of log ``log``; False if it was not registered."""
    try:
        store.delete(consumer_path(log, consumer_id), ANY_VERSION)
    except NoNode:
        return False
    return True


def slowest(store: MetadataStore, log: str) -> Consumer | None:
    """The consumer of log ``log`` with the lowest position, or None if it has none."""
    return min(list_consumers(store, log), key=lambda c: c.position, default=None)

"""A log's metadata: its ordered list of segment ledgers, kept under compare-and-set.

The record of log ``name`` is at ``/logs/<name>`` in the metadata store, a sealed record
(:mod:`pybk.meta.sealed`) with magic b"PBKG", format version 1, and these body keys::

    "name"              the log's name
    "segments"          [[segment number, ledger id], ...], segment numbers increasing
    "next_segment"      the number the next segment gets (numbers are never reused)
    "truncated_before"  [segment, entry, slot]: records before it are gone
    "deleting"          [ledger id, ...]: truncated segments whose ledgers may still
                        exist (deleted after the record is updated; a writer that finds
                        some here on opening finishes the job)

Every change is a compare-and-set on the record's version: this is how two writers of one
log find out about each other (:mod:`pybk.log.writer`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from pybk.errors import MalformedMetadata, NodeExists
from pybk.log.position import START, Position
from pybk.meta import paths
from pybk.meta.interface import MetadataStore
from pybk.meta.sealed import seal, typed, unseal

MAGIC = b"PBKG"
FORMAT_VERSION = 1
LOGS = "/logs"


class Segment(NamedTuple):
    """One ledger of a log, with its segment number."""

    number: int
    ledger_id: int


@dataclasses.dataclass(frozen=True)
class LogMetadata:
    """What the metadata store knows of one log (immutable; replace to change)."""

    name: str
    segments: tuple[Segment, ...] = ()
    next_segment: int = 0
    truncated_before: Position = START
    deleting: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        numbers = [s.number for s in self.segments]
        if numbers != sorted(set(numbers)) or any(n >= self.next_segment for n in numbers):
            raise ValueError(f"log {self.name}: segment numbers {numbers} must increase and "
                             f"stay under next_segment={self.next_segment}")

    def with_new_segment(self, ledger_id: int) -> "LogMetadata":
        """The log with one more segment at its end."""
        return dataclasses.replace(
            self, segments=self.segments + (Segment(self.next_segment, ledger_id),),
            next_segment=self.next_segment + 1)

    def segment_after(self, number: int) -> Segment | None:
        """The first segment numbered above ``number`` (None: there is none yet)."""
        return next((s for s in self.segments if s.number > number), None)

    def to_bytes(self) -> bytes:
        return seal(MAGIC, FORMAT_VERSION, {
            "name": self.name,
            "segments": [list(s) for s in self.segments],
            "next_segment": self.next_segment,
            "truncated_before": list(self.truncated_before),
            "deleting": list(self.deleting),
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> "LogMetadata":
        obj = unseal(data, MAGIC, FORMAT_VERSION, _KEYS, "log metadata")
        try:
            return cls(
                name=typed("name", obj["name"], str),
                segments=tuple(Segment(*_ints("a segment", s, 2))
                               for s in typed("segments", obj["segments"], list)),
                next_segment=typed("next_segment", obj["next_segment"], int),
                truncated_before=Position(*_ints("truncated_before",
                                                 obj["truncated_before"], 3)),
                deleting=tuple(typed("a ledger id", i, int)
                               for i in typed("deleting", obj["deleting"], list)))
        except ValueError as e:
            raise MalformedMetadata(f"log metadata body is malformed: {e}") from e


_KEYS = frozenset(("name", "segments", "next_segment", "truncated_before", "deleting"))


def _ints(name: str, value: object, count: int) -> list[int]:
    if not isinstance(value, list) or len(value) != count:
        raise ValueError(f"{name} is {value!r}, not a list of {count} integers")
    return [typed(name, v, int) for v in value]


class VersionedLog(NamedTuple):
    metadata: LogMetadata
    version: int


def log_path(name: str) -> str:
    """The record of log ``name`` (a valid record name: no '/', not empty)."""
    return paths.join(LOGS, paths.check_name(name))


def read_log(store: MetadataStore, name: str, create: bool = False) -> VersionedLog:
    """The log's metadata and version; with ``create``, a new empty log if there is none
    (NoNode otherwise)."""
    path = log_path(name)
    if create and not store.exists(path):
        empty = LogMetadata(name)
        try:
            return VersionedLog(empty, store.create(path, empty.to_bytes()))
        except NodeExists:
            pass  # created meanwhile by another writer: read theirs
    data, version = store.get(path)
    return VersionedLog(LogMetadata.from_bytes(data), version)


def update_log(store: MetadataStore, metadata: LogMetadata, expected_version: int) -> int:
    """Compare-and-set the log's record; the new version (BadVersion if it moved on)."""
    return store.set(log_path(metadata.name), metadata.to_bytes(), expected_version)


def list_logs(store: MetadataStore) -> list[str]:
    """The names of every log in the store, sorted."""
    return store.children(LOGS) if store.exists(LOGS) else []

"""Bookie cookies in the metadata store: the cluster's memory of which disks each bookie
id stands for.

A bookie's directories carry a cookie (``pybk.storage.cookie``): its instance id,
drawn when they were formatted, its bookie id once it joined a cluster, and their paths
(unless they are not bound to paths, as an embedded WAL's).  That stops a bookie from
starting on swapped or half-wiped disks, or under another id, but not from starting on
*all-new* disks under an id the cluster already knows: a bookie whose disks were wiped
and formatted again, or another machine given the same id, would register and answer
"no such entry" for entries that ledgers say it holds.  So, as BookKeeper does, the
cluster keeps a copy of every bookie's cookie at ``/ledgers/cookies/<bookie id>``, and a
bookie node checks it at every start
(:func:`pybk.cluster.cookies.check_cluster_cookie`, where the directories meet the
cluster, as does ``pybk updatecookie``).  This module knows only the cluster's copy.

Record format: a sealed record (:mod:`pybk.meta.sealed`) with magic b"PBKC" and format
version 1, whose body has exactly these keys::

    "bookie_id"           the bookie's id (also the record's name)
    "instance_id"         the instance id in the bookie's directory cookies
    "journal_directory"   absolute path, as in the directory cookies, or null
    "ledger_directories"  [absolute path, ...], in the settings' order, or null

(both null: the bookie's directories are not bound to paths).

Read and written through :meth:`~pybk.meta.interface.MetadataStore.read_cookie`,
:meth:`~pybk.meta.interface.MetadataStore.write_cookie` and
:meth:`~pybk.meta.interface.MetadataStore.remove_cookie`.  Nothing removes a cookie by
itself: a decommissioned bookie's id stays taken until an operator removes it.
"""

from __future__ import annotations

import dataclasses

from pybk.errors import MalformedMetadata, MetadataError
from pybk.meta import paths
from pybk.meta.sealed import seal, typed, unseal

MAGIC = b"PBKC"
FORMAT_VERSION = 1
_KEYS = frozenset(("bookie_id", "instance_id", "journal_directory", "ledger_directories"))


def cookie_path(bookie_id: str) -> str:
    """The record of a bookie's cookie: ``/ledgers/cookies/<bookie id>``."""
    return paths.join(paths.COOKIES, paths.check_name(bookie_id))


@dataclasses.dataclass(frozen=True)
class Cookie:
    """A bookie's cookie as the cluster keeps it (immutable).  The directories are both
    None for a bookie whose directories are not bound to paths."""

    bookie_id: str
    instance_id: str
    journal_directory: str | None
    ledger_directories: tuple[str, ...] | None

    def __post_init__(self) -> None:
        paths.check_name(self.bookie_id)
        if not isinstance(self.instance_id, str) or not self.instance_id:
            raise ValueError(f"cookie of {self.bookie_id}: instance_id must be a non-empty "
                             f"string, not {self.instance_id!r}")
        if self.journal_directory is None and self.ledger_directories is None:
            return
        object.__setattr__(self, "ledger_directories", tuple(self.ledger_directories or ()))
        if not isinstance(self.journal_directory, str) or not self.journal_directory:
            raise ValueError(f"cookie of {self.bookie_id}: journal_directory must be a "
                             f"non-empty string (or None with ledger_directories None), "
                             f"not {self.journal_directory!r}")
        if not self.ledger_directories or not all(
                isinstance(d, str) and d for d in self.ledger_directories):
            raise ValueError(f"cookie of {self.bookie_id}: ledger_directories must be "
                             f"non-empty strings, at least one: {self.ledger_directories!r}")

    def differences(self, other: "Cookie") -> list[str]:
        """What differs from ``other``, one phrase per field; this cookie is called the
        cluster's, ``other`` the directories'."""
        found = []
        for name, label in (("bookie_id", "bookie id"), ("instance_id", "instance id"),
                            ("journal_directory", "journal directory"),
                            ("ledger_directories", "ledger directories")):
            mine, theirs = (_shown(getattr(c, name)) for c in (self, other))
            if mine != theirs:
                found.append(f"{label} {mine} in the cluster, {theirs} on disk")
        return found

    def to_bytes(self) -> bytes:
        return seal(MAGIC, FORMAT_VERSION, {
            "bookie_id": self.bookie_id,
            "instance_id": self.instance_id,
            "journal_directory": self.journal_directory,
            "ledger_directories": (None if self.ledger_directories is None
                                   else list(self.ledger_directories)),
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> "Cookie":
        """The cookie in a record's data; MalformedMetadata if it holds none."""
        obj = unseal(data, MAGIC, FORMAT_VERSION, _KEYS, "bookie cookie")
        try:
            ledgers = typed("ledger_directories", obj["ledger_directories"], list,
                            nullable=True)
            return cls(
                bookie_id=typed("bookie_id", obj["bookie_id"], str),
                instance_id=typed("instance_id", obj["instance_id"], str),
                journal_directory=typed("journal_directory", obj["journal_directory"], str,
                                        nullable=True),
                ledger_directories=None if ledgers is None else tuple(
                    typed("a ledger directory", d, str) for d in ledgers))
        except (ValueError, MetadataError) as e:
            raise MalformedMetadata(f"bookie cookie body is malformed: {e}") from e


def _shown(value: object) -> object:
    if value is None:
        return "(not bound to a path)"
    return list(value) if isinstance(value, tuple) else value

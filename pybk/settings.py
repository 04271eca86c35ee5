"""Bookie settings: BookKeeper's names and defaults, as a dataclass.

Settings come from three places, later ones winning:

1. the defaults below (BookKeeper's, except where a comment says why not);
2. a ``key=value`` file in the style of ``bk_server.conf`` (``#`` starts a comment line,
   lists are comma-separated, booleans are ``true``/``false``);
3. the environment: ``PYBK_<name>``, e.g. ``PYBK_journalMaxGroupWaitMSec=1``.

Every value is checked when the settings are built; a bad one raises
:class:`pybk.errors.InvalidConfiguration` naming the key and what is allowed.
Keys that pybk does not know are logged and ignored, since a ``bk_server.conf`` also
holds settings of parts pybk does not have.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from pybk.errors import InvalidConfiguration

log = logging.getLogger(__name__)

ENV_PREFIX = "PYBK_"

_MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    """Settings of one bookie (storage engine), named as in BookKeeper's ``bk_server.conf``."""

    #: Directory of the journal files (and of a cookie).
    journalDirectory: str = "/tmp/bk-txn"
    #: Directories of the entry logs; the first also holds the LMDB index.
    ledgerDirectories: tuple[str, ...] = ("/tmp/bk-data",)

    #: Longest time a group of journal records waits for more records before it is
    #: written and synced, when ``journalFlushWhenQueueEmpty`` is false.
    journalMaxGroupWaitMSec: float = 2.0
    #: With ``journalFlushWhenQueueEmpty`` false, a group that waits for more records is
    #: written and synced once it holds this many bytes.
    journalBufferedWritesThreshold: int = 512 * 1024
    #: Write and sync a group as soon as the queue is empty instead of waiting
    #: ``journalMaxGroupWaitMSec`` for more.  BookKeeper defaults to false; pybk defaults
    #: to true because groups form by themselves while the previous fdatasync runs, and
    #: a lone add then costs one fdatasync instead of the group wait plus one.
    journalFlushWhenQueueEmpty: bool = True
    #: A journal file is rolled once it reaches this size.
    journalMaxSizeMB: int = 2048
    #: Journal files older than the checkpoint that are kept anyway (for inspection).
    journalMaxBackups: int = 5
    #: Journal files are zero-filled (and synced) this far ahead of their records, a MiB
    #: after each group commit, so that an fdatasync after an append syncs neither a
    #: file-size nor an extent change.
    journalPreAllocSizeMB: int = 16
    #: Most records waiting for the journal; further adds block (back-pressure).
    journalQueueSize: int = 10_000

    #: An entry log is rolled once it reaches this size.
    logSizeLimit: int = 1024 * _MIB
    #: Milliseconds between checkpoints (flush of the write cache to entry logs and
    #: index, then a new LastLogMark).  BookKeeper's default is 60 s, with the journal on
    #: a disk of its own; pybk's bookies often share one disk between journal and entry
    #: logs, where a checkpoint's writeback delays the journal's fdatasyncs (and so every
    #: add) for as long as it lasts: small, frequent checkpoints keep that delay short.
    #: A checkpoint with nothing new to write costs no disk sync.
    flushInterval: int = 1_000
    #: A checkpoint writes an entry log out to the disk after every this many bytes
    #: appended to it, waiting for each piece, not only at its end (0: only at the
    #: end).  On a disk shared with the journal, a checkpoint's data then reaches the
    #: disk in small pieces, and a journal fdatasync waits behind one piece instead of
    #: the whole checkpoint.  (BookKeeper's name and meaning; its default is 0, for a
    #: journal on a disk of its own.)
    flushEntrylogBytes: int = 512 * 1024
    #: Memory for entries not yet in entry logs, in MiB.  Half of it fills while the
    #: other half is flushed; when both are full, adds block.  (BookKeeper:
    #: ``dbStorage_writeCacheMaxSizeMb``.)
    writeCacheMaxSizeMb: int = 64
    #: Largest entry accepted, in bytes (BookKeeper's frame limit, 5 MiB).
    maxEntrySizeBytes: int = 5 * _MIB

    #: Milliseconds between garbage collection runs.
    gcWaitTime: int = 1000
    #: Entry logs with a live fraction under this are compacted by minor compaction.
    minorCompactionThreshold: float = 0.2
    #: Seconds between minor compactions (0 disables them).
    minorCompactionInterval: int = 3600
    #: Entry logs with a live fraction under this are compacted by major compaction.
    majorCompactionThreshold: float = 0.8
    #: Seconds between major compactions (0 disables them).
    majorCompactionInterval: int = 86_400

    #: A disk fuller than this fraction makes the bookie read-only (or stops it).
    diskUsageThreshold: float = 0.95
    #: A read-only bookie becomes writable again once every disk is under this fraction.
    diskUsageLwmThreshold: float = 0.90
    #: Milliseconds between disk usage checks.
    diskCheckInterval: int = 10_000
    #: Go read-only when a disk is full; when false, shut the bookie down instead.
    readOnlyModeEnabled: bool = True

    #: Most adds (and other journal-bound requests: fences, explicit LACs, deletes) a
    #: bookie server has in progress; at the limit it stops reading requests until some
    #: finish, which pushes back on the clients.  BookKeeper's default is 0 (no limit);
    #: pybk puts a limit on it.
    maxAddsInProgressLimit: int = 10_000
    #: Most reads a bookie server has in progress (long-poll reads waiting for the LAC,
    #: fencing reads waiting for the fence); at the limit it stops reading requests.
    #: BookKeeper's default is 0 (no limit); pybk puts a limit on it.
    maxReadsInProgressLimit: int = 10_000

    #: Where the cluster's metadata lives, for a bookie that joins one (``pybk bookie``):
    #: ``zk://host:port[,host:port...]/ledgers``.  BookKeeper's name; its form is
    #: ``zk+hierarchical://...``, while pybk reads the ledger layout from the cluster.
    metadataServiceUri: str = ""
    #: The bookie's id in the cluster.  Empty: ``<advertised host>:<port>``, BookKeeper's
    #: default.  An id must stay with the bookie's disks for its life.
    bookieId: str = ""
    #: ``host:port`` the bookie server listens on (``0.0.0.0`` for every interface; port
    #: 0 picks a free one).  pybk's (BookKeeper has ``bookiePort`` and
    #: ``listeningInterface``); loopback by default, so nothing is exposed unasked.
    listenAddress: str = "127.0.0.1:3181"
    #: The host clients reach the bookie at (BookKeeper's ``advertisedAddress``).  Empty:
    #: the listen host, or this machine's name when listening on ``0.0.0.0``.
    advertisedAddress: str = ""
    #: The ZooKeeper session timeout in ms (BookKeeper's ``zkTimeout``): a bookie silent
    #: for longer loses its session and its registration.
    zkTimeout: int = 10_000
    #: When the ZooKeeper session expires, shut the bookie down instead of refusing
    #: writes until it is registered again in a new session.
    shutdownOnSessionExpiry: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.ledgerDirectories, (list, str)):
            dirs = self.ledgerDirectories
            object.__setattr__(
                self, "ledgerDirectories", tuple([dirs] if isinstance(dirs, str) else dirs)
            )
        _validate(self)

    def replace(self, **changes: Any) -> "ServerSettings":
        """A copy with some settings changed (validated like any other)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> "ServerSettings":
        """Build settings from a ``key=value`` file, then the environment, then ``overrides``."""
        values: dict[str, Any] = {}
        if path is not None:
            values.update(parse_conf_file(path))
        env = os.environ if environ is None else environ
        for f in fields(cls):
            if ENV_PREFIX + f.name in env:
                values[f.name] = env[ENV_PREFIX + f.name]
        values.update(overrides)
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ServerSettings":
        """Build settings from names and values (strings are parsed by the field's type)."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in known:
                log.warning("ignoring unknown setting %r", key)
                continue
            kwargs[key] = _convert(key, known[key].default, raw)
        return cls(**kwargs)


def parse_conf_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a ``bk_server.conf``-style file into raw strings."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise InvalidConfiguration(f"cannot read settings file {path}: {e.strerror}") from e
    values: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise InvalidConfiguration(f"{path}:{number}: expected key=value, got {line!r}")
        values[key.strip()] = value.strip()
    return values


def _convert(key: str, default: Any, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        if isinstance(default, bool):
            lowered = raw.strip().lower()
            if lowered in ("true", "yes", "1", "on"):
                return True
            if lowered in ("false", "no", "0", "off"):
                return False
            raise ValueError(raw)
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(default, int):
            return int(raw.strip())
        if isinstance(default, float):
            return float(raw.strip())
    except ValueError:
        raise InvalidConfiguration(
            f"setting {key}: {raw!r} is not a valid {type(default).__name__}"
        ) from None
    return raw


def _require(condition: bool, key: str, value: Any, allowed: str) -> None:
    if not condition:
        raise InvalidConfiguration(f"setting {key}={value!r} is invalid: it must be {allowed}")


def _validate(s: ServerSettings) -> None:
    for f in fields(s):
        value = getattr(s, f.name)
        expected = type(f.default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        _require(isinstance(value, expected), f.name, value, f"a {expected.__name__}")
    _require(bool(s.journalDirectory), "journalDirectory", s.journalDirectory, "a directory")
    _require(len(s.ledgerDirectories) > 0, "ledgerDirectories", s.ledgerDirectories,
             "at least one directory")
    _require(len(set(s.ledgerDirectories)) == len(s.ledgerDirectories), "ledgerDirectories",
             s.ledgerDirectories, "distinct directories")
    for key in ("journalMaxSizeMB", "journalPreAllocSizeMB", "journalQueueSize",
                "journalBufferedWritesThreshold", "logSizeLimit", "flushInterval",
                "writeCacheMaxSizeMb", "maxEntrySizeBytes", "gcWaitTime", "diskCheckInterval",
                "maxAddsInProgressLimit", "maxReadsInProgressLimit", "zkTimeout"):
        _require(getattr(s, key) > 0, key, getattr(s, key), "greater than 0")
    for key in ("journalMaxBackups", "minorCompactionInterval", "majorCompactionInterval",
                "journalMaxGroupWaitMSec", "flushEntrylogBytes"):
        _require(getattr(s, key) >= 0, key, getattr(s, key), "0 or more")
    for key in ("minorCompactionThreshold", "majorCompactionThreshold"):
        _require(0.0 <= getattr(s, key) <= 1.0, key, getattr(s, key), "between 0 and 1")
    _require(s.minorCompactionThreshold <= s.majorCompactionThreshold, "minorCompactionThreshold",
             s.minorCompactionThreshold, "at most majorCompactionThreshold")
    _require(0.0 < s.diskUsageThreshold <= 1.0, "diskUsageThreshold", s.diskUsageThreshold,
             "in (0, 1]")
    _require(0.0 < s.diskUsageLwmThreshold <= s.diskUsageThreshold, "diskUsageLwmThreshold",
             s.diskUsageLwmThreshold, "in (0, diskUsageThreshold]")
    _require(s.logSizeLimit >= 2 * s.maxEntrySizeBytes, "logSizeLimit", s.logSizeLimit,
             "at least twice maxEntrySizeBytes")
    _require(s.writeCacheMaxSizeMb * _MIB >= 4 * s.maxEntrySizeBytes, "writeCacheMaxSizeMb",
             s.writeCacheMaxSizeMb, "at least 4 times maxEntrySizeBytes (in MiB)")
    split_host_port(s.listenAddress, "listenAddress")


def split_host_port(value: str, key: str) -> tuple[str, int]:
    """``host:port`` as ``(host, port)``; port 0 means any free one.  InvalidConfiguration
    naming ``key`` if it is not of that form."""
    host, sep, port = value.rpartition(":")
    _require(bool(sep and host and port.isdigit() and int(port) < 65536
                  and not any(c.isspace() or c in "/[]" for c in host)),
             key, value, "host:port, with a port from 0 (any free one) to 65535")
    return host, int(port)


@dataclass(frozen=True)
class ClientSettings:
    """Settings of a ledger client, named as in BookKeeper's client configuration."""

    #: Seconds a bookie has to acknowledge an add before it is replaced (ensemble change).
    addEntryTimeout: float = 10.0
    #: Seconds a bookie has to answer a read before the next bookie is asked.
    readTimeout: float = 5.0
    #: An idle writer sends its LAC to the bookies this many milliseconds after its last
    #: add (0: never), so that readers see the last entry without waiting for the next.
    #: BookKeeper's default is 0; pybk's readers long-poll on it, hence a short default.
    explicitLacInterval: int = 50
    #: Largest entry the client accepts in a bookie's reply, in bytes (the bookies'
    #: ``maxEntrySizeBytes``); a larger reply is refused as malformed.
    maxEntrySizeBytes: int = 5 * _MIB
    #: Seconds a bookie replaced by an ensemble change is left out of this client's
    #: placements (new ledgers and replacements) unless too few other bookies are
    #: writable; BookKeeper's quarantine, with its default.
    bookieQuarantineTimeSeconds: float = 1800.0

    #: ZeroMQ transport: milliseconds between heartbeats (ZMTP PING) on a connection to
    #: a bookie.
    zmqHeartbeatIntervalMs: int = 1000
    #: ZeroMQ transport: a connection with no traffic and no heartbeat answer for this
    #: long, or a connection attempt not done by then, is lost: the requests outstanding
    #: on it fail with BookieUnavailable (which starts an ensemble change).
    zmqHeartbeatTimeoutMs: int = 3000
    #: ZeroMQ transport: reconnection attempts start 100 ms apart and back off, doubling,
    #: up to this many milliseconds apart.
    zmqReconnectIntervalMaxMs: int = 1000
    #: ZeroMQ transport: at most this many ADD messages per bookie wait for their answer;
    #: adds made meanwhile gather into the next message (more adds per message under
    #: load, fewer messages and system calls per add).
    zmqAddMessagesInFlight: int = 2

    def __post_init__(self) -> None:
        _require(self.addEntryTimeout > 0, "addEntryTimeout", self.addEntryTimeout,
                 "greater than 0")
        _require(self.readTimeout > 0, "readTimeout", self.readTimeout, "greater than 0")
        _require(self.explicitLacInterval >= 0, "explicitLacInterval",
                 self.explicitLacInterval, "0 or more")
        _require(self.bookieQuarantineTimeSeconds >= 0, "bookieQuarantineTimeSeconds",
                 self.bookieQuarantineTimeSeconds, "0 or more")
        for key in ("maxEntrySizeBytes", "zmqHeartbeatIntervalMs", "zmqHeartbeatTimeoutMs",
                    "zmqReconnectIntervalMaxMs", "zmqAddMessagesInFlight"):
            _require(getattr(self, key) > 0, key, getattr(self, key), "greater than 0")
        _require(self.zmqHeartbeatTimeoutMs > self.zmqHeartbeatIntervalMs,
                 "zmqHeartbeatTimeoutMs", self.zmqHeartbeatTimeoutMs,
                 "longer than zmqHeartbeatIntervalMs")


@dataclass(frozen=True)
class LogSettings:
    """Settings of a log writer (:mod:`pybk.log`), named in BookKeeper's style.

    A log writer puts small records together into one entry (a batch) while earlier
    entries are in flight, and rolls to a new ledger (a segment) by size or age.
    """

    #: Bookies per segment ledger (E), copies of each entry (Qw), acknowledgements an
    #: append waits for (Qa).  The embedded WAL has one bookie: 1, 1, 1.
    ensembleSize: int = 1
    writeQuorumSize: int = 1
    ackQuorumSize: int = 1
    #: Digest of the segment ledgers: "crc32", "crc32c", "mac" or "dummy".
    digestType: str = "crc32c"
    #: A segment is rolled once it holds this many bytes of records...
    segmentMaxBytes: int = 256 * _MIB
    #: ...or is this many seconds old at an append (0: no age limit).
    segmentMaxAgeSeconds: float = 3600.0
    #: A batch (one entry) holds at most this many bytes of records; a larger record
    #: goes alone into its own entry.
    batchMaxBytes: int = 256 * 1024
    #: The largest record an append accepts (it must fit in one bookie entry).
    recordMaxBytes: int = 1 * _MIB
    #: Batches in flight at once; further records wait and go out together as the
    #: next batch when one completes (this is what makes batches under load).
    maxOutstandingBatches: int = 1

    def __post_init__(self) -> None:
        _require(self.ensembleSize >= self.writeQuorumSize >= self.ackQuorumSize >= 1,
                 "ensembleSize/writeQuorumSize/ackQuorumSize",
                 (self.ensembleSize, self.writeQuorumSize, self.ackQuorumSize),
                 "E >= Qw >= Qa >= 1")
        _require(self.digestType.lower() in ("crc32", "crc32c", "mac", "dummy"), "digestType",
                 self.digestType, "one of crc32, crc32c, mac, dummy")
        for key in ("segmentMaxBytes", "batchMaxBytes", "recordMaxBytes",
                    "maxOutstandingBatches"):
            _require(getattr(self, key) > 0, key, getattr(self, key), "greater than 0")
        _require(self.segmentMaxAgeSeconds >= 0, "segmentMaxAgeSeconds",
                 self.segmentMaxAgeSeconds, "0 or more")

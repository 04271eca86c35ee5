"""Settings of bookies, clients and logs: BookKeeper's names and defaults, as dataclasses.

Settings come from three places, later ones winning:

1. the defaults below (BookKeeper's, except where a comment says why not);
2. a ``key=value`` file in the style of ``bk_server.conf`` (``#`` starts a comment line,
   lists are comma-separated, booleans are ``true``/``false``);
3. the environment: ``PYBK_<name>``, e.g. ``PYBK_journalMaxGroupWaitMSec=1``.

Every value is checked when the settings are built, whichever way: its type (an integer
setting takes neither ``1.5`` nor ``True``; strings are parsed by the setting's type only
when settings are built by name: files, the environment, ``from_mapping``, ``pybk.open``)
and its range.  A bad value or an unknown name raises
:class:`pybk.errors.InvalidConfiguration` naming the setting and what is allowed, and for
a misspelled name the setting meant.  Only unknown names in a ``bk_server.conf`` (or given
to ``from_mapping``) are logged and ignored instead, since such a file also configures
parts pybk does not have.

Settings that follow others: an entry of ``maxEntrySizeBytes`` must fit twice in an entry
log (``logSizeLimit``) and four times in the write cache (``writeCacheMaxSizeMb``).  Built
by name, settings not named are raised to fit the ones named, so raising
``maxEntrySizeBytes`` alone is enough (and an embedded WAL derives it from
``recordMaxBytes``); built by the constructor, one error names every setting to raise.

The embedded WAL (:func:`pybk.open`) starts from other defaults than a bookie server:
:data:`WAL_SERVER_DEFAULTS` and :data:`WAL_LOG_DEFAULTS`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar, Iterable, Mapping, Sequence, TypeVar

from pybk.errors import InvalidConfiguration
from pybk.topology import check_location

log = logging.getLogger(__name__)

ENV_PREFIX = "PYBK_"

_MIB = 1024 * 1024

S = TypeVar("S", bound="_Settings")


class _Settings:
    """What the settings classes share: copies, and building them by name."""

    # Each subclass is a dataclass: what makes it one, for the type checker.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def replace(self: S, **changes: Any) -> S:
        """A copy with some settings changed (validated like any other)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls: type[S], values: Mapping[str, Any],
                     defaults: Mapping[str, Any] | None = None) -> S:
        """Build settings from names and values (strings are parsed by the setting's type).

        ``defaults`` stand in for the class's own (the embedded WAL passes
        :data:`WAL_SERVER_DEFAULTS` and :data:`WAL_LOG_DEFAULTS`).  Settings that follow
        others (see the module's docstring) are raised to fit, unless ``values`` names
        them.  Unknown names are logged and ignored: a ``bk_server.conf`` also holds
        settings of other parts.
        """
        known = {f.name: f.default for f in fields(cls)}
        merged = {key: _convert(key, known[key], value)
                  for key, value in (defaults or {}).items()}
        named = set()
        for key, raw in values.items():
            if key not in known:
                log.warning("ignoring unknown setting %r%s", key, _did_you_mean(key, known))
                continue
            merged[key] = _convert(key, known[key], raw)
            named.add(key)
        merged.update(cls._following(merged, named))
        return cls(**merged)

    @classmethod
    def _following(cls, values: dict[str, Any], named: set[str]) -> dict[str, Any]:
        """Settings not ``named`` that must be raised to fit ``values``, and their values."""
        return {}


def _refuse_unknown_names(cls: type[S]) -> type[S]:
    """Make the constructor refuse an unknown name with InvalidConfiguration naming the
    setting meant (Python's TypeError names none)."""
    init = cls.__init__
    known = [f.name for f in fields(cls)]

    @functools.wraps(init)
    def __init__(self: S, *args: Any, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in known:
                raise InvalidConfiguration(unknown_setting(key, known, cls.__name__))
        init(self, *args, **kwargs)

    # The wrapper takes what the dataclass's __init__ takes; mypy sees object.__init__'s.
    cls.__init__ = __init__  # type: ignore[method-assign, assignment]
    return cls


@_refuse_unknown_names
@dataclass(frozen=True)
class ServerSettings(_Settings):
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
    #: The host the bookie runs on, as clients name theirs (``clientHost``): the bookie
    #: registers it (``/ledgers/hosts/<host>/<bookie id>``), and a client on that host
    #: puts the bookie first in new ensembles.  Empty: the advertised host.
    bookieHost: str = ""
    #: The bookie's network location, ``/<region>/<rack>`` (or ``/<rack>``), registered
    #: for rack-aware placement (:mod:`pybk.client.rackaware`).  Empty: the one
    #: ``networkTopologyScriptFileName`` maps the bookie to, else BookKeeper's default
    #: rack ``/default-region/default-rack``.  pybk's (BookKeeper maps on the client).
    bookieNetworkLocation: str = ""
    #: A program mapping bookie addresses to locations (BookKeeper's name): run with the
    #: bookie's ``<advertised host>:<port>`` as its argument, it prints the location
    #: (:mod:`pybk.topology`).  Used when ``bookieNetworkLocation`` is empty.
    networkTopologyScriptFileName: str = ""
    #: Milliseconds ``networkTopologyScriptFileName`` has to answer; later, or failing,
    #: the bookie is in the default rack (with a warning).  pybk's.
    networkTopologyScriptTimeoutMs: int = 5000
    #: Placement of the replacements this bookie's autorecovery chooses (as
    #: ``ClientSettings``'s, which see; BookKeeper's server configuration has them too).
    ensemblePlacementPolicy: str = "rendezvous"
    #: See ``ClientSettings.minNumRacksPerWriteQuorum``.
    minNumRacksPerWriteQuorum: int = 2
    #: See ``ClientSettings.enforceMinNumRacksPerWriteQuorum``.
    enforceMinNumRacksPerWriteQuorum: bool = False
    #: The ZooKeeper session timeout in ms (BookKeeper's ``zkTimeout``): a bookie silent
    #: for longer loses its session and its registration.
    zkTimeout: int = 10_000
    #: How long one ZooKeeper call of this process keeps retrying through connection
    #: loss before it gives up (MetadataUnavailable), and the first and longest pause
    #: between its retries, in ms (:class:`pybk.meta.zookeeper.ZooKeeperSettings`).
    zkOperationTimeoutMs: int = 30_000
    zkRetryBackoffStartMs: int = 100
    zkRetryBackoffMaxMs: int = 2_000
    #: When the ZooKeeper session expires, shut the bookie down instead of refusing
    #: writes until it is registered again in a new session.
    shutdownOnSessionExpiry: bool = False

    #: Autorecovery (:mod:`pybk.autorecovery.service`): the bookie process takes part in
    #: the auditor election (and runs the auditor when elected).  BookKeeper's default is
    #: false (it runs a separate autorecovery process); pybk's is true, so that a cluster
    #: of bookies heals itself with nothing else to run.
    autoRecoveryDaemonEnabled: bool = True
    #: Seconds a bookie may be missing from the registry before the auditor marks its
    #: ledgers under-replicated (0: at once).  A bookie back within it causes nothing (a
    #: rolling restart); two or more missing at once are audited at once.  The first
    #: auditor writes it to the cluster (``underreplication/lostBookieRecoveryDelay``),
    #: whose value wins from then on (``pybk lostbookierecoverydelay``).
    lostBookieRecoveryDelay: int = 0
    #: Seconds between the auditor's bookie checks (0: never; also run when an auditor
    #: is elected): bookies that ledgers or cookies name but that are not registered are
    #: handled as lost.
    auditorPeriodicBookieCheckInterval: int = 86_400
    #: Seconds between the auditor's ledger checks (0: never): every fragment's live
    #: bookies are asked for the first and last entry they should hold of it (and
    #: ``auditorLedgerVerificationPercentage`` of the others); a ledger whose entries a
    #: live bookie lacks is marked.
    auditorPeriodicCheckInterval: int = 604_800
    #: Percent of each fragment's entries the ledger check reads besides the first and
    #: last, 0 to 100.
    auditorLedgerVerificationPercentage: int = 0
    #: Record the time of marking in each mark (``ctime``).
    storeSystemtimeAsLedgerUnderreplicatedMarkTime: bool = True
    #: pybk's: seconds between the auditor's measurements of the backlog it publishes
    #: (it also measures after each of its audits); 0: only after audits.  Each reads
    #: every ledger's metadata, hence not more often.
    auditorBacklogIntervalSeconds: int = 60
    #: pybk's: the process runs a replication worker beside its part in the auditor
    #: election (:mod:`pybk.autorecovery.worker`), which repairs the ledgers the
    #: auditor marks.  BookKeeper always runs one with autorecovery; false leaves repair
    #: to other processes.
    replicationWorkerEnabled: bool = True
    #: Milliseconds a worker waits for the writer of an OPEN ledger whose last fragment
    #: lost a bookie to replace that bookie itself (an ensemble change) before it fences
    #: and closes the ledger (recovery) and re-replicates it.
    openLedgerRereplicationGracePeriod: int = 30_000
    #: Milliseconds, at most, a worker waits before trying again a ledger it could not
    #: re-replicate yet (its replicas unreadable, too few bookies): it holds the claim,
    #: waiting 1/32 of this after the first failure and twice as long after each next.
    #: A bookie joining the cluster ends the waits at once.
    lockReleaseOfFailedLedgerGracePeriod: int = 300_000
    #: Bytes per second a worker copies at most (-1: no limit): entries are written to
    #: replacement bookies no faster, so that repair leaves room for the writers.
    replicationRateByBytes: int = -1
    #: Entries a worker copies in one batch (read from replicas together, one batch read
    #: per source bookie, then written together while the next batches are read; how
    #: many batches a worker holds is bounded by ``rereplicationMaxBytesInFlight``).
    #: BookKeeper's default is 10; pybk's is
    #: 100: copying 1 KiB entries between bookie processes here ran at about 9,600
    #: entries/s with 10 and 30,000 with 100.
    rereplicationEntryBatchSize: int = 100
    #: pybk's: bytes a worker's copy holds at most (about: an entry larger than a read
    #: request's budget comes whole): the budgets of the batch reads it keeps in flight
    #: (one READ_BATCH per source bookie of a batch, each bringing at most 1 MiB) plus
    #: the entries written to the replacement and not yet acknowledged.  It reads
    #: batches ahead while it checks and writes the current one, as many as this allows.
    rereplicationMaxBytesInFlight: int = 16 * 1024 * 1024
    #: The password a worker opens ledgers with (BookKeeper's ``bookieRecoveryPasswd``):
    #: pybk keeps no ledger's password, only a salted hash of it, and the copies need
    #: the bookies' master key, derived from it.  A ledger created with another password
    #: cannot be repaired by the workers (their log says so).
    bookieRecoveryPasswd: str = ""

    #: Security (docs/guide/security.md; BookKeeper's ``tlsEnabled``): serve with ZeroMQ CURVE,
    #: encrypting every message and accepting only the clients whose public keys are in
    #: ``zmqCurveAllowedClientKeysDirectory`` (:mod:`pybk.net.curve`).  Off by
    #: default, for local use; turn it on in every networked deployment.  The bookie
    #: registers its public key with its endpoint; clients pin it.
    zmqCurveEnabled: bool = False
    #: This process's CURVE key pair: a ``.key_secret`` file of ``pybk keygen``.  Its
    #: key is the bookie's (server) key and, towards other bookies, its client key.
    zmqCurveSecretKeyFile: str = ""
    #: The ``*.key`` files of the clients (and other bookies) this bookie accepts.
    zmqCurveAllowedClientKeysDirectory: str = ""
    #: BookKeeper's ``zkEnableSecurity``: authenticate to ZooKeeper with the digest
    #: ``user:password`` in ``zkDigestAuthFile`` and create every znode with ACLs that
    #: let only that user change it (:mod:`pybk.meta.zkclient`).
    zkEnableSecurity: bool = False
    #: A file holding ``user:password`` (one line), read by the ZooKeeper clients of
    #: this process when ``zkEnableSecurity`` is on.
    zkDigestAuthFile: str = ""
    #: With ``zkEnableSecurity``: whether everyone may read pybk's znodes (true, the
    #: default, lets tools without credentials list bookies and ledgers) or only the
    #: ``zkDigestAuthFile`` user.
    zkWorldReadable: bool = True
    #: Port of the bookie's Prometheus endpoint, ``http://<address>:<port>/metrics``
    #: (:mod:`pybk.http.metrics`); 0: none.  BookKeeper's name; its default is 8000 once its
    #: Prometheus provider is chosen, and pybk has no provider switch, so the port is
    #: the switch: off by default, since several bookies of one machine (``pybk
    #: localcluster``, Spark's co-located bookies) cannot share a fixed port.
    prometheusStatsHttpPort: int = 0
    #: Address the Prometheus endpoint binds.  BookKeeper binds ``0.0.0.0``; pybk binds
    #: loopback unless told otherwise, so nothing is exposed unasked.
    prometheusStatsHttpAddress: str = "127.0.0.1"
    #: Serve the HTTP admin API and the status page (:mod:`pybk.http.server`) from
    #: the bookie process.
    httpServerEnabled: bool = False
    #: Port of the HTTP admin server (0: any free one).
    httpServerPort: int = 8080
    #: Host the HTTP admin server binds.  BookKeeper binds every interface; pybk binds
    #: loopback unless told otherwise (``0.0.0.0``), so nothing is exposed unasked.
    httpServerHost: str = "127.0.0.1"
    #: pybk's: the bearer token the admin API's changing endpoints (and ledger reads)
    #: require, ``Authorization: Bearer <token>``.  Empty: they are refused (403).
    httpServerAdminToken: str = ""
    #: pybk's: the largest request body the admin server reads, in bytes (larger: 413).
    httpServerMaxRequestBytes: int = 64 * 1024
    #: pybk's: requests the admin server serves at once; more are refused (503).
    httpServerMaxConcurrentRequests: int = 8
    #: pybk's: ms the admin server waits on a client's socket (reading the request,
    #: sending the answer) before it drops the connection.
    httpServerSocketTimeoutMs: int = 10_000

    def __post_init__(self) -> None:
        if isinstance(self.ledgerDirectories, (list, str)):
            dirs = self.ledgerDirectories
            object.__setattr__(
                self, "ledgerDirectories", tuple([dirs] if isinstance(dirs, str) else dirs)
            )
        _validate(self)

    @classmethod
    def _following(cls, values: dict[str, Any], named: set[str]) -> dict[str, Any]:
        max_entry = values.get("maxEntrySizeBytes", cls.maxEntrySizeBytes)
        if not _has_type(max_entry, 0) or max_entry <= 0:
            return {}  # the constructor says what is wrong with it
        raised = {}
        for key, least in _entry_fit(max_entry).items():
            current = values.get(key, getattr(cls, key))
            if key not in named and _has_type(current, 0) and current < least:
                log.info("setting %s raised from %d to %d to fit maxEntrySizeBytes=%d",
                         key, current, least, max_entry)
                raised[key] = least
        return raised

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
    """``raw`` parsed by the type of the setting's default if it is a string (from a file,
    the environment or a command line); other values are left to the type check."""
    if not isinstance(raw, str) or isinstance(default, str):
        return raw
    text = raw.strip()
    if isinstance(default, bool):
        if text.lower() in ("true", "yes", "1", "on"):
            return True
        if text.lower() in ("false", "no", "0", "off"):
            return False
    elif isinstance(default, tuple):
        return tuple(part.strip() for part in text.split(",") if part.strip())
    else:
        try:
            return type(default)(text)
        except ValueError:
            pass
    raise _invalid(key, raw, _kind(key, default))


def _has_type(value: Any, default: Any) -> bool:
    """Whether ``value`` has the type of ``default``: a bool is no number, and a float
    setting also takes an integer."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, tuple):
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(default))


#: What a setting's value must be, by the type of its default.
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          tuple: "a list of strings"}
#: Units of settings, by how their names end.
_UNITS = (("Bytes", "bytes"), ("MB", "MiB"), ("Mb", "MiB"), ("MSec", "milliseconds"),
          ("Ms", "milliseconds"), ("Seconds", "seconds"))


def _kind(key: str, default: Any) -> str:
    """What ``key``'s value must be: ``"an integer (a number of bytes)"``."""
    kind = _KINDS[type(default)]
    unit = next((unit for suffix, unit in _UNITS if key.endswith(suffix)), None)
    return f"{kind} (a number of {unit})" if unit and kind in ("an integer", "a number") \
        else kind


def _invalid(key: str, value: Any, allowed: str) -> InvalidConfiguration:
    return InvalidConfiguration(f"setting {key}={value!r} is invalid: it must be {allowed}")


def _require(condition: bool, key: str, value: Any, allowed: str) -> None:
    if not condition:
        raise _invalid(key, value, allowed)


def _check_types(settings: _Settings) -> None:
    for f in fields(settings):
        value = getattr(settings, f.name)
        _require(_has_type(value, f.default), f.name, value, _kind(f.name, f.default))


def _entry_fit(max_entry_bytes: int) -> dict[str, int]:
    """The least ``logSizeLimit`` and ``writeCacheMaxSizeMb`` for entries of
    ``max_entry_bytes``: two fit in an entry log, and two in each half of the write cache
    (one half fills while the other is written out)."""
    return {"logSizeLimit": 2 * max_entry_bytes,
            "writeCacheMaxSizeMb": -(-4 * max_entry_bytes // _MIB)}


def _validate(s: ServerSettings) -> None:
    _check_types(s)
    _require(bool(s.journalDirectory), "journalDirectory", s.journalDirectory, "a directory")
    _require(len(s.ledgerDirectories) > 0, "ledgerDirectories", s.ledgerDirectories,
             "at least one directory")
    _require(len(set(s.ledgerDirectories)) == len(s.ledgerDirectories), "ledgerDirectories",
             s.ledgerDirectories, "distinct directories")
    for key in ("journalMaxSizeMB", "journalPreAllocSizeMB", "journalQueueSize",
                "journalBufferedWritesThreshold", "logSizeLimit", "flushInterval",
                "writeCacheMaxSizeMb", "maxEntrySizeBytes", "gcWaitTime", "diskCheckInterval",
                "maxAddsInProgressLimit", "maxReadsInProgressLimit", "zkTimeout",
                "zkOperationTimeoutMs", "zkRetryBackoffStartMs", "zkRetryBackoffMaxMs",
                "lockReleaseOfFailedLedgerGracePeriod", "rereplicationEntryBatchSize",
                "rereplicationMaxBytesInFlight",
                "httpServerMaxRequestBytes", "httpServerMaxConcurrentRequests",
                "httpServerSocketTimeoutMs"):
        _require(getattr(s, key) > 0, key, getattr(s, key), "greater than 0")
    for key in ("journalMaxBackups", "minorCompactionInterval", "majorCompactionInterval",
                "journalMaxGroupWaitMSec", "flushEntrylogBytes", "lostBookieRecoveryDelay",
                "auditorPeriodicBookieCheckInterval", "auditorPeriodicCheckInterval",
                "auditorBacklogIntervalSeconds", "openLedgerRereplicationGracePeriod"):
        _require(getattr(s, key) >= 0, key, getattr(s, key), "0 or more")
    _require(0 <= s.prometheusStatsHttpPort <= 65535, "prometheusStatsHttpPort",
             s.prometheusStatsHttpPort, "a port from 0 (no endpoint) to 65535")
    _require(s.replicationRateByBytes == -1 or s.replicationRateByBytes > 0,
             "replicationRateByBytes", s.replicationRateByBytes,
             "-1 (no limit) or greater than 0")
    _require(0 <= s.auditorLedgerVerificationPercentage <= 100,
             "auditorLedgerVerificationPercentage", s.auditorLedgerVerificationPercentage,
             "from 0 to 100")
    for key in ("minorCompactionThreshold", "majorCompactionThreshold"):
        _require(0.0 <= getattr(s, key) <= 1.0, key, getattr(s, key), "between 0 and 1")
    _require(s.minorCompactionThreshold <= s.majorCompactionThreshold, "minorCompactionThreshold",
             s.minorCompactionThreshold, "at most majorCompactionThreshold")
    _require(0.0 < s.diskUsageThreshold <= 1.0, "diskUsageThreshold", s.diskUsageThreshold,
             "in (0, 1]")
    _require(0.0 < s.diskUsageLwmThreshold <= s.diskUsageThreshold, "diskUsageLwmThreshold",
             s.diskUsageLwmThreshold, "in (0, diskUsageThreshold]")
    short = [f"{key} >= {least} (it is {getattr(s, key)})"
             for key, least in _entry_fit(s.maxEntrySizeBytes).items()
             if getattr(s, key) < least]
    if short:
        raise InvalidConfiguration(
            f"setting maxEntrySizeBytes={s.maxEntrySizeBytes} needs {' and '.join(short)}: "
            "raise them too, or build the settings by name (pybk.open, a conf file, "
            "ServerSettings.from_mapping), which raises the settings not named to fit")
    split_host_port(s.listenAddress, "listenAddress")
    _check_host(s.bookieHost, "bookieHost")
    _require(s.networkTopologyScriptTimeoutMs > 0, "networkTopologyScriptTimeoutMs",
             s.networkTopologyScriptTimeoutMs, "greater than 0")
    if s.bookieNetworkLocation:
        try:
            check_location(s.bookieNetworkLocation)
        except ValueError as e:
            raise _invalid("bookieNetworkLocation", s.bookieNetworkLocation,
                           "/<region>/<rack> or /<rack>, or empty") from e
    _check_placement(s)
    _check_curve(s)
    _require(s.zkRetryBackoffStartMs <= s.zkRetryBackoffMaxMs, "zkRetryBackoffStartMs",
             s.zkRetryBackoffStartMs, "at most zkRetryBackoffMaxMs")
    _require(not s.zkEnableSecurity or bool(s.zkDigestAuthFile), "zkDigestAuthFile",
             s.zkDigestAuthFile, "a file holding user:password when zkEnableSecurity is on")
    _require(0 <= s.httpServerPort < 65536, "httpServerPort", s.httpServerPort,
             "from 0 (any free one) to 65535")
    _require(bool(s.httpServerHost), "httpServerHost", s.httpServerHost,
             "a host or address to bind")
    _check_host(s.httpServerHost, "httpServerHost")


#: The values of ``ensemblePlacementPolicy``: BookKeeper's policies, by pybk's names.
PLACEMENT_POLICIES = ("rendezvous", "rackaware", "regionaware")
#: The placement settings a bookie's autorecovery hands to its client.
PLACEMENT_SETTINGS = ("ensemblePlacementPolicy", "minNumRacksPerWriteQuorum",
                      "enforceMinNumRacksPerWriteQuorum")


def placement_settings_of(settings: "ServerSettings") -> dict[str, Any]:
    """The placement settings of a ClientSettings for a process configured by
    ``settings`` (a bookie's autorecovery, the admin shell's recovery)."""
    return {key: getattr(settings, key) for key in PLACEMENT_SETTINGS}


def _check_placement(s: "ServerSettings | ClientSettings") -> None:
    _require(s.ensemblePlacementPolicy in PLACEMENT_POLICIES, "ensemblePlacementPolicy",
             s.ensemblePlacementPolicy, " or ".join(PLACEMENT_POLICIES))
    _require(s.minNumRacksPerWriteQuorum >= 1, "minNumRacksPerWriteQuorum",
             s.minNumRacksPerWriteQuorum, "1 or more")


def _check_curve(s: "ServerSettings | ClientSettings") -> None:
    """With CURVE on, the key pair is named (files are read when used; a bookie server's
    ``zmqCurveAllowedClientKeysDirectory`` is checked when it starts, since the admin
    shell and ``pybk autorecovery`` take ServerSettings too and serve nothing)."""
    _require(not s.zmqCurveEnabled or bool(s.zmqCurveSecretKeyFile), "zmqCurveSecretKeyFile",
             s.zmqCurveSecretKeyFile,
             "a .key_secret file (pybk keygen) when zmqCurveEnabled is on")


def _check_host(value: str, key: str) -> None:
    """A host name setting: empty, or a name that can be a metadata record's name."""
    _require(not any(c.isspace() or c in "/\0" for c in value) and value not in (".", ".."),
             key, value, "a host name (no '/', NUL or spaces), or empty")


def unknown_setting(name: str, known: Iterable[str], where: str) -> str:
    """The message for a setting ``name`` that none of ``known`` (the settings of
    ``where``) is, naming the one meant if it looks misspelled."""
    return f"unknown setting {name!r}{_did_you_mean(name, known)}: not a setting of {where}"


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'segmentMaxBytes'?)`` for ``segment_max_bytes``, or nothing."""
    def squashed(key: str) -> str:
        return key.replace("_", "").replace("-", "").replace(".", "").lower()

    by_squashed = {squashed(key): key for key in known}
    close = difflib.get_close_matches(squashed(name), by_squashed, n=1, cutoff=0.8)
    return f" (did you mean {by_squashed[close[0]]!r}?)" if close else ""


def sort_settings(values: Mapping[str, Any],
                  classes: Sequence[type[_Settings]]) -> list[dict[str, Any]]:
    """Sort ``values`` by the settings class each name belongs to (one dict per class, in
    order); a name several classes have (``maxEntrySizeBytes``) goes to each.  An unknown
    name raises InvalidConfiguration."""
    names = [{f.name for f in fields(kind)} for kind in classes]
    sorted_values: list[dict[str, Any]] = [{} for _ in classes]
    for name, value in values.items():
        homes = [bucket for bucket, known in zip(sorted_values, names) if name in known]
        if not homes:
            raise InvalidConfiguration(unknown_setting(
                name, set().union(*names),
                ", ".join(kind.__name__ for kind in classes[:-1]) + " or "
                + classes[-1].__name__))
        for bucket in homes:
            bucket[name] = value
    return sorted_values


def split_host_port(value: str, key: str) -> tuple[str, int]:
    """``host:port`` as ``(host, port)``; port 0 means any free one.  InvalidConfiguration
    naming ``key`` if it is not of that form."""
    host, sep, port = value.rpartition(":")
    _require(bool(sep and host and port.isdigit() and int(port) < 65536
                  and not any(c.isspace() or c in "/[]" for c in host)),
             key, value, "host:port, with a port from 0 (any free one) to 65535")
    return host, int(port)


@_refuse_unknown_names
@dataclass(frozen=True)
class ClientSettings(_Settings):
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
    #: The host this client runs on, named as bookies register theirs (``bookieHost``):
    #: new ensembles start with a writable bookie of that host, so that a writer's first
    #: copy stays on its machine (:mod:`pybk.client.placement`).  Empty: no host is
    #: preferred.  pybk's; BookKeeper's rack-aware placement prefers the client's rack.
    clientHost: str = ""
    #: How new ensembles and replacements are chosen (BookKeeper's setting names a class):
    #: ``rendezvous`` (pybk's default, racks unknown to it: :mod:`pybk.client.placement`),
    #: ``rackaware`` (every write set across racks: :mod:`pybk.client.rackaware`) or
    #: ``regionaware`` (the ensemble across regions too), from the locations bookies
    #: register (``bookieNetworkLocation``).
    ensemblePlacementPolicy: str = "rendezvous"
    #: Racks each write set spans under the rack- and region-aware policies, where the
    #: writable bookies allow (BookKeeper's name and default).
    minNumRacksPerWriteQuorum: int = 2
    #: Fail a new ledger or an ensemble change (NotEnoughBookies naming the racks) that
    #: cannot meet ``minNumRacksPerWriteQuorum``, instead of spanning fewer racks with a
    #: warning (BookKeeper's name and default).
    enforceMinNumRacksPerWriteQuorum: bool = False
    #: At most this many adds of this client (all its ledgers together) are outstanding
    #: (sent, not yet acknowledged or failed); 0: no limit.  BookKeeper's ``throttle``,
    #: with its default.  An add beyond it waits for one to finish (see
    #: ``throttleBlocking``), so that a fast producer meets back-pressure instead of
    #: queueing without bound.
    throttle: int = 5000
    #: With ``throttle`` adds outstanding, an add waits up to ``addEntryTimeout`` for one
    #: to finish, then fails with TooManyRequests; false: it fails at once.  pybk's.
    throttleBlocking: bool = True
    #: A ledger with caller-given entry ids (``create_ledger_adv``) takes an id at most
    #: this many past its LAC (LAC + 1 .. LAC + advWindowEntries): the bound on the adds
    #: it holds back, written but waiting for a lower id.  pybk's (BookKeeper bounds them
    #: by ``throttle`` only); keep it at or under ``throttle``, so that the missing id
    #: always finds a permit.
    advWindowEntries: int = 5000

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
    #: Security: reach bookies over ZeroMQ CURVE (encrypted, authenticated both ways),
    #: pinning the public key each bookie registered (:mod:`pybk.net.curve`).  Must
    #: match the bookies' ``zmqCurveEnabled``.  Off by default, for local use.
    zmqCurveEnabled: bool = False
    #: This client's CURVE key pair (a ``.key_secret`` file of ``pybk keygen``); its
    #: public key must be among the bookies' allowed client keys.
    zmqCurveSecretKeyFile: str = ""

    def __post_init__(self) -> None:
        _check_types(self)
        _require(self.addEntryTimeout > 0, "addEntryTimeout", self.addEntryTimeout,
                 "greater than 0")
        _require(self.readTimeout > 0, "readTimeout", self.readTimeout, "greater than 0")
        _require(self.explicitLacInterval >= 0, "explicitLacInterval",
                 self.explicitLacInterval, "0 or more")
        _require(self.bookieQuarantineTimeSeconds >= 0, "bookieQuarantineTimeSeconds",
                 self.bookieQuarantineTimeSeconds, "0 or more")
        _require(self.throttle >= 0, "throttle", self.throttle, "0 (no limit) or more")
        _check_host(self.clientHost, "clientHost")
        _check_placement(self)
        for key in ("maxEntrySizeBytes", "advWindowEntries", "zmqHeartbeatIntervalMs",
                    "zmqHeartbeatTimeoutMs",
                    "zmqReconnectIntervalMaxMs", "zmqAddMessagesInFlight"):
            _require(getattr(self, key) > 0, key, getattr(self, key), "greater than 0")
        _require(self.zmqHeartbeatTimeoutMs > self.zmqHeartbeatIntervalMs,
                 "zmqHeartbeatTimeoutMs", self.zmqHeartbeatTimeoutMs,
                 "longer than zmqHeartbeatIntervalMs")
        _check_curve(self)


@_refuse_unknown_names
@dataclass(frozen=True)
class LogSettings(_Settings):
    """Settings of a log writer (:mod:`pybk.log`), named in BookKeeper's style.

    A log writer puts small records together into one entry (a batch) while earlier
    entries are in flight, and rolls to a new ledger (a segment) by size or age.
    """

    #: Bookies per segment ledger (E), copies of each entry (Qw), acknowledgements an
    #: append waits for (Qa): BookKeeper's client defaults, so that a log on a cluster
    #: survives the loss of a bookie unless one copy is asked for (1, 1, 1).  The
    #: embedded WAL has one bookie: :data:`WAL_LOG_DEFAULTS`.
    ensembleSize: int = 3
    writeQuorumSize: int = 2
    ackQuorumSize: int = 2
    #: Digest of the segment ledgers: "crc32", "crc32c", "mac" or "dummy".
    digestType: str = "crc32c"
    #: A segment is rolled once it holds this many bytes of batches (the batch that
    #: crosses the limit is the segment's last, so a segment ends at most a batch past
    #: it: ``batchMaxBytes``, or one record of up to ``recordMaxBytes``)...
    segmentMaxBytes: int = 256 * _MIB
    #: ...or is this many seconds old at an append (0: no age limit).
    segmentMaxAgeSeconds: float = 3600.0
    #: A batch (one entry) holds at most this many bytes of records; a larger record
    #: goes alone into its own entry.
    batchMaxBytes: int = 256 * 1024
    #: The largest record an append accepts (its value, key and headers: see
    #: :mod:`pybk.log.batch`).  It must fit in one entry: the client's and
    #: the bookies' ``maxEntrySizeBytes`` must hold it with the batch header and digest
    #: (``LogWriter.open`` checks the client's; an embedded WAL raises both to fit).
    recordMaxBytes: int = 1 * _MIB
    #: Batches in flight at once; further records wait and go out together as the
    #: next batch when one completes (this is what makes batches under load).
    maxOutstandingBatches: int = 1
    #: Segment ledgers with ``WriteFlag.DEFERRED_SYNC`` (pybk's own setting): an append
    #: returns once its batch is written on Qa bookies, before fdatasync (it survives the
    #: processes dying, not a power cut); ``sync()`` makes every earlier append durable,
    #: and readers see records up to the last sync only (the durable LAC).
    deferredSync: bool = False

    def __post_init__(self) -> None:
        _check_types(self)
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


#: Defaults of the embedded WAL's bookie (:func:`pybk.open`), which shares an
#: application's disk instead of owning a server's: journal files of 16 MiB (zeroed 4 MiB
#: ahead) with no old ones kept, and entry logs of 16 MiB, where a bookie server keeps
#: five 2 GiB journals and writes 1 GiB entry logs.  Small files are what truncation can
#: give back: garbage collection removes whole entry logs, and the checkpoint whole
#: journal files.  :func:`pybk.storage.gc.space_bound_bytes` is the most a bookie holds
#: beyond its live ledgers; with these defaults, 53 MiB plus the index.
WAL_SERVER_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "journalMaxSizeMB": 16,
    "journalPreAllocSizeMB": 4,
    "journalMaxBackups": 0,
    "logSizeLimit": 16 * _MIB,
})

#: Defaults of the embedded WAL's log: it has one bookie, so one copy (a WAL promoted to
#: a cluster member replicates with its ``ensemble``, ``write_quorum`` and ``ack_quorum``).
WAL_LOG_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "ensembleSize": 1,
    "writeQuorumSize": 1,
    "ackQuorumSize": 1,
})

"""The options of the ``pybk`` Spark data source: their table, and their parsing.

Every option the source knows is in :data:`OPTIONS`, with the uses it applies to:
``read`` (``spark.read``), ``stream_read`` (``spark.readStream``), ``write``
(``df.write``) and ``stream_write`` (``df.writeStream``).  Besides them, every setting of
:class:`~pybk.settings.ClientSettings` passes through to the client of each task and of
the driver, as do the ZooKeeper settings of :data:`ZOOKEEPER_SETTINGS`, and for writes
every setting of :class:`~pybk.settings.LogSettings` (``ensembleSize``,
``writeQuorumSize``, ``ackQuorumSize``, ``segmentMaxBytes``, ``batchMaxBytes``, ...)
shapes the ledgers the job writes.

Credentials (docs/guide/security.md): ``zmqCurveEnabled`` and ``zmqCurveSecretKeyFile``
(ClientSettings: the CURVE key pair) and ``zkEnableSecurity`` and ``zkDigestAuthFile``
(the ZooKeeper digest credentials).  The files are *paths on the machine where each
client runs*: the driver reads them while planning, and every executor reads them in its
tasks, so they must exist at that path on every executor host (with the same content);
they are never read on the driver and shipped.  A missing or malformed file fails the
query with InvalidConfiguration naming the setting (on the driver first, which reads
them too).

Spark hands a data source its options with lower-cased names; :func:`parse` maps them back
to the names here, so ``.option("maxRecordsPerTrigger", 100)`` and
``.option("maxrecordspertrigger", 100)`` are the same.  An unknown option, or one of
another use (``sinkId`` on a read), raises InvalidConfiguration naming it (and the option
meant, for a misspelling), on the driver, before any task runs.

The parsed :class:`PybkOptions` is plain data: it is what Spark pickles to the tasks,
which build their own client from it (:mod:`pybk.spark.connect`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, TypeVar

from pybk.errors import InvalidConfiguration
from pybk.log.position import Position
from pybk.log.wal import LOG_NAME as WAL_LOG_NAME
from pybk.meta.address import parse_zookeeper_address
from pybk.settings import ClientSettings, LogSettings, ServerSettings, unknown_setting

if TYPE_CHECKING:
    from pybk.meta.zookeeper import ZooKeeperSettings

T = TypeVar("T")

READ, STREAM_READ, WRITE, STREAM_WRITE = "read", "stream_read", "write", "stream_write"
USES = (READ, STREAM_READ, WRITE, STREAM_WRITE)
_READS = frozenset({READ, STREAM_READ})
_WRITES = frozenset({WRITE, STREAM_WRITE})
_ALL = frozenset(USES)

#: ``startingPosition`` / ``endingPosition`` words (Spark's Kafka source's, for offsets).
EARLIEST, LATEST = "earliest", "latest"


def _text(name: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise InvalidConfiguration(f"option {name}={raw!r}: expected a non-empty string")
    return raw


def _string(name: str, raw: Any) -> str:
    """Any string, the empty one included (a password)."""
    if not isinstance(raw, str):
        raise InvalidConfiguration(f"option {name}={raw!r}: expected a string")
    return raw


def _boolean(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise InvalidConfiguration(f"option {name}={raw!r}: expected true or false")


def _number(kind: type) -> Callable[[str, Any], Any]:
    def convert(name: str, raw: Any) -> Any:
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise InvalidConfiguration(f"option {name}={raw!r}: expected a "
                                       f"{'whole ' if kind is int else ''}number") from None
        if value <= 0:
            raise InvalidConfiguration(f"option {name}={raw!r}: must be greater than 0")
        return value
    return convert


def _position(name: str, raw: Any, log: str | None = None) -> str:
    """``earliest``, ``latest`` or a position ``segment:entry:slot`` (kept as text); the
    value for ``log`` in a JSON object of them (:func:`_positions`)."""
    text = str(raw).strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower()
    try:
        return str(Position.parse(text))
    except ValueError:
        given = f"={raw!r}" if log is None else f" gives log {log!r} {raw!r}"
        raise InvalidConfiguration(
            f"option {name}{given}: expected earliest, latest, a position "
            'segment:entry:slot (as str(Position) gives it) or, by log, JSON {"log": '
            '"earliest", "other": "3:0:0"}') from None


def _timestamp(name: str, raw: Any, log: str | None = None) -> int:
    """A timestamp: a whole number of milliseconds since the epoch, 0 or more (as
    :attr:`pybk.log.Record.timestamp` holds them); the value for ``log`` in a JSON
    object of them (:func:`_timestamps`)."""
    given = f"={raw!r}" if log is None else f" gives log {log!r} {raw!r}"
    try:
        value = raw if isinstance(raw, int) and not isinstance(raw, bool) \
            else int(str(raw).strip())
    except ValueError:
        raise InvalidConfiguration(
            f"option {name}{given}: expected a whole number of milliseconds since the "
            "epoch (as Record.timestamp holds them, e.g. 1764028800000) or, by log, JSON "
            '{"log": 1764028800000, "other": 1764032400000}') from None
    if value < 0:
        raise InvalidConfiguration(f"option {name}{given}: a timestamp is 0 or more "
                                   "(milliseconds since the epoch)")
    return value


def _by_log(one: Callable[..., T], kind: str, accepts: Callable[[object], bool],
            example: str) -> Callable[[str, Any], "T | dict[str, T]"]:
    """A reader of what ``one`` reads, or of a JSON object giving one of those (JSON
    values that ``accepts``, ``kind`` in messages) to each log it names (Spark's Kafka
    source's form of offsets by topic): a dict then."""
    def read(name: str, raw: Any) -> "T | dict[str, T]":
        text = str(raw).strip()
        if not text.startswith("{"):
            return one(name, raw)
        try:
            by_log = json.loads(text)
        except ValueError as e:
            raise InvalidConfiguration(f"option {name}={raw!r} is not JSON ({e}): expected "
                                       f"{example}") from None
        if not isinstance(by_log, dict) or not all(map(accepts, by_log.values())):
            raise InvalidConfiguration(f"option {name}={raw!r}: expected a JSON object of "
                                       f"{kind} by log name, {example}")
        return {log: one(name, value, log) for log, value in by_log.items()}
    return read


#: :func:`_position`'s reader, or positions by log.
_positions = _by_log(_position, "strings", lambda v: isinstance(v, str),
                     '{"log": "earliest", "other": "3:0:0"}')
#: :func:`_timestamp`'s reader, or timestamps by log (as ``startingPosition`` takes
#: positions by log).
_timestamps = _by_log(_timestamp, "whole numbers",
                      lambda v: isinstance(v, int) and not isinstance(v, bool),
                      '{"log": 1764028800000, "other": 1764032400000}')


def _pattern(name: str, raw: Any) -> str:
    """A regular expression (kept as text: compiled where it is used)."""
    text = _text(name, raw)
    try:
        re.compile(text)
    except re.error as e:
        raise InvalidConfiguration(f"option {name}={raw!r} is not a regular expression: "
                                   f"{e}") from None
    return text


class Option(NamedTuple):
    """One option of the data source: its name, how its text is read, its default (None:
    not set), the uses it applies to, and what it does (docs/guide/spark.md's options
    table is generated from these)."""

    name: str
    convert: Callable[[str, Any], Any]
    default: Any
    uses: frozenset[str]
    doc: str


OPTIONS: dict[str, Option] = {option.name: option for option in (
    Option("metadataServiceUri", _text, None, _ALL,
           "the cluster, `zk://host:port[,host:port...]/ledgers`"),
    Option("path", _text, None, _ALL,
           "an embedded WAL directory instead of a cluster (also `load(path)` / "
           "`save(path)`); a batch read reads it beside its running application, other "
           "uses need the application stopped"),
    Option("log", _text, None, _ALL,
           "the log's name (required with metadataServiceUri, unless a read gives "
           "`logPattern`; `wal` for a WAL directory); reads take several, separated by "
           "commas (`a,b,c`; spaces around names are dropped; read a name that holds a "
           "comma by `logPattern`)"),
    Option("logPattern", _pattern, None, _READS,
           "instead of `log`: a regular expression over log names (Python's "
           "`re.fullmatch`: the whole name must match); reads every log that matches. A "
           "streaming query lists the logs at each micro-batch: a log created while it "
           "runs is read from its start (its earliest record, whatever "
           "`startingPosition` or `startingTimestamp` say), a log deleted while it "
           "runs is read no more (a warning is logged; its records not yet read are not "
           "reported as lost)"),
    Option("password", _string, "", _ALL,
           "the password of the log's ledgers (as the log's writers use it)"),
    Option("lockTimeoutSeconds", _number(float), 60.0, _ALL,
           "with `path`, except for a batch read: how long a task waits for the directory, "
           "which the job's tasks take in turns"),
    Option("startingPosition", _positions, None, _READS,
           "`earliest`, `latest` or a position, inclusive (default: earliest for a batch "
           "read, latest for a new streaming query); a position applies to one log: with "
           'several, a JSON object by log name, `{"a": "3:0:0", "b": "earliest"}`, whose '
           "logs not named take the default (a log a streaming query finds later starts "
           "at earliest)"),
    Option("startingTimestamp", _timestamps, None, _READS,
           "instead of `startingPosition`: a time, in milliseconds since the epoch; each "
           "log is read from its first record whose timestamp is at least that "
           "(`pybk.log.position_at`, exact with unordered timestamps: records after it "
           "are read whatever their timestamps), or from its end if none is. One "
           'number for every log, or a JSON object by log name, `{"a": 1764028800000}` '
           "(Kafka's `startingTimestamp` and, by topic, `startingOffsetsByTimestamp`). A "
           "log's start is given by one of the two options: as JSON objects, they may "
           "name different logs. A streaming query uses it for its first start only "
           "(then its checkpoint), and a log it finds later starts at earliest, as with "
           "`startingPosition`"),
    Option("endingTimestamp", _timestamps, None, frozenset({READ}),
           "instead of `endingPosition`: a time, in milliseconds since the epoch; each "
           "log is read up to its first record whose timestamp is at least that, "
           "exclusive (that record is not read), or to its end if none is; one number or "
           "a JSON object by log name, as `startingTimestamp`"),
    Option("endingPosition", _positions, LATEST, frozenset({READ}),
           "`latest` or a position, exclusive; with several logs, a JSON object by log "
           'name as for `startingPosition` (logs not named: latest)'),
    Option("includeHeaders", _boolean, False, _READS,
           "add the column `headers` (`array<struct<key: string, value: binary>>`, as "
           "Spark's Kafka source gives it: a record's headers in order, null for none)"),
    Option("minPartitions", _number(int), None, frozenset({READ}),
           "at least this many partitions: big segments are split into entry ranges"),
    Option("maxRecordsPerTrigger", _number(int), None, frozenset({STREAM_READ}),
           "at most this many records per micro-batch (with several logs, shared out "
           "among those with records, each taking at least one)"),
    Option("maxBytesPerTrigger", _number(int), None, frozenset({STREAM_READ}),
           "at most about this many bytes of values per micro-batch (shared out as "
           "`maxRecordsPerTrigger` is)"),
    Option("failOnDataLoss", _boolean, True, frozenset({STREAM_READ}),
           "fail the query when records it has not read were truncated away (false: "
           "skip ahead to the log's start with a warning)"),
    Option("consumerId", _text, None, frozenset({STREAM_READ}),
           "a name under which the query's committed position is kept in the log (in "
           "each log it reads); truncation never passes it"),
    Option("sinkId", _text, None, frozenset({STREAM_WRITE}),
           "required: the name under which the query's last committed batch id is kept "
           "in the log, so that a replayed micro-batch commits nothing twice"),
    Option("checkpointLocation", _text, None, frozenset({STREAM_WRITE}),
           "Spark's own option (where the query keeps its checkpoint), which Spark hands "
           "to the sink too; the source does not use it"),
    Option("orphanTimeoutSeconds", _number(float), 600.0, _WRITES,
           "a job whose tasks wrote nothing for this long and that never committed is "
           "an orphan: its ledgers are deleted by the next commit or abort on the log "
           "(or by pybk clean-orphans)"),
)}

#: The ServerSettings names that configure the clients' ZooKeeper sessions (those
#: :meth:`ZooKeeperSettings.of <pybk.meta.zookeeper.ZooKeeperSettings.of>` takes).
ZOOKEEPER_SETTINGS = ("zkTimeout", "zkOperationTimeoutMs", "zkRetryBackoffStartMs",
                      "zkRetryBackoffMaxMs", "zkEnableSecurity", "zkDigestAuthFile",
                      "zkWorldReadable")

_CLIENT_SETTINGS = {f.name for f in fields(ClientSettings)}
_LOG_SETTINGS = {f.name for f in fields(LogSettings)}
_CANONICAL = {name.lower(): name for name in (*OPTIONS, *_CLIENT_SETTINGS, *_LOG_SETTINGS,
                                              *ZOOKEEPER_SETTINGS)}


@dataclass(frozen=True)
class PybkOptions:
    """A data source's parsed options (plain data, pickled to the tasks)."""

    use: str
    uri: str | None
    path: str | None
    log: str
    #: The source's own options by name, defaults applied (:data:`OPTIONS`).
    values: dict[str, Any] = field(default_factory=dict)
    #: ClientSettings values given (text, as Spark passes them).
    client: dict[str, Any] = field(default_factory=dict)
    #: LogSettings values given, for writes.
    log_settings: dict[str, Any] = field(default_factory=dict)
    #: ZooKeeper settings given (:data:`ZOOKEEPER_SETTINGS`).
    zookeeper: dict[str, Any] = field(default_factory=dict)
    #: The logs a read names (option ``log``, split at commas; ``(log,)`` for a write);
    #: empty with ``log_pattern``.
    logs: tuple[str, ...] = ()
    #: The option ``logPattern``: the read's logs are those whose names match it (Python's
    #: ``re.fullmatch``), listed where the read is planned.
    log_pattern: str | None = None

    def get(self, name: str) -> Any:
        """The value of source option ``name`` (its default when not given)."""
        return self.values[name]

    @property
    def password(self) -> bytes:
        return self.values["password"].encode("utf-8")

    def client_settings(self) -> ClientSettings:
        return ClientSettings.from_mapping(self.client)

    def zookeeper_settings(self) -> "ZooKeeperSettings":
        """How the clients reach the cluster's ZooKeeper (its credentials included)."""
        from pybk.meta.zookeeper import ZooKeeperSettings
        return ZooKeeperSettings.of(ServerSettings.from_mapping(self.zookeeper))

    def log_settings_object(self) -> LogSettings:
        """The LogSettings of the ledgers a write makes: a WAL directory's log keeps one
        copy (E = Qw = Qa = 1) unless told otherwise."""
        from pybk.settings import WAL_LOG_DEFAULTS
        return LogSettings.from_mapping(self.log_settings,
                                        defaults=WAL_LOG_DEFAULTS if self.path else None)

    def position(self, name: str, log: str) -> str | int | None:
        """Option ``name`` (``startingPosition`` or ``endingPosition``; or
        ``startingTimestamp`` or ``endingTimestamp``, then an int) for log ``log``:
        ``earliest``, ``latest``, a position's text, or None when the option gives none
        to that log (not set, or a JSON object that does not name it)."""
        value = self.values[name]
        return value.get(log) if isinstance(value, dict) else value

    def reads_log(self, name: str) -> bool:
        """Whether log ``name`` is one the options name (in ``logs``, or matching
        ``log_pattern``)."""
        if self.log_pattern is None:
            return name in self.logs
        return re.fullmatch(self.log_pattern, name) is not None

    def for_log(self, name: str) -> "PybkOptions":
        """These options for the one log ``name`` of a read of several."""
        return dataclasses.replace(self, log=name, logs=(name,), log_pattern=None)

    def describe(self) -> str:
        """Where the log is, for messages: ``log 'x' of zk://...`` or ``of the WAL in
        /dir`` (``logs 'a', 'b' of``, ``logs matching 'p' of`` for a read of several)."""
        where = self.uri if self.uri else f"the WAL in {self.path}"
        if self.log_pattern is not None:
            return f"logs matching {self.log_pattern!r} of {where}"
        if len(self.logs) > 1:
            return f"logs {', '.join(map(repr, self.logs))} of {where}"
        return f"log {self.log!r} of {where}"


def parse(options: Mapping[str, Any], use: str) -> PybkOptions:
    """Parse a data source's options for ``use`` (one of :data:`USES`); raise
    InvalidConfiguration for anything it cannot use."""
    if use not in USES:
        raise ValueError(f"use {use!r} is none of {USES}")
    values: dict[str, Any] = {}
    client: dict[str, Any] = {}
    log_settings: dict[str, Any] = {}
    zookeeper: dict[str, Any] = {}
    for given, raw in options.items():
        name = _CANONICAL.get(given.lower())
        if name is None:
            known = [n for n, o in OPTIONS.items() if use in o.uses]
            known += sorted(_CLIENT_SETTINGS) + list(ZOOKEEPER_SETTINGS) + (
                sorted(_LOG_SETTINGS) if use in _WRITES else [])
            raise InvalidConfiguration(
                unknown_setting(given, known, f"the pybk data source ({_describe_use(use)})")
                .replace("unknown setting", "unknown option"))
        if name in OPTIONS:
            option = OPTIONS[name]
            if use not in option.uses:
                raise InvalidConfiguration(
                    f"option {name} does not apply to {_describe_use(use)}: it is an option "
                    f"of {', '.join(_describe_use(u) for u in USES if u in option.uses)}")
            values[name] = option.convert(name, raw)
        elif name in _CLIENT_SETTINGS:
            client[name] = raw
        elif name in ZOOKEEPER_SETTINGS:
            zookeeper[name] = raw
        elif use in _WRITES:
            log_settings[name] = raw
        else:
            raise InvalidConfiguration(f"option {name} is a setting of the ledgers a write "
                                       f"makes; it does not apply to {_describe_use(use)}")
    _check_one_per_bound(values)
    for name, option in OPTIONS.items():
        if use in option.uses:
            values.setdefault(name, option.default)
    uri, path = values.pop("metadataServiceUri"), values.pop("path")
    if (uri is None) == (path is None):
        raise InvalidConfiguration(
            "the pybk data source needs exactly one of the options metadataServiceUri (a "
            "cluster: zk://host:port/ledgers) and path (an embedded WAL directory, also "
            f"given by load(path) / save(path)); got {'both' if uri else 'neither'}")
    if uri is not None:
        parse_zookeeper_address(uri)  # InvalidConfiguration naming what is wrong
    given, pattern = values.pop("log"), values.pop("logPattern", None)
    if given is not None and pattern is not None:
        raise InvalidConfiguration(
            f"options log={given!r} and logPattern={pattern!r}: give one of them, log "
            "(names separated by commas) or logPattern (a regular expression)")
    name = given or (WAL_LOG_NAME if path is not None else None)
    if name is None and pattern is None:
        raise InvalidConfiguration(
            "option log (the log's name) is required with metadataServiceUri" + (
                " (or logPattern, a regular expression over log names)"
                if use in _READS else ""))
    if name is None:
        logs: tuple[str, ...] = ()
    else:
        logs = _log_names(name) if use in _READS else (name,)
    parsed = PybkOptions(use, uri, path, ",".join(logs), values, client, log_settings,
                         zookeeper, logs, pattern)
    if use in _READS:
        _check_positions(parsed)
    parsed.client_settings()  # bad values fail here, on the driver, not in every task
    parsed.zookeeper_settings()
    if use in _WRITES:
        parsed.log_settings_object()
    return parsed


def include_headers(options: Mapping[str, Any]) -> bool:
    """The option ``includeHeaders`` of options as Spark gives them, before they are
    parsed (the source's schema depends on it; :func:`parse` checks the rest)."""
    for given, raw in options.items():
        if given.lower() == "includeheaders":
            return _boolean("includeHeaders", raw)
    return False


def _describe_use(use: str) -> str:
    return {READ: "batch reads", STREAM_READ: "streaming reads", WRITE: "batch writes",
            STREAM_WRITE: "streaming writes"}[use]


def _log_names(text: str) -> tuple[str, ...]:
    """The names of a read's option ``log``: split at commas, spaces around them
    dropped; an empty or repeated name raises InvalidConfiguration."""
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise InvalidConfiguration(
            f"option log={text!r} holds an empty name: give log names separated by commas "
            "(a,b,c); to read a log whose name holds a comma, use logPattern (re.escape "
            "its name)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidConfiguration(f"option log={text!r} names {', '.join(twice)} twice: "
                                   "name each log once")
    return names


def _check_one_per_bound(given: Mapping[str, Any]) -> None:
    """The options ``given`` (parsed, before defaults) give each log's start, and each
    log's end, by a position or by a timestamp, not both."""
    for bound in ("starting", "ending"):
        position, timestamp = f"{bound}Position", f"{bound}Timestamp"
        by_position, by_time = given.get(position), given.get(timestamp)
        if by_position is None or by_time is None:
            continue
        # A JSON object gives a bound to the logs it names, a value alone to every log.
        named = [set(v) for v in (by_position, by_time) if isinstance(v, dict)]
        if not named:
            where = "every log"
        elif both := set.intersection(*named):
            where = ("log " if len(both) == 1 else "logs ") + ", ".join(map(repr, sorted(both)))
        else:
            continue
        raise InvalidConfiguration(
            f"options {position} and {timestamp} both give the "
            f"{'start' if bound == 'starting' else 'end'} of {where}: give one of them "
            "(or, by log, JSON objects that name different logs)")


def _check_positions(opts: PybkOptions) -> None:
    """A position (not earliest or latest) only for a read of one log; a JSON object of
    positions or timestamps only naming logs the read reads."""
    several = opts.log_pattern is not None or len(opts.logs) > 1
    for name in ("startingPosition", "endingPosition", "startingTimestamp",
                 "endingTimestamp"):
        value = opts.values.get(name)
        if isinstance(value, dict):
            others = [log for log in value if not opts.reads_log(log)]
            if others:
                raise InvalidConfiguration(
                    f"option {name} names {', '.join(map(repr, others))}, which this read "
                    f"does not read (it reads the {opts.describe()})")
        elif several and name.endswith("Position") and value not in (None, EARLIEST,
                                                                       LATEST):
            raise InvalidConfiguration(
                f"option {name}={value}: a position is one log's, and this read reads the "
                f"{opts.describe()}: give positions by log, "
                f'{{"<log>": "{value}", ...}}')


def with_values(opts: PybkOptions, **values: Any) -> PybkOptions:
    """``opts`` with some source options replaced (for code that plans on the driver)."""
    return dataclasses.replace(opts, values={**opts.values, **values})

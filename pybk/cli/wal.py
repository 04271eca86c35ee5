"""The WAL tools of ``pybk``: ``demote``, ``tail`` and ``consumers``.

``pybk demote DIR``
    Turn a promoted WAL directory whose cluster is gone back into an embedded WAL
    (:func:`pybk.log.wal.demote`), and say what was kept.
``pybk tail DIR [--from POS | --from-time MS] [--follow] [--poll-ms N] [--hex | --json]``
    A WAL's records, read from another process while its application runs
    (:func:`pybk.open_readonly`), or with no application running, from the first record
    or ``--from`` a position, or from the first record whose timestamp is at least
    ``--from-time`` (milliseconds since the epoch: :mod:`pybk.log.timeindex`).  One line
    per record, in position order: its position (``segment:entry:slot``), a tab, and its
    payload: as text if it is UTF-8 without control characters (tabs aside), else (and
    always with ``--hex``) as ``0x`` and hex digits.  With ``--json``, each line is one
    JSON object (:func:`record_json`: JSON Lines, since a followed tail has no end) with
    every field of the record: position, key, timestamp, headers and value.  Without
    ``--follow`` it prints the records visible now and exits; with it, it goes on
    printing records as they become visible (see :mod:`pybk.log.readonly` for how fresh)
    until interrupted (SIGINT or SIGTERM: exit status 0), looking for new ones at most
    ``--poll-ms`` apart.  A closed
    standard output (``pybk tail DIR | head``) ends it quietly, exit status 0.
``pybk consumers list|remove --zk ADDRESS|--dir DIR [--log NAME]``
    A log's consumers (:mod:`pybk.log.consumers`): one line per consumer (its id, tab,
    committed position, tab, last commit as ISO 8601 UTC), or one line per consumer
    removed.

Each exits with status 0, or 1 with one line ``pybk COMMAND: reason`` on standard error
(:func:`pybk.cli.output.fail`): a directory that holds no WAL, a bad or past-the-end
``--from``, a WAL or metadata that cannot be read, an unknown consumer.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import math
import os
import signal
import sys
import time
from typing import Any, TextIO

from pybk.cli import options
from pybk.cli.output import fail, say, stdout_gone
from pybk.errors import BookKeeperError
from pybk.log.record import Record


def add_commands(commands: Any) -> None:
    """Add the WAL tools to the ``pybk`` parser's ``commands``."""
    demote = commands.add_parser(
        "demote", help="make a promoted WAL directory whose cluster is gone an embedded "
                       "WAL again",
        description="Make a WAL directory promoted to a cluster (pybk.open(DIR, cluster=...)"
                    ") an embedded WAL again, for when that cluster is gone for good.  It "
                    "keeps every record written before the promotion that the cluster "
                    "did not truncate; records written while it was a member are not in "
                    "it.  The cluster is not contacted.")
    demote.add_argument("dir", metavar="DIR", help="the WAL directory")
    demote.set_defaults(run=run_demote)

    tail = commands.add_parser(
        "tail", help="print a WAL's records, also while its application runs",
        description="Print the records of the WAL in DIR, one a line (position, tab, "
                    "payload as text, or hex; with --json, a JSON object with every field), "
                    "read without disturbing the application "
                    "that has it open (pybk.open_readonly).  With --follow, go on printing "
                    "new ones until interrupted.")
    tail.add_argument("dir", metavar="DIR", help="the WAL directory")
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", metavar="POS",
                       help="start at this position (segment:entry:slot; default: the first "
                            "record)")
    start.add_argument("--from-time", type=int, metavar="MS",
                       help="start at the first record whose timestamp is at least MS "
                            "(milliseconds since the epoch; records' timestamps need not "
                            "be ordered)")
    tail.add_argument("--follow", "-f", action="store_true",
                      help="keep printing records as they are appended")
    tail.add_argument("--poll-ms", type=options.positive(float), default=10.0, metavar="N",
                      help="with --follow: look for new records at most N ms apart "
                           "(default 10)")
    shown = tail.add_mutually_exclusive_group()
    shown.add_argument("--hex", action="store_true", help="show every payload in hex")
    shown.add_argument("--json", action="store_true",
                       help="one JSON object a line per record, with its position, key, "
                            "timestamp (ms and ISO 8601 UTC), headers and value (UTF-8 "
                            "text, or base64: a field says which)")
    tail.set_defaults(run=lambda a: run(a.dir, a.start, a.follow, a.poll_ms, a.hex,
                                        from_time=a.from_time, as_json=a.json))

    consumers = commands.add_parser(
        "consumers", help="list or remove a log's consumers (they hold back truncation)",
        description="A log's consumers (readers that commit how far they read, such as "
                    "Spark queries with the consumerId option) hold back truncation: it "
                    "never passes the slowest one.  List them with their committed "
                    "positions, or remove one that stopped for good.")
    actions = consumers.add_subparsers(dest="action", required=True,
                                       parser_class=options.CommandParser)
    for action, text in (("list", "one line per consumer: id, position, last commit"),
                         ("remove", "unregister consumers")):
        sub = actions.add_parser(action, help=text)
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument("--zk", metavar="ADDRESS", help=options.CLUSTER_HELP)
        where.add_argument("--dir", help="an embedded WAL directory (not open elsewhere)")
        sub.add_argument("--log", default="wal",
                         help="the log's name (default wal, a WAL directory's log)")
        options.add_settings(sub)
        if action == "remove":
            sub.add_argument("consumer", nargs="+", metavar="CONSUMER_ID")
    consumers.set_defaults(run=run_consumers)


def run_demote(args: argparse.Namespace) -> int:
    """``pybk demote DIR``: print what was kept; 1 with the reason if it cannot be done."""
    from pybk.log.wal import demote

    try:
        done = demote(args.dir)
    except BookKeeperError as e:
        return fail("demote", e)
    say(f"{args.dir}: demoted from {done.cluster}; it is an embedded WAL again with "
        f"{done.segments_kept} segments ({done.segments_dropped} truncated while "
        "clustered were dropped).  Records written while it was a cluster member are "
        "not in it.")
    return 0


def show(data: bytes, as_hex: bool = False) -> str:
    """A payload as one line of text (see the module docstring)."""
    if not as_hex:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            if not any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in text):
                return text
    return "0x" + data.hex()


def record_json(record: Record) -> dict:
    """A record as ``pybk tail --json`` prints it: ``position`` (``segment:entry:slot``);
    ``timestamp`` (milliseconds since the epoch) and ``time`` (ISO 8601 UTC, to the
    millisecond), both null for a record an older pybk wrote (batch version 1);
    ``key`` (null for none) and ``value``, each with ``key_encoding`` /
    ``value_encoding``: ``"utf-8"`` if the field is the UTF-8 text given, ``"base64"``
    if it is the bytes in base64 (bytes that are not UTF-8); ``headers``: a list of
    ``{"name", "value", "value_encoding"}`` objects in the record's order."""
    key = _encoded(record.key) if record.key is not None else (None, None)
    value = _encoded(record.value)
    when = None
    if record.timestamp is not None:
        when = datetime.datetime.fromtimestamp(record.timestamp / 1000, datetime.UTC) \
            .isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"position": str(record.position), "timestamp": record.timestamp, "time": when,
            "key": key[0], "key_encoding": key[1], "value": value[0],
            "value_encoding": value[1],
            "headers": [dict(zip(("name", "value", "value_encoding"), (name, *_encoded(v))))
                        for name, v in record.headers]}


def _encoded(data: bytes) -> tuple[str, str]:
    """Bytes as JSON text: themselves if UTF-8, else base64; and which."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def run(directory: str, start: str | None, follow: bool, poll_ms: float, as_hex: bool,
        out: TextIO = sys.stdout, from_time: int | None = None,
        as_json: bool = False) -> int:
    """``pybk tail``: print the records; the exit status (see the module docstring)."""
    from pybk.log.readonly import open_readonly

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with open_readonly(directory) as wal:
            reader = wal.reader(start if from_time is None else wal.position_at(from_time))
            records = reader.tail_records(math.inf, poll_ms / 1000.0) if follow \
                else reader.records()
            for record in records:
                if as_json:
                    out.write(json.dumps(record_json(record), sort_keys=True) + "\n")
                else:
                    out.write(f"{record.position}\t{show(record.value, as_hex)}\n")
                out.flush()
    except BrokenPipeError:
        return stdout_gone(0)  # the reader of our output left: nothing more to say
    except (BookKeeperError, ValueError, OSError) as e:
        return fail("tail", e)
    except KeyboardInterrupt:
        return 0
    return 0


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run_consumers(args: argparse.Namespace) -> int:
    """``pybk consumers list|remove``: one line per consumer, or say what was removed; 1
    with the reason if the metadata cannot be reached or the consumer is unknown.  A
    cluster is reached with the ZooKeeper credentials of the settings."""
    from pybk.log import consumers
    from pybk.meta.address import open_metadata_store
    from pybk.meta.zookeeper import ZooKeeperSettings

    settings = options.settings_of(args)
    where = os.path.join(args.dir, "metadata") if args.dir else settings.metadataServiceUri
    try:
        # A listing leaves a cluster of pybk's former layout as it is
        with open_metadata_store(where, ZooKeeperSettings.of(settings),
                                 move_logs=args.action != "list") as store:
            if args.action == "list":
                for c in consumers.list_consumers(store, args.log):
                    updated = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                            time.gmtime(c.updated_unix_ms / 1000))
                    say(f"{c.consumer_id}\t{c.position}\t{updated}")
                return 0
            missing = [c for c in args.consumer if not consumers.remove(store, args.log, c)]
    except BookKeeperError as e:
        return fail("consumers", e)
    for consumer_id in args.consumer:
        if consumer_id not in missing:
            say(f"removed consumer {consumer_id} of log {args.log}")
    if missing:
        return fail("consumers", f"log {args.log} has no consumer {', '.join(missing)}")
    return 0

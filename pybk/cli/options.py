"""How the ``pybk`` commands take their options: the argument types, ``--log-level``
(before or after the command), and the settings of a command that reaches a cluster or
a bookie's directories (``--conf`` and ``--set``, then its own options such as ``--zk``:
:func:`bookie_settings`).  Each group of commands adds its commands with these
(:func:`pybk.cli.main.main` builds the parser from the groups)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, Callable, TypeVar

from pybk.cli.output import UsageError
from pybk.errors import InvalidConfiguration
from pybk.settings import ServerSettings

T = TypeVar("T", int, float)

#: What ``--log-level`` takes (in any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: ``--zk``'s help where it names the cluster a command works on.
CLUSTER_HELP = "the cluster, zk://host:port[,host:port...]/ledgers"
#: Options that name a setting (``pybk bookie``'s, the offline tools', ``--zk``), and
#: the setting.
_SETTING_OPTIONS = {"zk": "metadataServiceUri", "listen": "listenAddress",
                    "journal_dir": "journalDirectory", "bookie_id": "bookieId"}


class CommandParser(argparse.ArgumentParser):
    """A command's parser: it takes ``--log-level`` after the command too (a value given
    there wins over one given before it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        add_log_level(self, argparse.SUPPRESS)  # absent: the value before the command


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default,
                        metavar="LEVEL",
                        help=f"what to log: {', '.join(LOG_LEVELS)} (default WARNING)")


def add_settings(parser: argparse.ArgumentParser, conf_help: str | None = None) -> None:
    """``--conf`` and ``--set``: how every command that reaches a cluster or a bookie's
    directories takes its settings, read by :func:`bookie_settings`.  The cluster
    commands take the security settings this way (zmqCurveEnabled,
    zmqCurveSecretKeyFile, zkEnableSecurity, zkDigestAuthFile)."""
    parser.add_argument("--conf", help=conf_help or (
        "a bk_server.conf-style key=value settings file (metadataServiceUri, zkTimeout, "
        "the credentials: zmqCurveEnabled, zmqCurveSecretKeyFile, zkEnableSecurity, "
        "zkDigestAuthFile, ...)"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any ServerSettings name, e.g. --set zkTimeout=6000 (wins "
                             "over --conf and PYBK_<name> variables)")


def add_cluster(parser: argparse.ArgumentParser) -> None:
    """``--zk`` for a command that works on a cluster, with :func:`add_settings`."""
    parser.add_argument("--zk", metavar="ADDRESS", help=CLUSTER_HELP)
    add_settings(parser)


def bookie_settings(args: argparse.Namespace) -> ServerSettings:
    """The settings a command run with ``--conf`` and ``--set`` (:func:`add_settings`:
    every cluster command and the offline tools) runs with: the ``--conf`` file, then
    ``PYBK_<name>`` variables, then ``--set`` options, then the dedicated options
    (``--zk``, ``--journal-dir``...), later ones winning.  InvalidConfiguration if they
    are wrong."""
    known = {f.name for f in fields(ServerSettings)}
    overrides: dict[str, Any] = {}
    for assignment in args.set:
        key, sep, value = assignment.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise InvalidConfiguration(f"--set {assignment!r}: expected KEY=VALUE with a "
                                       "ServerSettings name as KEY")
        overrides[key] = value.strip()
    for option, key in _SETTING_OPTIONS.items():
        if getattr(args, option, None) is not None:  # updatecookie has no --listen
            overrides[key] = getattr(args, option)
    if getattr(args, "ledger_dir", None):  # autorecovery has no directories
        overrides["ledgerDirectories"] = ",".join(args.ledger_dir)
    return ServerSettings.load(args.conf, **overrides)


def settings_of(args: argparse.Namespace, needs_cluster: bool = False) -> ServerSettings:
    """:func:`bookie_settings`, or the :class:`UsageError` that says what is wrong with
    them, also when ``needs_cluster`` and they name none (``--zk`` may come from
    ``--conf``'s ``metadataServiceUri``, but not be missing)."""
    try:
        settings = bookie_settings(args)
        if needs_cluster and not settings.metadataServiceUri:
            raise InvalidConfiguration("no cluster given: pass --zk zk://host:port/ledgers, "
                                       "or --conf with metadataServiceUri")
    except InvalidConfiguration as e:
        raise UsageError(str(e)) from None
    return settings


def settings_args(args: argparse.Namespace) -> list[str]:
    """The ``--conf`` and ``--set`` options given, to pass on to child processes."""
    return ((["--conf", args.conf] if args.conf else [])
            + [arg for assignment in args.set for arg in ("--set", assignment)])


def whole_number(text: str) -> int:
    """An argument type: a whole number 0 or over (a ledger id, a number of seconds)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number 0 or over")
    return int(text)


def positive(kind: Callable[[str], T]) -> Callable[[str], T]:
    """An argument type: a ``kind`` number over 0."""
    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not over 0")
        return value

    return parse

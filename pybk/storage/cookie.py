"""Cookies: proof that a bookie's directories are the ones it was formatted with.

Formatting writes a cookie into the journal directory and every ledger directory, as
``<dir>/current/COOKIE``: a JSON object (UTF-8) ::

    {"format": 2,
     "instance_id": "<uuid4 hex>",
     "bookie_id": "<bookie id>" or null,
     "ledger_directory_count": <n>,
     "roles": ["journal" | "ledgers/<i>", ...],
     "journal_directory": "<absolute path>" or null,
     "ledger_directories": ["<absolute path>", ...] or null}

* ``instance_id``: drawn at format, the same in every directory of the bookie.
* ``bookie_id``: the id the bookie serves a cluster under, recorded when it first joins
  one (:mod:`pybk.cluster.node`; BookKeeper's cookie records it too): from then on these
  disks serve under that id only, because ledgers name it for the entries they hold.
* ``roles``: which of the bookie's directories this one is (the journal directory,
  ledger directory ``i`` of ``ledger_directory_count``; one directory may be both), so
  swapped directories are told apart even where paths are not recorded.
* ``journal_directory`` and ``ledger_directories``: the absolute paths the directories
  are *bound* to (a bookie server's cookie, as BookKeeper's), or both null for a bookie
  whose directories are one tree that may be copied, moved, restored or reached through
  a symlink (the embedded WAL's, :mod:`pybk.log.wal`): its directories are identified
  by the instance id and their roles alone.

At every start each directory's cookie must exist, carry the same instance id, the roles
and ledger directory count the settings give it, and, if bound, the settings' absolute
paths.  A missing cookie means a new or wiped disk; another instance id, a disk from
another bookie; other roles, swapped directories; other paths, a configuration that no
longer names the formatted directories.  Each stops the start with
:class:`pybk.errors.InvalidCookie` naming the directory, because serving from such a disk
would silently lose or mix entries.  Directories moved on purpose are accepted again by
:func:`rebind_directories` (``pybk updatecookie``,
:func:`pybk.cluster.cookies.update_cookies`).

Cookies are rewritten atomically one directory at a time, so a crash while the bookie id
is recorded, or while ``pybk updatecookie`` runs, can leave the directories disagreeing:
a null ``bookie_id`` next to a recorded one is accepted (the next start records it in
the rest), and paths that differ between directories are what ``pybk updatecookie``,
run again, repairs.

Format 1 (``{"format": 1, "instance_id", "journal_directory", "ledger_directories"}``,
the same in every directory) is still read: bound paths, no bookie id, roles unknown.
Rewriting a cookie writes format 2.

A bookie all of whose directories were wiped and formatted again looks new here; a
cluster tells it apart by its own copy of each bookie's cookie (:mod:`pybk.meta.cookies`,
checked by :class:`pybk.cluster.node.BookieNode`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import uuid
from typing import Iterator, overload

from pybk.errors import BookKeeperError, InvalidCookie
from pybk.fileio import lock_file, write_file_atomically
from pybk.settings import ServerSettings

COOKIE_FILE = "COOKIE"
CURRENT = "current"
FORMAT = 2
JOURNAL_ROLE = "journal"
#: The lock file the Bookie holds in its journal directory's ``current/`` while it runs
#: (:class:`pybk.storage.Bookie`); rewriting the cookies takes it too.
LOCK_FILE = "LOCK"

_KEYS_V1 = frozenset(("format", "instance_id", "journal_directory", "ledger_directories"))
_KEYS = frozenset(("format", "instance_id", "bookie_id", "ledger_directory_count", "roles",
                   "journal_directory", "ledger_directories"))


@dataclasses.dataclass(frozen=True)
class BookieCookie:
    """What the cookies of one bookie's directories say, the directory's roles aside."""

    instance_id: str
    #: The id the bookie serves a cluster under; None until it first joins one.
    bookie_id: str | None
    ledger_directory_count: int
    #: The paths the directories are bound to; both None: not bound (module docstring).
    journal_directory: str | None
    ledger_directories: tuple[str, ...] | None

    @property
    def bound(self) -> bool:
        """Whether the directories are bound to their paths."""
        return self.journal_directory is not None

    def describe_paths(self) -> str:
        if not self.bound:
            return "no paths (its directories are not bound to paths)"
        return (f"journal {self.journal_directory} and ledger directories "
                f"{list(self.ledger_directories or ())}")


def _directories(settings: ServerSettings) -> list[tuple[str, tuple[str, ...]]]:
    """``(directory as the settings name it, its roles)`` for each distinct directory,
    journal first (a directory named twice, e.g. the journal's also a ledger directory,
    holds one cookie with both roles)."""
    roles: dict[str, tuple[str, list[str]]] = {}
    named = [(settings.journalDirectory, JOURNAL_ROLE)] + [
        (d, f"ledgers/{i}") for i, d in enumerate(settings.ledgerDirectories)]
    for directory, role in named:
        roles.setdefault(os.path.abspath(directory), (directory, []))[1].append(role)
    return [(directory, tuple(found)) for directory, found in roles.values()]


def _bound_to(settings: ServerSettings, instance_id: str, bookie_id: str | None) -> BookieCookie:
    return BookieCookie(instance_id, bookie_id, len(settings.ledgerDirectories),
                        os.path.abspath(settings.journalDirectory),
                        tuple(os.path.abspath(d) for d in settings.ledgerDirectories))


def _cookie_path(directory: str) -> str:
    return os.path.join(directory, CURRENT, COOKIE_FILE)


def read_cookie(directory: str) -> tuple[BookieCookie, tuple[str, ...] | None] | None:
    """A directory's cookie and its roles (None: unknown, format 1), or None if it has
    none; an unreadable or malformed one raises InvalidCookie."""
    path = _cookie_path(directory)
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InvalidCookie(f"directory {directory}: cookie {path} is unreadable ({e})") from e
    try:
        return _parse(obj)
    except (TypeError, ValueError) as e:
        raise InvalidCookie(f"directory {directory}: cookie {path} is malformed ({e}); "
                            "it was not written by pybk, or was damaged") from e


def _parse(obj: object) -> tuple[BookieCookie, tuple[str, ...] | None]:
    if not isinstance(obj, dict) or obj.get("format") not in (1, FORMAT):
        raise ValueError(f"expected a JSON object with format 1 or {FORMAT}")
    if obj.keys() != (_KEYS_V1 if obj["format"] == 1 else _KEYS):
        raise ValueError(f"format {obj['format']} has exactly the keys "
                         f"{sorted(_KEYS_V1 if obj['format'] == 1 else _KEYS)}")
    journal, ledgers = obj["journal_directory"], obj["ledger_directories"]
    if journal is None and ledgers is None and obj["format"] == FORMAT:
        pass  # not bound to paths
    elif not isinstance(journal, str) or not isinstance(ledgers, list) or not ledgers or \
            not all(isinstance(d, str) for d in ledgers):
        raise ValueError("journal_directory must be a path and ledger_directories a list "
                         "of paths" + (", or both null" if obj["format"] == FORMAT else ""))
    else:
        ledgers = tuple(ledgers)
    if obj["format"] == 1:
        return BookieCookie(_text(obj["instance_id"]), None, len(ledgers), journal,
                            ledgers), None
    bookie_id, count, roles = obj["bookie_id"], obj["ledger_directory_count"], obj["roles"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1 or (
            ledgers is not None and len(ledgers) != count):
        raise ValueError(f"ledger_directory_count {count!r} is not the number of ledger "
                         "directories")
    if not isinstance(roles, list) or not roles or not all(isinstance(r, str)
                                                           for r in roles):
        raise ValueError("roles must be a non-empty list of strings")
    return BookieCookie(_text(obj["instance_id"]),
                        None if bookie_id is None else _text(bookie_id), count, journal,
                        ledgers), tuple(roles)


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty string")
    return value


def _write(directory: str, cookie: BookieCookie, roles: tuple[str, ...]) -> None:
    data = json.dumps({
        "format": FORMAT, "instance_id": cookie.instance_id, "bookie_id": cookie.bookie_id,
        "ledger_directory_count": cookie.ledger_directory_count, "roles": list(roles),
        "journal_directory": cookie.journal_directory,
        "ledger_directories": (None if cookie.ledger_directories is None
                               else list(cookie.ledger_directories)),
    }, sort_keys=True).encode()
    os.makedirs(os.path.join(directory, CURRENT), exist_ok=True)
    write_file_atomically(_cookie_path(directory), data)


def write_cookies(settings: ServerSettings, cookie: BookieCookie) -> None:
    """Write ``cookie`` into every directory of ``settings``, each with its roles.  The
    caller holds the directories (:func:`locked_directories`, or an open Bookie)."""
    for directory, roles in _directories(settings):
        _write(directory, cookie, roles)


def is_formatted(settings: ServerSettings) -> bool:
    """Whether any of the bookie's directories holds a cookie."""
    return any(read_cookie(d) is not None for d, _ in _directories(settings)
               if os.path.isdir(d))


def format_directories(settings: ServerSettings, force: bool = False,
                       bind_paths: bool = True) -> str:
    """Initialise a new bookie: create the directories and write a fresh cookie in each,
    bound to their paths unless ``bind_paths`` is false (module docstring).

    Refuses directories that already hold a bookie's files unless ``force`` is true, in
    which case their ``current/`` contents (journals, entry logs, index) are erased.
    Returns the new instance id.
    """
    for directory, _ in _directories(settings):
        current = os.path.join(directory, CURRENT)
        if os.path.isdir(current) and os.listdir(current):
            if not force:
                raise InvalidCookie(f"directory {directory} already holds a bookie's data; "
                                    "format with force=True to erase it")
            shutil.rmtree(current)
    instance_id = uuid.uuid4().hex
    cookie = _bound_to(settings, instance_id, None)
    if not bind_paths:
        cookie = dataclasses.replace(cookie, journal_directory=None,
                                     ledger_directories=None)
    write_cookies(settings, cookie)
    return instance_id


#: ``(directory, its roles by the settings, its cookie)`` of each of a bookie's directories.
_Found = list[tuple[str, tuple[str, ...], BookieCookie]]


def _read_all(settings: ServerSettings) -> _Found:
    """Every directory, its roles and its cookie, once checked that they are one
    bookie's directories as the settings name them: each exists and has a cookie of
    the journal directory's instance, with the roles and ledger directory count the
    settings give it, and no other bookie id.  InvalidCookie otherwise."""
    directories = _directories(settings)
    for directory, _ in directories:
        if not os.path.isdir(directory):
            raise InvalidCookie(f"directory {directory} does not exist (missing disk?); "
                                "format a new bookie if this is intended (pybk bookie "
                                "--format)")
    cookies = {d: read_cookie(d) for d, _ in directories}
    present = [c for c in cookies.values() if c is not None]
    if not present:
        raise InvalidCookie(f"directory {settings.journalDirectory} has no cookie: this bookie "
                            "was never formatted; format it first (pybk bookie --format, or "
                            "pybk.storage.format_bookie)")
    instance_id = (cookies[directories[0][0]] or present[0])[0].instance_id
    found: _Found = []
    for directory, roles in directories:
        read = cookies[directory]
        if read is None:
            raise InvalidCookie(f"directory {directory} has no cookie while the other "
                                "directories do: it is new or was wiped")
        cookie, cookie_roles = read
        if cookie.instance_id != instance_id:
            raise InvalidCookie(f"directory {directory} belongs to another bookie (instance "
                                f"{cookie.instance_id}, expected {instance_id}): "
                                "were disks swapped?")
        if cookie.ledger_directory_count != len(settings.ledgerDirectories):
            raise InvalidCookie(f"directory {directory}: the bookie was formatted with "
                                f"{cookie.ledger_directory_count} ledger directories, the "
                                f"settings name {len(settings.ledgerDirectories)}: name "
                                "every ledger directory it was formatted with, in the same "
                                "order")
        if cookie_roles is not None and cookie_roles != roles:
            raise InvalidCookie(f"directory {directory} is the bookie's "
                                f"{_describe(cookie_roles)}, but the settings name it as "
                                f"its {_describe(roles)}: were directories swapped? Name "
                                "them in the order they were formatted in")
        found.append((directory, roles, cookie))
    ids = {cookie.bookie_id for _, _, cookie in found if cookie.bookie_id is not None}
    if len(ids) > 1:
        raise InvalidCookie(f"the cookies of {settings.journalDirectory} and its ledger "
                            f"directories record different bookie ids ({sorted(ids)}): "
                            "they were not formatted together")
    return found


def _describe(roles: tuple[str, ...]) -> str:
    return " and ".join("journal directory" if role == JOURNAL_ROLE else
                        f"ledger directory {role.partition('/')[2]}" for role in roles)


def _at_settings(settings: ServerSettings, found: _Found) -> BookieCookie:
    """The cookie that ``found`` (checked by :func:`_read_all`) should all hold where
    the settings name them: the journal directory's, bound to the settings' paths if
    it was bound, with the bookie id recorded in any of them."""
    reference = found[0][2]
    bookie_id = next((c.bookie_id for _, _, c in found if c.bookie_id is not None), None)
    if not reference.bound:
        return dataclasses.replace(reference, bookie_id=bookie_id)
    return _bound_to(settings, reference.instance_id, bookie_id)


def _verified(settings: ServerSettings) -> tuple[BookieCookie, _Found]:
    found = _read_all(settings)
    wanted = _at_settings(settings, found)
    for directory, _, cookie in found:
        # A null bookie id next to a recorded one: a start that recorded it was cut short.
        if dataclasses.replace(cookie, bookie_id=wanted.bookie_id) != wanted:
            where = ("the settings name" if wanted.bound
                     else f"the cookie of {found[0][0]} records")
            advice = (" If the directories were moved on purpose, run pybk updatecookie "
                      "with the new settings: it checks that they are this bookie's and "
                      "rewrites their cookies (and the cluster's copy)" if wanted.bound
                      else "")
            raise InvalidCookie(f"directory {directory}: its cookie records "
                                f"{cookie.describe_paths()}, but {where} "
                                f"{wanted.describe_paths()}.{advice}")
    return wanted, found


def directory_cookie(settings: ServerSettings) -> BookieCookie:
    """Check every directory's cookie (module docstring); return what they say, with
    the bookie id recorded in any of them, or raise InvalidCookie."""
    return _verified(settings)[0]


def verify_cookies(settings: ServerSettings) -> str:
    """Check every directory's cookie; return the instance id or raise InvalidCookie."""
    return directory_cookie(settings).instance_id


@overload
def resolve_bookie_id(settings: ServerSettings, recorded: str | None, default: str) -> str: ...


@overload
def resolve_bookie_id(settings: ServerSettings, recorded: str | None,
                      default: None = None) -> str | None: ...


def resolve_bookie_id(settings: ServerSettings, recorded: str | None, default: str | None = None
                      ) -> str | None:
    """The id a bookie serves under: ``recorded`` in its cookies, else ``bookieId``,
    else ``default``.  InvalidCookie, naming the recorded id and what to do, if
    ``bookieId`` names another than the recorded one."""
    if recorded is None:
        return settings.bookieId or default
    if settings.bookieId and settings.bookieId != recorded:
        raise InvalidCookie(
            f"the bookie directories {', '.join(d for d, _ in _directories(settings))} "
            f"serve as bookie {recorded} (their cookies recorded that id when they first "
            f"joined a cluster), not as {settings.bookieId}: ledgers name {recorded} for "
            "the entries on them, and would lose those copies under another id. Start "
            f"them with bookieId={recorded} (pybk bookie --bookie-id {recorded}) or "
            "without bookieId, which uses the recorded id; a bookie under a new id needs "
            "new, formatted directories")
    return recorded


def record_bookie_id(settings: ServerSettings, bookie_id: str) -> BookieCookie:
    """Record ``bookie_id`` in the cookies of every directory that has none (the bookie's
    first start in a cluster); InvalidCookie if they record another.  The caller holds
    the directories (an open Bookie)."""
    cookie, found = _verified(settings)
    if cookie.bookie_id not in (None, bookie_id):
        raise InvalidCookie(f"the directories of {settings.journalDirectory} serve as "
                            f"bookie {cookie.bookie_id}, not {bookie_id}")
    recorded = dataclasses.replace(cookie, bookie_id=bookie_id)
    for directory, roles, former in found:
        if former.bookie_id is None:
            _write(directory, recorded, roles)
    return recorded


def rebind_directories(settings: ServerSettings) -> BookieCookie:
    """The cookie the directories of ``settings`` must hold once moved there on purpose
    (BookKeeper's ``updatecookie``): bound to the settings' paths (left unbound if they
    were), with the same instance id and bookie id.

    Checks first that they are one bookie's directories: every one has a cookie with
    the same instance id and no other bookie id, in the roles and number the settings
    give them; InvalidCookie otherwise.  Writes nothing: :func:`write_cookies` does."""
    return _at_settings(settings, _read_all(settings))


@contextlib.contextmanager
def locked_directories(settings: ServerSettings, shared: bool = False) -> Iterator[None]:
    """Hold the bookie's directory lock (the one a running Bookie holds) for the block;
    BookKeeperError at once if a bookie is using the directories.  ``shared``: only to
    read them (several readers may hold it at once; no bookie starts meanwhile)."""
    path = os.path.join(settings.journalDirectory, CURRENT, LOCK_FILE)
    if not os.path.isdir(os.path.dirname(path)):
        raise InvalidCookie(f"directory {settings.journalDirectory} holds no bookie "
                            f"({os.path.dirname(path)} does not exist)")
    try:
        fd = lock_file(path, shared)
    except BlockingIOError:
        raise BookKeeperError(f"{path} is locked: a bookie is using these directories; "
                              "stop it first") from None
    try:
        yield
    finally:
        os.close(fd)

"""Cookies: proof that a bookie's directories are the ones it was formatted with.

Formatting writes the same cookie into the journal directory and every ledger directory,
as ``<dir>/current/COOKIE``: a JSON object (UTF-8) ::

    {"format": 1, "instance_id": "<uuid4 hex>",
     "journal_directory": "<absolute path>", "ledger_directories": ["<absolute path>", ...]}

At every start each directory's cookie must exist and equal the expected one.  A missing
cookie means a new or wiped disk, a different one means a disk from another bookie or
swapped directories; both stop the start with :class:`pybk.errors.InvalidCookie` naming
the directory, because serving from such a disk would silently lose or mix entries.

A bookie all of whose directories were wiped and formatted again looks new here; a
cluster tells it apart by its own copy of each bookie's cookie (:mod:`pybk.meta.cookies`,
checked by :class:`pybk.cluster.node.BookieNode`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

from pybk.errors import InvalidCookie
from pybk.storage.fileio import write_file_atomically

COOKIE_FILE = "COOKIE"
CURRENT = "current"
FORMAT = 1


def _dirs(settings) -> list[str]:
    return [settings.journalDirectory, *settings.ledgerDirectories]


def _cookie_path(directory: str) -> str:
    return os.path.join(directory, CURRENT, COOKIE_FILE)


def expected_cookie(settings, instance_id: str) -> dict:
    return {
        "format": FORMAT,
        "instance_id": instance_id,
        "journal_directory": os.path.abspath(settings.journalDirectory),
        "ledger_directories": [os.path.abspath(d) for d in settings.ledgerDirectories],
    }


def read_cookie(directory: str) -> dict | None:
    """A directory's cookie, or None if it has none; an unreadable one is an error."""
    path = _cookie_path(directory)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InvalidCookie(f"directory {directory}: cookie {path} is unreadable ({e})") from e


def is_formatted(settings) -> bool:
    """Whether any of the bookie's directories holds a cookie."""
    return any(read_cookie(d) is not None for d in _dirs(settings) if os.path.isdir(d))


def format_directories(settings, force: bool = False) -> str:
    """Initialise a new bookie: create the directories and write a fresh cookie in each.

    Refuses directories that already hold a bookie's files unless ``force`` is true, in
    which case their ``current/`` contents (journals, entry logs, index) are erased.
    Returns the new instance id.
    """
    for directory in _dirs(settings):
        current = os.path.join(directory, CURRENT)
        if os.path.isdir(current) and os.listdir(current):
            if not force:
                raise InvalidCookie(f"directory {directory} already holds a bookie's data; "
                                    "format with force=True to erase it")
            shutil.rmtree(current)
    instance_id = uuid.uuid4().hex
    data = json.dumps(expected_cookie(settings, instance_id), sort_keys=True).encode()
    for directory in _dirs(settings):
        os.makedirs(os.path.join(directory, CURRENT), exist_ok=True)
        write_file_atomically(_cookie_path(directory), data)
    return instance_id


def verify_cookies(settings) -> str:
    """Check every directory's cookie; return the instance id or raise InvalidCookie."""
    for directory in _dirs(settings):
        if not os.path.isdir(directory):
            raise InvalidCookie(f"directory {directory} does not exist (missing disk?); "
                                "format a new bookie if this is intended (pybk bookie "
                                "--format)")
    cookies = {d: read_cookie(d) for d in _dirs(settings)}
    present = {d: c for d, c in cookies.items() if c is not None}
    if not present:
        raise InvalidCookie(f"directory {settings.journalDirectory} has no cookie: this bookie "
                            "was never formatted; format it first (pybk bookie --format, or "
                            "pybk.storage.format_bookie)")
    reference = cookies[settings.journalDirectory] or next(iter(present.values()))
    instance_id = reference.get("instance_id", "")
    expected = expected_cookie(settings, instance_id)
    for directory, cookie in cookies.items():
        if cookie is None:
            raise InvalidCookie(f"directory {directory} has no cookie while the other "
                                "directories do: it is new or was wiped")
        if cookie.get("instance_id") != instance_id:
            raise InvalidCookie(f"directory {directory} belongs to another bookie (instance "
                                f"{cookie.get('instance_id')}, expected {instance_id}): "
                                "were disks swapped?")
        if cookie != expected:
            raise InvalidCookie(f"directory {directory}: the cookie records journal "
                                f"{cookie.get('journal_directory')} and ledger directories "
                                f"{cookie.get('ledger_directories')}, but the settings name "
                                f"{expected['journal_directory']} and "
                                f"{expected['ledger_directories']}")
    return instance_id

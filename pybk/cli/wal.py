"""``pybk tail DIR [--from POS] [--follow] [--poll-ms N] [--hex]``: a WAL's records, read
from another process while its application runs (:func:`pybk.open_readonly`), or with
no application running.

One line per record, in position order: its position (``segment:entry:slot``), a tab,
and its payload: as text if it is UTF-8 without control characters (tabs aside), else
(and always with ``--hex``) as ``0x`` and hex digits.  Without ``--follow`` it prints the
records visible now and exits; with it, it goes on printing records as they become
visible (see :mod:`pybk.log.readonly` for how fresh) until interrupted (SIGINT or
SIGTERM: exit status 0), looking for new ones at most ``--poll-ms`` apart.

Exit status 0; 1 with one line ``pybk tail: reason`` on standard error for a directory
that holds no WAL, a bad or past-the-end ``--from``, or a WAL that cannot be read.
A closed standard output (``pybk tail DIR | head``) ends it quietly.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from typing import TextIO

from pybk.errors import BookKeeperError
from pybk.log.readonly import open_readonly


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


def run(directory: str, start: str | None, follow: bool, poll_ms: float, as_hex: bool,
        out: TextIO = sys.stdout) -> int:
    """Print the records; the exit status (see the module docstring)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with open_readonly(directory) as wal:
            reader = wal.reader(start)
            records = reader.tail(math.inf, poll_ms / 1000.0) if follow else reader.read()
            for position, data in records:
                out.write(f"{position}\t{show(data, as_hex)}\n")
                out.flush()
    except (BookKeeperError, ValueError, OSError) as e:
        if isinstance(e, BrokenPipeError):
            # The reader of our output left: nothing more to say, to anyone.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        print(f"pybk tail: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt

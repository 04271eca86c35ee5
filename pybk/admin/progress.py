"""Progress of a long admin command (``pybk recover``, ``pybk decommission``), on
standard error so that standard output keeps only the command's answer (one JSON
document with ``--json``).

On a terminal it is a `tqdm <https://tqdm.github.io>`_ bar that redraws itself: bytes
done with their rate and the time left when the total is known (an estimate from the
ledgers' lengths), else ledgers done; and the ledgers done out of how many.  Elsewhere
(a log file, a pipe) it is plain lines, one per ledger done and at most one every
:data:`NOTE_INTERVAL_S` about waiting, each starting ``pybk COMMAND:``::

    pybk recover: ledger 7 replicated (12 entries, 1.9 KiB); 2/5 ledgers, 3.8 KiB of
    about 9.5 KiB, 1.2 KiB/s, about 5 s left
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

#: Seconds between two lines about waiting (:meth:`Progress.note`) off a terminal.
NOTE_INTERVAL_S = 5.0


class _Bar(tqdm):
    """tqdm without its monitor thread (which only tunes how often a fast loop redraws:
    ours advances once per ledger), so that a command leaves no thread behind."""

    monitor_interval = 0


class Progress:
    """``ledgers`` to do, of about ``total_bytes`` (None: unknown), for ``command``,
    shown on ``stream`` (standard error by default).  :meth:`close` ends it."""

    def __init__(self, command: str, ledgers: int, total_bytes: int | None,
                 stream: TextIO | None = None) -> None:
        self.command = command
        self.ledgers = ledgers
        self.total_bytes = total_bytes
        self.ledgers_done = 0
        self.bytes_done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._started = time.monotonic()
        self._last_note = -NOTE_INTERVAL_S
        self._bar: _Bar | None = None
        if self._stream.isatty():
            by_bytes = total_bytes is not None
            self._bar = _Bar(total=total_bytes if by_bytes else ledgers, file=self._stream,
                             desc=command, unit="B" if by_bytes else " ledgers",
                             unit_scale=by_bytes, unit_divisor=1024, dynamic_ncols=True)
            self._bar.set_postfix_str(self._ledgers_text(), refresh=False)

    def done(self, ledger_id: int, outcome: str, entries: int = 0, size: int = 0) -> None:
        """One ledger is done: ``outcome`` says how, with ``entries`` of ``size`` bytes
        copied."""
        self.ledgers_done += 1
        self.bytes_done += size
        if self._bar is not None:
            self._bar.set_postfix_str(self._ledgers_text(), refresh=False)
            self._bar.update(size if self.total_bytes is not None else 1)
            return
        what = f"ledger {ledger_id} {outcome}"
        if entries:
            what += f" ({entries} entries, {_size(size)})"
        self._line(f"{what}; {self._summary()}")

    def note(self, text: str) -> None:
        """Something about the wait (the ledgers still to do, say): the bar's postfix on
        a terminal, else a line at most every :data:`NOTE_INTERVAL_S`."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self._ledgers_text()}; {text}")
            return
        now = time.monotonic()
        if now - self._last_note >= NOTE_INTERVAL_S:
            self._last_note = now
            self._line(f"{text}; {self._summary()}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _ledgers_text(self) -> str:
        return f"{self.ledgers_done}/{self.ledgers} ledgers"

    def _summary(self) -> str:
        parts = [self._ledgers_text()]
        elapsed_s = max(time.monotonic() - self._started, 1e-3)
        if self.bytes_done or self.total_bytes:
            rate = self.bytes_done / elapsed_s
            of = "" if self.total_bytes is None else f" of about {_size(self.total_bytes)}"
            parts.append(f"{_size(self.bytes_done)}{of}, {_size(rate)}/s")
            if self.total_bytes is not None and rate > 0:
                left_s = max(self.total_bytes - self.bytes_done, 0) / rate
                parts.append(f"about {left_s:.0f} s left")
        elif self.ledgers_done:
            left_s = (self.ledgers - self.ledgers_done) * elapsed_s / self.ledgers_done
            parts.append(f"about {left_s:.0f} s left")
        return ", ".join(parts)

    def _line(self, text: str) -> None:
        print(f"pybk {self.command}: {text}", file=self._stream, flush=True)


def _size(count: float) -> str:
    """Bytes for people: ``512 B``, ``1.9 KiB``, ``3.0 MiB``..."""
    if count < 1024:
        return f"{count:.0f} B"
    for unit in ("KiB", "MiB"):
        count /= 1024
        if count < 1024:
            return f"{count:.1f} {unit}"
    return f"{count / 1024:.1f} GiB"

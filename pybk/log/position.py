"""Positions: where a record sits in a log.

A position is ``(segment, entry, slot)``:

``segment``
    The sequence number of the log segment (one ledger) holding the record.  A log
    numbers its segments 0, 1, 2, ... in the order they were added and never reuses a
    number, also after truncation removed earlier segments.
``entry``
    The entry id of the record's batch in that segment's ledger.
``slot``
    The record's index in its batch (records are batched into entries).

Positions compare as tuples, and that order is the log's order: a record appended
after another (once the other's append returned) has a greater position.  A position
never changes once its append was acknowledged.  The text form is ``"segment:entry:slot"``
(``str(position)``; :meth:`Position.parse` reads it back).
"""

from __future__ import annotations

from functools import partial
from itertools import repeat
from typing import NamedTuple, Sequence


class Position(NamedTuple):
    """A record's place in a log (see the module docstring)."""

    segment: int
    entry: int
    slot: int

    def __str__(self) -> str:
        return f"{self.segment}:{self.entry}:{self.slot}"

    @classmethod
    def parse(cls, text: str) -> "Position":
        """The position ``str(position)`` wrote; ValueError for anything else."""
        parts = text.split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{text!r} is not a log position (segment:entry:slot)")
        return cls(*(int(p) for p in parts))

    @classmethod
    def of(cls, value: "Position | str | Sequence[int]", what: str) -> "Position":
        """``value`` as a position: a Position, its text (``"segment:entry:slot"``) or
        three non-negative integers.  ``what`` names the argument in the error:
        TypeError for another type, ValueError for text or numbers that are no position."""
        if isinstance(value, str):
            try:
                return cls.parse(value)
            except ValueError as e:
                raise ValueError(f"{what}: {e}") from None
        if not isinstance(value, Sequence) or len(value) != 3:
            raise TypeError(f"{what} must be a Position or its text 'segment:entry:slot', "
                            f"not {value!r}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                   for n in value):
            raise ValueError(f"{what}: {tuple(value)!r} is not a log position "
                             "(segment:entry:slot, integers of 0 or more)")
        return cls(*value)


_new_position = partial(tuple.__new__, Position)  # what Position._make does, without checks


def positions(segment: int, entry: int, count: int) -> list[Position]:
    """The positions of the ``count`` records of entry ``entry`` of segment ``segment``,
    in slot order (built in C: a batch's records are acknowledged together, and a
    Python-level constructor per record would cost more than the rest of completing
    it)."""
    return list(map(_new_position, zip(repeat(segment, count), repeat(entry, count),
                                       range(count))))


#: Before every record of every log.
START = Position(0, 0, 0)

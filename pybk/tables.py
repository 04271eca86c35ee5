"""Aligned text tables: how the ``pybk`` commands answer people (the admin shell's and the
offline tools'; scripts use their ``--json``)."""

from __future__ import annotations

from typing import Any, Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows under a header, columns left-aligned and two spaces apart; ``(none)`` under
    the header when there are no rows."""
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in row]
                                          for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return lines if rows else [lines[0], "(none)"]

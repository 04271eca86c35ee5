"""Aligned text tables: how the ``pybk`` commands answer people (the admin shell's and the
offline tools'; scripts use their ``--json``)."""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, Sequence

#: Rows a streamed table (:func:`stream_table`) reads before its header, to size its
#: columns.
STREAM_SAMPLE_ROWS = 100


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows under a header, columns left-aligned and two spaces apart; ``(none)`` under
    the header when there are no rows."""
    cells = [[str(c) for c in header]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [_line(row, widths) for row in cells]
    return lines if rows else [lines[0], "(none)"]


def stream_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                 sample: int = STREAM_SAMPLE_ROWS) -> Iterator[str]:
    """:func:`table`'s lines, made as the rows come, so that a long listing shows its
    first lines before its last row is read: the columns are as wide as the header and
    the first ``sample`` rows need (a wider cell later pushes the rest of its row
    right)."""
    rows = iter(rows)
    first = list(itertools.islice(rows, sample))
    yield from table(header, first)
    widths = [max([len(str(header[i]))] + [len(_cell(row[i])) for row in first])
              for i in range(len(header))]
    for row in rows:
        yield _line([_cell(c) for c in row], widths)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

"""How every ``pybk`` command answers: tables or one JSON document on standard output,
and failures as one line on standard error.

- People get aligned text tables (:func:`table`; :func:`stream_table` for a listing
  printed as it is read) or a few lines; scripts get, with ``--json``, exactly one JSON
  document on standard output (:func:`answer`; for a streamed listing, one array with
  an item per line: :func:`run_streamed`).  Every line is flushed as it is printed.
- A command that fails prints one line ``pybk COMMAND: reason`` on standard error
  (:func:`fail`) and exits with status 1, never with a traceback; a usage error (bad
  options or settings) is argparse's, exit status 2 (:class:`UsageError`).
- :func:`run` puts these together for a command that works, then answers: most of the
  admin shell's commands, the recovery commands and the offline tools.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any, Callable, ContextManager, Iterable, Iterator, Sequence

from pybk.errors import BookKeeperError

#: Rows a streamed table (:func:`stream_table`) reads before its header, to size its
#: columns.
STREAM_SAMPLE_ROWS = 100
#: What a command's work may raise that is the command's failure, said in one line:
#: pybk's errors and the operating system's (a missing file, a refused permission).
FAILURES: tuple[type[BaseException], ...] = (BookKeeperError, OSError)

#: A command's table for people: its result in, lines out.
Show = Callable[[Any], Iterable[str]]


class UsageError(Exception):
    """The command's options or settings are wrong: :func:`pybk.cli.main.main` reports it
    as argparse does (``pybk: error: ...``, exit status 2)."""


def say(line: str) -> None:
    """A line for people on standard output, flushed (a pipe or log sees it now)."""
    print(line, flush=True)


def fail(command: str, error: BaseException | str) -> int:
    """Say why ``pybk COMMAND`` failed, in one line on standard error; the exit status,
    1.  An operating system error names its file and says what is wrong with it."""
    if isinstance(error, OSError) and error.filename:
        error = f"{error.filename}: {error.strerror}"
    print(f"pybk {command}: {error}", file=sys.stderr, flush=True)
    return 1


def answer(result: Any, show: Show, as_json: bool) -> None:
    """Print a command's result on standard output: ``show(result)``'s lines, or with
    ``as_json`` the result as one JSON document (keys sorted)."""
    if as_json:
        say(json.dumps(result, sort_keys=True))
    else:
        for line in show(result):
            say(line)


def run(command: str, work: Callable[[], Any], show: Show, as_json: bool,
        status: Callable[[Any], int] | None = None,
        failures: tuple[type[BaseException], ...] = FAILURES) -> int:
    """Do ``work()`` and :func:`answer` its result; the exit status: ``status(result)``
    (0 by default; it may :func:`fail` with a reason after the answer), or 1 with the
    reason on standard error if the work raised one of ``failures``."""
    try:
        result = work()
    except failures as e:
        return fail(command, e)
    answer(result, show, as_json)
    return 0 if status is None else status(result)


def run_streamed(command: str, listing: Callable[[], ContextManager[Iterator[Any]]],
                 show: Callable[[Iterator[Any]], Iterator[str]], as_json: bool) -> int:
    """:func:`run` for a listing that may be long (``listledgers``): ``listing()`` opens
    what the items are read from and yields them; each is printed as soon as it comes,
    while that stays open, so the first lines come before the listing ends and nothing
    holds the whole of it.  With ``as_json`` the output is still one JSON document, an
    array with one item per line (``[`` comes with the first one, and ``]`` on a line of
    its own).  A failure mid-way prints its reason on standard error after the lines
    already printed (exit 1).  A reader that stops reading (``| head``) ends the listing
    quietly, with exit status 1 (what it printed was not the whole listing)."""
    try:
        with listing() as items:
            for line in (_json_lines(items) if as_json else show(items)):
                say(line)
    except FAILURES as e:
        if isinstance(e, BrokenPipeError):
            return stdout_gone(1)
        return fail(command, e)
    return 0


def stdout_gone(status: int) -> int:
    """The reader of standard output went away (``| head``): send what Python still
    flushes at exit to /dev/null, so that it does not complain of the broken pipe; the
    exit status ``status``."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status


def _json_lines(items: Iterator[Any]) -> Iterator[str]:
    """One JSON array, an item per line: ``[first``, ``,second``, ..., ``]`` (``[]`` if
    empty)."""
    opening = "["
    for item in items:
        yield opening + json.dumps(item, sort_keys=True)
        opening = ","
    yield "[]" if opening == "[" else "]"


# -- tables -----------------------------------------------------------------------------------

def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows under a header, columns left-aligned and two spaces apart, ``-`` for None;
    ``(none)`` under the header when there are no rows."""
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

"""Protocol Buffers' text format, for the few flat messages BookKeeper keeps in ZooKeeper.

BookKeeper writes some records (an under-replicated ledger's mark, a replication lock, an
auditor vote, the under-replication layout) as ``message.toString()``: one field per
line, ``name: value``, where a string value is double-quoted with C escapes and an
integer is written in decimal; a repeated field repeats its line::

    replica: "10.0.0.5:3181"
    replica: "10.0.0.6:3181"
    ctime: 1700000000000

:func:`encode` writes that form byte for byte (what BookKeeper's readers merge), and
:func:`decode` reads it back for flat messages of string and integer fields (no nested
messages, which none of these records have).  A line that is not ``name: value``, a
field the caller did not name, a value of the wrong type or a non-repeated field given
twice raises :class:`~pybk.errors.MalformedMetadata`.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from pybk.errors import MalformedMetadata

Value = str | int

_LINE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.)*")\s*\Z')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}
_ESCAPE = re.compile(r'\\(x[0-9A-Fa-f]{1,2}|[0-7]{1,3}|.)')


def encode(fields: Iterable[tuple[str, Value]]) -> bytes:
    """The text form of ``fields`` (name, value) in order, a line each."""
    lines = []
    for name, value in fields:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(f"field {name}: {value!r} is neither a string nor an integer")
        lines.append(f"{name}: {_quote(value) if isinstance(value, str) else value}\n")
    return "".join(lines).encode("utf-8")


def decode(data: bytes, kinds: Mapping[str, type], repeated: Iterable[str] = (),
           what: str = "record") -> dict[str, list[Value]]:
    """The fields of a text-format message: ``{name: [values]}`` for the names in
    ``kinds`` (each ``str`` or ``int``) found in ``data``.  ``what`` names the record in
    errors.  Raises MalformedMetadata (see the module docstring)."""
    repeated = set(repeated)
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMetadata(f"{what} is not UTF-8 text") from None
    found: dict[str, list[Value]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match is None:
            raise MalformedMetadata(f"{what}, line {number}: {line!r} is not 'name: value'")
        name, raw = match.groups()
        kind = kinds.get(name)
        if kind is None:
            raise MalformedMetadata(f"{what}, line {number}: unknown field {name!r} (known: "
                                    f"{', '.join(sorted(kinds))})")
        is_string = raw.startswith('"')
        if is_string != (kind is str):
            raise MalformedMetadata(f"{what}, line {number}: field {name} must be "
                                    f"{'a string' if kind is str else 'an integer'}")
        values = found.setdefault(name, [])
        if values and name not in repeated:
            raise MalformedMetadata(f"{what}, line {number}: field {name} given twice")
        values.append(_unquote(raw[1:-1]) if is_string else int(raw))
    return found


def _quote(text: str) -> str:
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")  # protobuf escapes other bytes in octal
    return '"' + "".join(out) + '"'


def _unquote(body: str) -> str:
    raw = bytearray()
    position = 0
    for match in _ESCAPE.finditer(body):
        raw += body[position:match.start()].encode("utf-8")
        code = match.group(1)
        if code[0] == "x" and len(code) > 1:
            raw.append(int(code[1:], 16))
        elif code[0] in "01234567":
            raw.append(int(code, 8) & 0xFF)
        elif code in _ESCAPES:
            raw += _ESCAPES[code].encode()
        else:
            raise MalformedMetadata(f"unknown escape \\{code} in {body!r}")
        position = match.end()
    raw += body[position:].encode("utf-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMetadata(f"string {body!r} is not UTF-8 once unescaped") from None

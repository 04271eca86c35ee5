"""A small key-value store made crash-safe by pybk's embedded WAL.

Every change is appended to the WAL before it is applied in memory; on start the store
replays the WAL.  ``snapshot()`` writes the whole map as one record and truncates the
WAL before it, so replay stays short.

    python examples/kv_store.py DIR set KEY VALUE
    python examples/kv_store.py DIR delete KEY
    python examples/kv_store.py DIR get KEY
    python examples/kv_store.py DIR dump
    python examples/kv_store.py DIR snapshot
"""

from __future__ import annotations

import json
import sys

import pybk


class KVStore:
    """A dict whose changes survive crashes: each is durable before it is applied."""

    def __init__(self, directory: str) -> None:
        self._wal = pybk.open(directory)
        self._data: dict[str, str] = {}
        for _position, record in self._wal.read():  # replay: snapshots, then changes
            self._apply(json.loads(record))

    def _apply(self, change: dict) -> None:
        if change["op"] == "snapshot":
            self._data = dict(change["data"])
        elif change["op"] == "set":
            self._data[change["key"]] = change["value"]
        elif change["op"] == "delete":
            self._data.pop(change["key"], None)

    def _log(self, change: dict) -> None:
        self._wal.append(json.dumps(change).encode())  # durable when it returns
        self._apply(change)

    def set(self, key: str, value: str) -> None:
        self._log({"op": "set", "key": key, "value": value})

    def delete(self, key: str) -> None:
        self._log({"op": "delete", "key": key})

    def get(self, key: str) -> str | None:
        return self._data.get(key)

    def items(self) -> list[tuple[str, str]]:
        return sorted(self._data.items())

    def snapshot(self) -> None:
        """Write the whole map as one record and drop everything before it."""
        position = self._wal.append(json.dumps({"op": "snapshot",
                                                "data": self._data}).encode())
        self._wal.truncate(before=position)

    def close(self) -> None:
        self._wal.close()


#: The commands, each with the arguments it takes.
COMMANDS = {"set": ("KEY", "VALUE"), "delete": ("KEY",), "get": ("KEY",), "dump": (),
            "snapshot": ()}


def usage() -> str:
    lines = [f"python examples/kv_store.py DIR {' '.join((name, *args))}"
             for name, args in COMMANDS.items()]
    return "usage: " + "\n       ".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in COMMANDS or len(argv) != 2 + len(COMMANDS[argv[1]]):
        print(usage(), file=sys.stderr)
        return 2
    directory, command, *args = argv
    store = KVStore(directory)
    try:
        if command == "set":
            store.set(args[0], args[1])
        elif command == "delete":
            store.delete(args[0])
        elif command == "get":
            value = store.get(args[0])
            print(value if value is not None else "(not set)")
        elif command == "dump":
            for key, value in store.items():
                print(f"{key}={value}")
        else:
            store.snapshot()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

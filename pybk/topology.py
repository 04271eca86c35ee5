"""Network locations of bookies: BookKeeper's ``/region/rack`` form, and the mapping script.

Form
    A location is ``/<region>/<rack>`` (BookKeeper's), or ``/<rack>``, which is in the
    default region.  Names are non-empty and hold no ``/``, spaces or NUL.  The rack is
    the whole location: ``/east/r1`` and ``/west/r1`` are two racks.  A bookie that
    registered none (an older bookie, or one not configured) is in
    :data:`DEFAULT_LOCATION`, BookKeeper's default rack.

Mapping script (BookKeeper's ``networkTopologyScriptFileName``)
    Run as ``<script> <address> [<address> ...]`` with no shell; it prints one location
    per address, one a line, in order.  It has ``timeout_s`` to finish; a script that
    cannot run, fails, times out or prints too few or malformed lines maps every address
    to :data:`DEFAULT_LOCATION`, with a warning saying why (a placement with too little
    to go on beats a bookie that does not start).
"""

from __future__ import annotations

import logging
import subprocess
from typing import Sequence

log = logging.getLogger(__name__)

DEFAULT_REGION = "/default-region"
#: BookKeeper's default rack: where a bookie without a known location is.
DEFAULT_LOCATION = f"{DEFAULT_REGION}/default-rack"
#: Most bytes of a mapping script's output read (a location is a short line).
SCRIPT_OUTPUT_MAX_BYTES = 64 * 1024


def check_location(location: str) -> str:
    """``location`` if it is ``/<region>/<rack>`` or ``/<rack>``, else ValueError saying
    what the form is."""
    names = location.split("/")[1:] if location.startswith("/") else []
    if not 1 <= len(names) <= 2 or any(
            not name or name in (".", "..") or any(c.isspace() or c == "\0" for c in name)
            for name in names):
        raise ValueError(f"{location!r} is not a network location: it must be "
                         "/<region>/<rack> or /<rack> (names without '/', spaces or NUL)")
    return location


def region_of(location: str) -> str:
    """The region of a (checked) location: ``/east`` for ``/east/r1``; a ``/<rack>``
    location is in :data:`DEFAULT_REGION`."""
    head, _, rest = location[1:].partition("/")
    return f"/{head}" if rest else DEFAULT_REGION


def run_mapping_script(script: str, addresses: Sequence[str], timeout_s: float) -> list[str]:
    """The locations ``script`` maps ``addresses`` to (see the module docstring); every
    one :data:`DEFAULT_LOCATION` if the script fails in any way."""
    def fallback(why: str) -> list[str]:
        log.warning("network topology script %s %s: %s; using %s", script,
                    " ".join(addresses), why, DEFAULT_LOCATION)
        return [DEFAULT_LOCATION] * len(addresses)

    try:
        done = subprocess.run([script, *addresses], capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:  # run() kills and reaps it
        return fallback(f"did not finish within {timeout_s:g} s")
    except OSError as e:
        return fallback(f"could not run ({e.strerror or e})")
    if done.returncode != 0:
        stderr = done.stderr[:200].decode("utf-8", "replace").strip()
        return fallback(f"exited with status {done.returncode}"
                        + (f" ({stderr})" if stderr else ""))
    lines = done.stdout[:SCRIPT_OUTPUT_MAX_BYTES].decode("utf-8", "replace").split()
    if len(lines) < len(addresses):
        return fallback(f"printed {len(lines)} locations for {len(addresses)} addresses")
    try:
        return [check_location(line) for line in lines[:len(addresses)]]
    except ValueError as e:
        return fallback(str(e))

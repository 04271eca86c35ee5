"""``zk://`` addresses of ZooKeeper clusters: ``zk://host:port[,host:port...]/root``.

Hosts are names, IPv4 addresses or bracketed IPv6 addresses (``[::1]:2181``); the port
defaults to 2181; ``;`` also separates hosts, as in BookKeeper's ``metadataServiceUri``.
``root`` is the cluster's ledgers root, BookKeeper's ``zkLedgersRootPath``: ``/ledgers``
when the address has no path.  A malformed address raises
:class:`~pybk.errors.InvalidConfiguration` saying which part is wrong.

Parsed here, below the ZooKeeper store (:mod:`pybk.meta.zookeeper`) that connects to
one; :mod:`pybk.meta.address` opens the store an address names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from pybk.errors import InvalidConfiguration, MetadataError
from pybk.meta import paths

SCHEME = "zk://"
DEFAULT_PORT = 2181
DEFAULT_ROOT = paths.LEDGERS


@dataclass(frozen=True)
class ZooKeeperAddress:
    """A parsed ``zk://`` address: ``hosts`` as ``(host, port)`` pairs, and the root."""

    hosts: tuple[tuple[str, int], ...]
    root: str = DEFAULT_ROOT

    @property
    def connect_string(self) -> str:
        """``host:port,...`` as ZooKeeper clients take it (no chroot: pybk maps paths)."""
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)

    def __str__(self) -> str:
        return f"{SCHEME}{self.connect_string}{self.root}"


def is_zookeeper_address(address: object) -> TypeGuard[str]:
    return isinstance(address, str) and address.startswith(SCHEME)


def parse_zookeeper_address(address: str) -> ZooKeeperAddress:
    """Parse ``zk://host:port[,host:port...]/root``; InvalidConfiguration if malformed."""
    if not is_zookeeper_address(address):
        raise _invalid(address, f"it does not start with {SCHEME}")
    rest = address[len(SCHEME):]
    if "?" in rest or "#" in rest:
        raise _invalid(address, "queries and fragments are not allowed")
    slash = rest.find("/")
    host_list, root = (rest, DEFAULT_ROOT) if slash < 0 else (rest[:slash], rest[slash:])
    hosts = tuple(_parse_host(address, part) for part in host_list.replace(";", ",").split(","))
    try:
        paths.check_path(root)
    except MetadataError as e:
        raise _invalid(address, f"the root: {e}") from None
    return ZooKeeperAddress(hosts, root)


def _parse_host(address: str, part: str) -> tuple[str, int]:
    if part.startswith("["):  # [IPv6]:port
        host, sep, port = part[1:].partition("]")
        if not sep or (port and not port.startswith(":")):
            raise _invalid(address, f"{part!r} is not [IPv6 address]:port")
        port = port[1:]
    else:
        host, _, port = part.partition(":")
    if not host or any(c.isspace() or c in "@/[]" for c in host):
        raise _invalid(address, f"{part!r} does not name a host")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _invalid(address, f"{part!r}: the port must be a number from 1 to 65535")
    return host, int(port)


def _invalid(address: object, why: str) -> InvalidConfiguration:
    return InvalidConfiguration(f"metadata address {address!r} is not "
                                f"zk://host:port[,host:port...]/root: {why}")

"""Metadata addresses (pybk.meta.zkaddress): zk:// parsing and its errors."""

from __future__ import annotations

import pytest

from pybk.errors import InvalidConfiguration
from pybk.meta.zkaddress import ZooKeeperAddress, parse_zookeeper_address

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("address, hosts, root", [
    ("zk://zk1:2181/ledgers", (("zk1", 2181),), "/ledgers"),
    ("zk://zk1", (("zk1", 2181),), "/ledgers"),
    ("zk://a:1,b:2,c/bk/cluster1", (("a", 1), ("b", 2), ("c", 2181)), "/bk/cluster1"),
    ("zk://a:1;b:2/ledgers", (("a", 1), ("b", 2)), "/ledgers"),
    ("zk://[::1]:2182,127.0.0.1:2181/x", (("::1", 2182), ("127.0.0.1", 2181)), "/x"),
])
def test_valid_addresses(address, hosts, root):
    parsed = parse_zookeeper_address(address)
    assert parsed == ZooKeeperAddress(hosts, root)
    assert parse_zookeeper_address(str(parsed)) == parsed


def test_connect_string_brackets_ipv6():
    parsed = parse_zookeeper_address("zk://[::1]:2182,zk2/ledgers")
    assert parsed.connect_string == "[::1]:2182,zk2:2181"


@pytest.mark.parametrize("address, why", [
    ("http://zk1:2181/ledgers", "does not start with zk://"),
    ("/data/meta", "does not start with zk://"),
    ("zk://", "does not name a host"),
    ("zk:///ledgers", "does not name a host"),
    ("zk://a:1,/ledgers", "does not name a host"),
    ("zk://a b:1/ledgers", "does not name a host"),
    ("zk://user@a:1/ledgers", "does not name a host"),
    ("zk://a:port/ledgers", "port must be a number"),
    ("zk://a:0/ledgers", "port must be a number"),
    ("zk://a:65536/ledgers", "port must be a number"),
    ("zk://a:-1/ledgers", "port must be a number"),
    ("zk://[::1/ledgers", r"not \[IPv6 address\]:port"),
    ("zk://[::1]2181/ledgers", r"not \[IPv6 address\]:port"),
    ("zk://a:1/", "root"),
    ("zk://a:1/ledgers/", "root"),
    ("zk://a:1/a//b", "root"),
    ("zk://a:1/ledgers?x=1", "queries and fragments"),
])
def test_malformed_addresses_say_what_is_wrong(address, why):
    with pytest.raises(InvalidConfiguration, match=why):
        parse_zookeeper_address(address)

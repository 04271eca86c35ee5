"""The pybk data source's options: names as Spark hands them (lower-cased), defaults,
types, and clear errors for anything the source cannot use; and the WAL directory a
`path` option names, opened without its writer."""

import threading

import pytest

import pybk
from pybk.errors import DirectoryLocked, InvalidConfiguration, NoSuchLog
from pybk.log import LogReader
from pybk.log.wal import open_storage
from pybk.spark.options import OPTIONS, READ, STREAM_READ, STREAM_WRITE, WRITE, parse

URI = "zk://127.0.0.1:2181/ledgers"


def test_lower_cased_names_map_back_and_defaults_apply():
    opts = parse({"metadataserviceuri": URI, "log": "events",
                  "maxrecordspertrigger": "100", "failondataloss": "false",
                  "readtimeout": "2.5"}, STREAM_READ)
    assert (opts.uri, opts.path, opts.log) == (URI, None, "events")
    assert opts.get("maxRecordsPerTrigger") == 100
    assert opts.get("failOnDataLoss") is False
    assert opts.get("startingPosition") is None and opts.get("consumerId") is None
    assert opts.client_settings().readTimeout == 2.5


def test_the_credentials_options_reach_the_client_and_zookeeper_settings(tmp_path):
    """The key file and the ZooKeeper credentials file are options (paths read where the
    clients run); bad values fail on the driver, naming the setting."""
    auth = tmp_path / "zk-auth"
    opts = parse({"metadataServiceUri": URI, "log": "x", "zmqcurveenabled": "true",
                  "zmqCurveSecretKeyFile": "/etc/pybk/client.key_secret",
                  "zkenablesecurity": "true", "zkDigestAuthFile": str(auth),
                  "zkWorldReadable": "false", "zkTimeout": "5000",
                  "zkOperationTimeoutMs": "7000", "zkRetryBackoffMaxMs": "400"}, READ)
    client = opts.client_settings()
    assert (client.zmqCurveEnabled, client.zmqCurveSecretKeyFile) == \
        (True, "/etc/pybk/client.key_secret")
    zookeeper = opts.zookeeper_settings()
    assert (zookeeper.zkEnableSecurity, zookeeper.zkDigestAuthFile, zookeeper.zkWorldReadable,
            zookeeper.zkTimeout) == (True, str(auth), False, 5000)
    assert (zookeeper.zkOperationTimeoutMs, zookeeper.zkRetryBackoffStartMs,
            zookeeper.zkRetryBackoffMaxMs) == (7000, 100, 400)
    assert parse({"path": "/data/wal"}, WRITE).zookeeper_settings().zkEnableSecurity is False
    with pytest.raises(InvalidConfiguration, match="zkDigestAuthFile"):
        parse({"metadataServiceUri": URI, "log": "x", "zkEnableSecurity": "true"}, READ)
    with pytest.raises(InvalidConfiguration, match="zmqCurveSecretKeyFile"):
        parse({"metadataServiceUri": URI, "log": "x", "zmqCurveEnabled": "true"}, WRITE)
    with pytest.raises(InvalidConfiguration, match="zkEnableSecurity"):
        parse({"metadataServiceUri": URI, "log": "x", "zkEnableSecurity": "maybe"}, READ)


def test_the_password_option_is_taken_as_given():
    assert parse({"path": "/data/wal", "password": "s3cret"}, READ).password == b"s3cret"
    assert parse({"path": "/data/wal", "password": ""}, WRITE).password == b""
    assert parse({"path": "/data/wal"}, READ).password == b""


def test_a_wal_directory_defaults_to_the_wal_log_with_one_copy(tmp_path):
    opts = parse({"path": str(tmp_path)}, WRITE)
    assert opts.log == "wal"
    settings = opts.log_settings_object()
    assert (settings.ensembleSize, settings.writeQuorumSize, settings.ackQuorumSize) == (1, 1, 1)
    clustered = parse({"metadataServiceUri": URI, "log": "x", "ensembleSize": "2",
                       "writeQuorumSize": "2"}, WRITE).log_settings_object()
    assert (clustered.ensembleSize, clustered.writeQuorumSize, clustered.ackQuorumSize) \
        == (2, 2, 2)


def test_positions_are_checked_and_kept_as_text():
    opts = parse({"metadataServiceUri": URI, "log": "x", "startingPosition": "3:4:5",
                  "endingPosition": "LATEST"}, READ)
    assert opts.get("startingPosition") == "3:4:5"
    assert opts.get("endingPosition") == "latest"
    with pytest.raises(InvalidConfiguration, match="startingPosition='3:x'.*segment:entry:slot"):
        parse({"metadataServiceUri": URI, "log": "x", "startingPosition": "3:x"}, READ)


def test_a_read_takes_a_list_of_logs_or_a_pattern_and_positions_by_log():
    opts = parse({"metadataServiceUri": URI, "log": " b, a ,c"}, STREAM_READ)
    assert (opts.logs, opts.log_pattern) == (("b", "a", "c"), None)
    assert opts.describe() == f"logs 'b', 'a', 'c' of {URI}"
    assert opts.for_log("a").describe() == f"log 'a' of {URI}"
    assert parse({"metadataServiceUri": URI, "log": "a,b"}, WRITE).logs == ("a,b",)
    opts = parse({"metadataServiceUri": URI, "logpattern": "ev-.*",
                  "startingPosition": '{"ev-1": "1:2:3", "ev-2": "EARLIEST"}',
                  "endingPosition": '{"ev-1": "4:0:0"}'}, READ)
    assert (opts.logs, opts.log_pattern) == ((), "ev-.*")
    assert opts.reads_log("ev-1") and not opts.reads_log("ev") \
        and not opts.reads_log("xev-1")  # the whole name matches
    assert [opts.position("startingPosition", log) for log in ("ev-1", "ev-2", "ev-3")] \
        == ["1:2:3", "earliest", None]
    assert [opts.position("endingPosition", log) for log in ("ev-1", "ev-2")] \
        == ["4:0:0", None]
    assert parse({"metadataServiceUri": URI, "log": "a,b", "startingPosition": "latest"},
                 STREAM_READ).position("startingPosition", "b") == "latest"


def test_times_are_whole_milliseconds_alone_or_by_log_and_bounds_come_one_way_a_log():
    opts = parse({"metadataServiceUri": URI, "logPattern": "ev-.*",
                  "startingtimestamp": " 1764028800000 ",
                  "endingTimestamp": '{"ev-1": 1764032400000, "ev-2": 0}'}, READ)
    assert [opts.position("startingTimestamp", log) for log in ("ev-1", "ev-9")] \
        == [1764028800000] * 2
    assert [opts.position("endingTimestamp", log) for log in ("ev-1", "ev-2", "ev-3")] \
        == [1764032400000, 0, None]
    # JSON objects that name different logs may give a log's bound either way.
    opts = parse({"metadataServiceUri": URI, "log": "a,b",
                  "startingPosition": '{"a": "earliest"}', "startingTimestamp": '{"b": 5}',
                  "endingPosition": "{}", "endingTimestamp": "7"}, READ)
    assert (opts.position("startingPosition", "a"), opts.position("startingTimestamp", "b"),
            opts.position("endingTimestamp", "a")) == ("earliest", 5, 7)


@pytest.mark.parametrize("options, use, message", [
    ({"metadataServiceUri": URI, "log": "x", "startingTimestamp": "-5"}, STREAM_READ,
     "startingTimestamp='-5': a timestamp is 0 or more"),
    ({"metadataServiceUri": URI, "log": "x", "startingTimestamp": "1.5e12"}, READ,
     "expected a whole number of milliseconds since the epoch"),
    ({"metadataServiceUri": URI, "log": "x", "endingTimestamp": "now"}, READ,
     "endingTimestamp='now': expected a whole number"),
    ({"metadataServiceUri": URI, "log": "x", "endingTimestamp": '{"x": -1}'}, READ,
     "endingTimestamp gives log 'x' -1: a timestamp is 0 or more"),
    ({"metadataServiceUri": URI, "log": "x", "startingTimestamp": '{"x": "5"}'}, READ,
     "a JSON object of whole numbers by log name"),
    ({"metadataServiceUri": URI, "log": "x", "startingTimestamp": '{"x": true}'}, READ,
     "a JSON object of whole numbers by log name"),
    ({"metadataServiceUri": URI, "log": "x", "startingTimestamp": '{"x"'}, READ,
     "is not JSON"),
    ({"metadataServiceUri": URI, "log": "x", "endingTimestamp": "5"}, STREAM_READ,
     "endingTimestamp does not apply to streaming reads"),
    ({"metadataServiceUri": URI, "log": "x", "startingTimestamp": "5"}, WRITE,
     "startingTimestamp does not apply to batch writes"),
    ({"metadataServiceUri": URI, "log": "x", "startingTimestamp": "5",
      "startingPosition": "latest"}, STREAM_READ,
     "options startingPosition and startingTimestamp both give the start of every log"),
    ({"metadataServiceUri": URI, "log": "x,y", "endingTimestamp": "5",
      "endingPosition": '{"y": "1:0:0"}'}, READ,
     "endingPosition and endingTimestamp both give the end of log 'y'"),
    ({"metadataServiceUri": URI, "log": "x,y", "startingTimestamp": '{"x": 1, "y": 2}',
      "startingPosition": '{"y": "earliest", "x": "latest"}'}, READ,
     "the start of logs 'x', 'y'"),
    ({"metadataServiceUri": URI, "logPattern": "a.*", "startingTimestamp": '{"b": 1}'},
     STREAM_READ, "startingTimestamp names 'b', which this read does not read"),
    ({"metadataServiceUri": URI, "log": "x", "maxRecordPerTrigger": "1"}, STREAM_READ,
     "unknown option 'maxRecordPerTrigger' \\(did you mean 'maxRecordsPerTrigger'\\?\\)"),
    ({"metadataServiceUri": URI, "log": "x", "sinkId": "s"}, READ,
     "sinkId does not apply to batch reads: it is an option of streaming writes"),
    ({"metadataServiceUri": URI, "log": "x", "ensembleSize": "3"}, READ,
     "ensembleSize is a setting of the ledgers a write makes"),
    ({"log": "x"}, READ, "exactly one of the options metadataServiceUri .* got neither"),
    ({"metadataServiceUri": URI, "path": "/tmp/w"}, READ, "got both"),
    ({"metadataServiceUri": "localhost:2181", "log": "x"}, READ, "zk://"),
    ({"metadataServiceUri": URI}, READ, "option log .* is required"),
    ({"metadataServiceUri": URI, "log": "a,,b"}, READ, "log='a,,b' holds an empty name"),
    ({"metadataServiceUri": URI, "log": "a, "}, STREAM_READ, "holds an empty name"),
    ({"metadataServiceUri": URI, "log": "a,b,a"}, READ, "names a twice"),
    ({"metadataServiceUri": URI, "log": "a", "logPattern": "a"}, READ, "give one of them"),
    ({"metadataServiceUri": URI}, STREAM_READ, "or logPattern"),
    ({"metadataServiceUri": URI, "logPattern": "a("}, READ, "not a regular expression"),
    ({"metadataServiceUri": URI, "log": "x", "logPattern": "x"}, WRITE,
     "logPattern does not apply to batch writes"),
    ({"metadataServiceUri": URI, "log": "a,b", "startingPosition": "1:0:0"}, READ,
     "startingPosition=1:0:0: a position is one log's.*\\{\"<log>\": \"1:0:0\""),
    ({"metadataServiceUri": URI, "logPattern": "a.*", "endingPosition": "1:0:0"}, READ,
     "a position is one log's"),
    ({"metadataServiceUri": URI, "logPattern": "a.*", "startingPosition": '{"b": "1:0:0"}'},
     STREAM_READ, "names 'b', which this read does not read"),
    ({"metadataServiceUri": URI, "log": "a", "startingPosition": '{"a": "soon"}'}, READ,
     "startingPosition gives log 'a' 'soon': expected earliest"),
    ({"metadataServiceUri": URI, "log": "a", "startingPosition": '{"a": 1}'}, READ,
     "a JSON object of strings by log name"),
    ({"metadataServiceUri": URI, "log": "a", "startingPosition": '{"a"'}, READ, "is not JSON"),
    ({"metadataServiceUri": URI, "log": "x", "minPartitions": "0"}, READ,
     "minPartitions='0': must be greater than 0"),
    ({"metadataServiceUri": URI, "log": "x", "minPartitions": "many"}, READ,
     "expected a whole number"),
    ({"metadataServiceUri": URI, "log": "x", "failOnDataLoss": "maybe"}, STREAM_READ,
     "expected true or false"),
    ({"metadataServiceUri": URI, "log": "x", "readTimeout": "-1"}, READ, "readTimeout"),
    ({"metadataServiceUri": URI, "log": "x", "ackQuorumSize": "5"}, STREAM_WRITE, "E >= Qw"),
])
def test_bad_options_are_refused_naming_them(options, use, message):
    with pytest.raises(InvalidConfiguration, match=message):
        parse(options, use)


def test_every_option_names_its_uses_and_says_what_it_does():
    for name, option in OPTIONS.items():
        assert option.uses and option.doc, name


def test_open_storage_reads_a_closed_wal_without_writing_to_its_log(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        positions = [wal.append(b"r%d" % i) for i in range(5)]
        head_before = wal._writer.metadata
    with open_storage(tmp_path / "wal") as bk:
        assert [p for p, _ in LogReader(bk, "wal").read()] == positions
        from pybk.log.metadata import read_log
        assert read_log(bk.metadata, "wal").metadata == head_before  # nothing fenced
    with pybk.open(tmp_path / "wal") as wal:
        assert [data for _, data in wal.read()] == [b"r%d" % i for i in range(5)]


def test_open_storage_refuses_a_missing_wal_unless_asked_to_create_it(tmp_path):
    with pytest.raises(NoSuchLog, match="holds no pybk WAL"):
        with open_storage(tmp_path / "none"):
            pass
    with open_storage(tmp_path / "new", create=True) as bk:
        assert bk.list_ledgers() == []


def test_open_storage_waits_for_the_directory_then_names_the_lock(tmp_path):
    with pybk.open(tmp_path / "wal"):
        with pytest.raises(DirectoryLocked, match="a WAL object of this process"):
            with open_storage(tmp_path / "wal", lock_timeout=0.3):
                pass
    released = threading.Event()
    with open_storage(tmp_path / "wal") as first:
        def wait_then_open():
            with open_storage(tmp_path / "wal", lock_timeout=30):
                released.set()
        waiter = threading.Thread(target=wait_then_open)
        waiter.start()
        assert not released.wait(0.3)  # held by the first opener
        assert first.list_ledgers()
        with pytest.raises(DirectoryLocked, match="open in another process.*LOCK"):
            with open_storage(tmp_path / "wal", lock_timeout=0.2):
                pass
    waiter.join(30)
    assert released.is_set()

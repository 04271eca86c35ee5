"""Bare ZeroMQ sockets for transport tests: a DEALER that sends what no client would, and
a ROUTER that plays a bookie which answers late, wrongly or never.  Each has a context
of its own; close them (they are context managers).  And a bare ZMTP peer without
libzmq (:func:`flood_and_reset`), for what no ZeroMQ socket would do to a bookie."""

from __future__ import annotations

import socket
import struct
import time

import zmq

LOOPBACK = "tcp://127.0.0.1:*"


class _Bare:
    def __init__(self, kind: int) -> None:
        self.context = zmq.Context(io_threads=1)
        self.socket = self.context.socket(kind)
        self.socket.setsockopt(zmq.LINGER, 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def receive(self, timeout_s: float) -> list[bytes] | None:
        """The next message, or None if none comes within ``timeout_s``."""
        if not self.socket.poll(int(timeout_s * 1000)):
            return None
        return self.socket.recv_multipart()

    def close(self) -> None:
        self.socket.close()
        self.context.term()


class RawDealer(_Bare):
    """A DEALER connected to ``address``; ``receive_hwm`` bounds the replies ZeroMQ
    queues for it (default 1000)."""

    def __init__(self, address: str, receive_hwm: int = 1000) -> None:
        super().__init__(zmq.DEALER)
        self.socket.setsockopt(zmq.RCVHWM, receive_hwm)
        self.socket.connect(address)


class RawRouter(_Bare):
    """A ROUTER bound at ``address`` (:attr:`address` is the endpoint it got)."""

    def __init__(self, address: str = LOOPBACK) -> None:
        super().__init__(zmq.ROUTER)
        self.socket.bind(address)
        self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)


# -- a ZMTP 3.1 DEALER over a plain TCP socket (rfc.zeromq.org/spec/37) ----------------

_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04


def _zmtp_frame(body: bytes, flags: int = 0) -> bytes:
    if len(body) > 255:
        return bytes([flags | _LONG]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


#: Signature, version 3.1, the NULL mechanism, not a server, filler: 64 bytes.
_GREETING = (b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00")
             + bytes(32))
_READY = _zmtp_frame(b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER",
                     _COMMAND)
#: A heartbeat with no time to live and no context.
_PING = _zmtp_frame(b"\x04PING" + struct.pack(">H", 0), _COMMAND)


def flood_and_reset(address: str, message: list[bytes], seconds: float) -> None:
    """Connect to the ROUTER at ``address`` (``tcp://host:port``) as a DEALER, send
    ``message`` followed by a heartbeat PING over and over for ``seconds`` without
    reading a reply, then reset the connection (RST: the peer's unread bytes are
    dropped).  A bookie that stopped reading the connection meanwhile holds requests
    and PINGs it read but did not process when the reset comes.  Returns early if the
    peer closes or resets first."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    encoded = b"".join(_zmtp_frame(frame, _MORE if i < len(message) - 1 else 0)
                       for i, frame in enumerate(message))
    chunk = (encoded + _PING) * 1000
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(_GREETING + _READY)
        _receive(sock, len(_GREETING))  # the peer's greeting
        flags, size = _receive(sock, 2)
        assert flags == _COMMAND, "a long READY command"
        _receive(sock, size)  # the peer's READY: the handshake is done
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                sock.sendall(chunk)
        except OSError:  # the peer went away (or its buffers stayed full for 10 s)
            pass


def _receive(sock: socket.socket, count: int) -> bytes:
    received = b""
    while len(received) < count:
        data = sock.recv(count - len(received))
        assert data, "the peer closed the connection"
        received += data
    return received

"""Bare ZeroMQ sockets for transport tests: a DEALER that sends what no client would, and
a ROUTER that plays a bookie which answers late, wrongly or never.  Each has a context
of its own; close them (they are context managers)."""

from __future__ import annotations

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

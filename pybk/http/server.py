"""The bookie's HTTP admin server: a route table served by the standard library's
``http.server``, with bounds on everything a client controls.

What a route is
    :class:`Routes` maps a path (``/api/v1/bookie/info``) and a method to a handler
    ``handler(request) -> value``.  A value that is a :class:`Response` is sent as it is;
    anything else is sent as JSON (``application/json``, status 200).  A route added
    ``privileged`` needs the admin token.  Other parts of pybk add their own routes to
    the table of a running server (:attr:`AdminHttpServer.routes`), e.g. ``/metrics``.

Errors (always a JSON object ``{"message": why}``, never a traceback)
    400 bad input (a parameter missing or malformed, :class:`HttpError`, ValueError,
    InvalidConfiguration); 403 a privileged route without the right token, or any
    privileged route when no ``httpServerAdminToken`` is configured; 404 an unknown path,
    ledger (NoSuchLedger) or bookie (NoSuchBookie); 405 a method the path does not
    serve (with ``Allow``); 411/413 a body without a length or over
    ``httpServerMaxRequestBytes``; 500 any other failure (logged here with its traceback);
    503 ZooKeeper unreachable (MetadataError) or ``httpServerMaxConcurrentRequests``
    requests already in progress.

Bounds
    One request per connection (HTTP/1.0: no idle keep-alive connection holds a thread);
    each connection's socket times out after ``httpServerSocketTimeoutMs`` (a slow or
    silent client is dropped); bodies are read only up to ``httpServerMaxRequestBytes``;
    at most ``httpServerMaxConcurrentRequests`` requests run at once, the next are
    refused at once with 503 by the accepting thread.  Handlers bound their own waits
    (ZooKeeper calls by ``zkTimeout``, bookie requests by their timeouts).

Token
    ``Authorization: Bearer <httpServerAdminToken>``, compared in constant time.

Threads: ``pybk-http`` accepts connections (``serve_forever``); each accepted request is
served on a ``pybk-http-request`` thread of its own.  :meth:`AdminHttpServer.close` stops
accepting, closes the listening socket and joins the request threads (at most
:data:`CLOSE_WAIT_S`; they are daemons, so one stuck in a handler cannot hold the process).
"""

from __future__ import annotations

import hmac
import http.server
import json
import logging
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable

from pybk.errors import (
    BookKeeperError,
    InvalidConfiguration,
    MetadataError,
    NoSuchBookie,
    NoSuchLedger,
)
from pybk.settings import ServerSettings

log = logging.getLogger(__name__)

#: Seconds :meth:`AdminHttpServer.close` waits for requests in progress.
CLOSE_WAIT_S = 5.0
_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


class HttpError(Exception):
    """Answer the request with ``status`` and ``{"message": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Request:
    """One request as handlers see it: the path without its query, the query's
    parameters (the last value of each), the body (at most httpServerMaxRequestBytes)."""

    method: str
    path: str
    query: dict[str, str]
    body: bytes

    def param(self, name: str, default: str | None = None) -> str | None:
        return self.query.get(name, default)

    def int_param(self, name: str, low: int, high: int,
                  default: int | None = None) -> int | None:
        """The query parameter ``name`` as an integer in [``low``, ``high``] (``default``
        if absent); 400 if it is not one, or out of that range (never a value that
        fails deeper down as something else, such as the metadata's 503)."""
        return _as_int(name, self.query.get(name), low, high, default)

    def bool_param(self, name: str, default: bool = False) -> bool:
        """``true``/``false`` (any case) as a bool; 400 otherwise."""
        return _as_bool(name, self.query.get(name), default)

    def json(self) -> dict:
        """The body as a JSON object; 400 if it is none."""
        try:
            value = json.loads(self.body or b"{}")
        except ValueError as e:
            raise HttpError(400, f"the body is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "the body must be a JSON object")
        return value


@dataclass(frozen=True)
class Response:
    """What a handler answers when it is not JSON with status 200."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def json(value: Any, status: int = 200) -> "Response":
        return Response(status, (json.dumps(value, sort_keys=True) + "\n").encode())

    @staticmethod
    def text(text: str, status: int = 200, content_type: str = "text/plain") -> "Response":
        return Response(status, text.encode(), f"{content_type}; charset=utf-8")


Handler = Callable[[Request], Any]


@dataclass(frozen=True)
class _Route:
    handler: Handler
    privileged: bool


class Routes:
    """The server's route table: path -> method -> handler.  Safe to add to while the
    server runs (a new path is served from the next request on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: dict[str, dict[str, _Route]] = {}

    def add(self, path: str, method: str, handler: Handler, *,
            privileged: bool = False) -> None:
        """Serve ``method`` on ``path`` with ``handler``; ``privileged``: only with the
        admin token.  ValueError if the path already serves that method."""
        method = method.upper()
        if method not in _METHODS or not path.startswith("/"):
            raise ValueError(f"cannot route {method} {path}")
        with self._lock:
            methods = self._routes.setdefault(path, {})
            if method in methods:
                raise ValueError(f"{method} {path} is routed already")
            methods[method] = _Route(handler, privileged)

    def paths(self) -> list[str]:
        with self._lock:
            return sorted(self._routes)

    def find(self, path: str) -> dict[str, _Route] | None:
        with self._lock:
            found = self._routes.get(path)
            return None if found is None else dict(found)


class AdminHttpServer:
    """Serves ``routes`` on ``settings.httpServerHost``:``httpServerPort`` (bounded as the
    module docstring says) from construction until :meth:`close`.  BookKeeperError if the
    address cannot be bound."""

    def __init__(self, settings: ServerSettings, routes: Routes) -> None:
        self.routes = routes
        self._token = settings.httpServerAdminToken
        self._max_body = settings.httpServerMaxRequestBytes
        self._slots = threading.BoundedSemaphore(settings.httpServerMaxConcurrentRequests)
        self._requests: set[threading.Thread] = set()
        self._requests_lock = threading.Lock()
        handler = type("_BoundHandler", (_RequestHandler,),
                       {"admin": self, "timeout": settings.httpServerSocketTimeoutMs / 1000})
        try:
            self._http = _HttpServer((settings.httpServerHost, settings.httpServerPort),
                                     handler, self)
        except OSError as e:
            raise BookKeeperError(f"the HTTP admin server cannot listen on "
                                  f"{settings.httpServerHost}:{settings.httpServerPort}: "
                                  f"{e.strerror or e}") from None
        #: ``http://host:port`` the server listens on.
        self.url = f"http://{settings.httpServerHost}:{self._http.server_port}"
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.2,),
                                         name="pybk-http", daemon=True)
        self._thread.start()
        log.info("HTTP admin server at %s", self.url)

    def __enter__(self) -> "AdminHttpServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, then wait (at most CLOSE_WAIT_S) for requests in progress.
        Closing twice is harmless."""
        if not self._thread.is_alive():
            return
        self._http.shutdown()
        self._thread.join()
        self._http.server_close()
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._requests_lock:
            running = list(self._requests)
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("HTTP admin server: a request still runs after %.0f s; "
                            "leaving it behind", CLOSE_WAIT_S)

    # -- the per-request work, called by the handler ------------------------------------

    def _start(self, connection: socket.socket, client_address: Any) -> None:
        """On the accepting thread: serve the connection on a thread of its own, or
        refuse it at once if every slot is taken."""
        if not self._slots.acquire(blocking=False):
            _refuse_busy(connection)
            self._http.shutdown_request(connection)
            return
        thread = threading.Thread(target=self._serve, args=(connection, client_address),
                                  name="pybk-http-request", daemon=True)
        with self._requests_lock:
            self._requests.add(thread)
        thread.start()

    def _serve(self, connection: socket.socket, client_address: Any) -> None:
        try:
            self._http.finish_request(connection, client_address)
        except Exception:  # the client went away mid-answer, or its socket timed out
            log.debug("HTTP admin request from %s ended early", client_address,
                      exc_info=True)
        finally:
            self._http.shutdown_request(connection)
            self._slots.release()
            with self._requests_lock:
                self._requests.discard(threading.current_thread())

    def answer(self, method: str, target: str, headers: Any,
               read_body: Callable[[int], bytes]) -> Response:
        """The response to one request (never raises for the request's sake)."""
        parsed = urllib.parse.urlsplit(target)
        try:
            # The body first (bounded): a connection closed with unread bytes is reset,
            # and the client might lose the answer.
            body = self._body(headers, read_body)
            methods = self.routes.find(parsed.path)
            if methods is None:
                raise HttpError(404, f"no such endpoint: {parsed.path}")
            route = methods.get("GET" if method == "HEAD" else method)
            if route is None:
                allowed = ", ".join(sorted(methods))
                return Response(405, _message(f"{method} is not allowed on {parsed.path}: "
                                              f"use {allowed}"),
                                headers={"Allow": allowed})
            if route.privileged:
                self._check_token(headers.get("Authorization"))
            query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
            result = route.handler(Request(method, parsed.path, query, body))
            return result if isinstance(result, Response) else Response.json(result)
        except HttpError as e:
            return Response(e.status, _message(str(e)))
        except (NoSuchLedger, NoSuchBookie) as e:
            return Response(404, _message(str(e)))
        except MetadataError as e:
            return Response(503, _message(f"the cluster's metadata is unavailable: {e}"))
        except (InvalidConfiguration, ValueError) as e:
            return Response(400, _message(str(e)))
        except BookKeeperError as e:
            return Response(500, _message(str(e)))
        except Exception as e:
            log.exception("HTTP admin: %s %s failed", method, parsed.path)
            return Response(500, _message(f"internal error ({type(e).__name__}); see the "
                                          "bookie's log"))

    def _check_token(self, authorization: str | None) -> None:
        if not self._token:
            raise HttpError(403, "this endpoint changes the bookie or the cluster, or reads "
                                 "ledger data: it is disabled until httpServerAdminToken "
                                 "is set")
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self._token.encode()):
            raise HttpError(403, "this endpoint needs the admin token: "
                                 "Authorization: Bearer <httpServerAdminToken>")

    def _body(self, headers: Any, read_body: Callable[[int], bytes]) -> bytes:
        if headers.get("Transfer-Encoding"):
            raise HttpError(411, "send the body with a Content-Length, not chunked")
        length = _as_int("Content-Length", headers.get("Content-Length"), 0, sys.maxsize, 0)
        assert length is not None  # a default is given
        if length > self._max_body:
            raise HttpError(413, f"the body has {length} bytes; at most "
                                 f"{self._max_body} (httpServerMaxRequestBytes)")
        try:
            body = read_body(length) if length else b""
        except OSError:  # the socket's timeout: a client that stopped sending
            body = b""
        if len(body) < length:
            raise HttpError(400, f"the body ended after {len(body)} of its {length} bytes "
                                 "(or did not arrive within httpServerSocketTimeoutMs)")
        return body


class _HttpServer(http.server.HTTPServer):
    """Hands each accepted connection to :meth:`AdminHttpServer._start`."""

    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type,
                 admin: AdminHttpServer) -> None:
        self._admin = admin
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._admin._start(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("HTTP admin: error with a request from %s", client_address, exc_info=True)


class _RequestHandler(http.server.BaseHTTPRequestHandler):
    """Parses one request and sends the answer :meth:`AdminHttpServer.answer` gives."""

    admin: AdminHttpServer
    server_version = "pybk"
    # A request the standard library cannot parse is answered in JSON too.
    error_message_format = '{"message": "%(message)s"}\n'
    error_content_type = "application/json"

    def _dispatch(self) -> None:
        response = self.admin.answer(self.command, self.path, self.headers, self.rfile.read)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _dispatch

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        log.debug("HTTP admin %s: " + format, self.address_string(), *args)


def _refuse_busy(connection: socket.socket) -> None:
    """Answer 503 after one short read of the request (the accepting thread must not
    wait long; a connection closed with unread bytes is reset before the answer)."""
    body = _message("too many requests in progress (httpServerMaxConcurrentRequests): "
                    "try again shortly")
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\n\r\n").encode()
    try:
        connection.settimeout(0.2)
        connection.recv(65536)  # what came of the request: unread, closing would reset
        connection.sendall(head + body)
    except OSError:
        pass  # the client is gone or not reading: it is refused either way


def _message(text: str) -> bytes:
    return (json.dumps({"message": text}) + "\n").encode()


def _as_int(name: str, raw: str | None, low: int, high: int,
            default: int | None) -> int | None:
    if raw is None:
        return default
    try:
        # Digits only: int() also takes "1_000", " 7 " and "+7", which no client means.
        value = int(raw) if raw.lstrip("-").isdecimal() and raw.isascii() else None
    except ValueError:  # more digits than int() converts
        value = None
    if value is None:
        raise HttpError(400, f"{name} must be an integer, not {raw[:40]!r}")
    if not low <= value <= high:
        raise HttpError(400, f"{name} must be in [{low}, {high}], not {raw[:40]}")
    return value


def _as_bool(name: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise HttpError(400, f"{name} must be true or false, not {raw!r}")

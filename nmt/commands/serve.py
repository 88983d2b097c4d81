"""`nmt serve`: a translation server over HTTP that batches across requests.

    nmt serve --checkpoint runs/quickstart/checkpoints/best.pt --port 8000
    curl -s localhost:8000/translate -d '{"text": ["Hola."], "options": {"beam_size": 4}}'

Endpoints (README "Serving"):
- POST /translate `{"text": [line, ...], "options": {decode key: value}, "prefix": [line, ...]}`
  ("options" and "prefix" optional) -> `{"translations": [{"text", "score", "log_prob",
  "finished", "truncated", ...}, ...]}`, one item per line in input order; with nbest > 1 each
  item carries its n-best list under "nbest"; with alignment / protect / prefixes, "alignment" /
  "protected" / "prefix_truncated".
- GET /health: 200 and the server's counters while it serves, 503 while it shuts down.
- GET /: a page to try the model (nmt/commands/serve_page.py).

Each request is checked in the event loop (JSON shape, limits, decode options validated as
`nmt translate` validates its flags: the same one-line messages; lengths within the model's
positions) and queued for the batcher (nmt/commands/batcher.py), which translates requests that arrive
together in one `nmt.Translator` call in a worker thread. Every answer, errors included, is JSON;
errors are one line `{"error": ...}`: 400 bad JSON, text or options, or a Host header that is not
this server's; 403 a cross-origin POST (a web page of another site) unless --allow-origin allows
its origin; 404 / 405 no such endpoint or method; 408 the body did not arrive within --timeout;
413 too many lines or characters; 503 full queue (Retry-After) or shutting down; 504 time limit
passed; 500 a failure in the model. A request can set only the decode keys in REQUEST_KEYS: the
server-wide ones (SERVER_KEYS) are fixed when it starts, and no request names a file or changes
the server's state.

A request whose time limit passes, or whose client goes away, is abandoned at once: it leaves the
queue (its slot is free), and the call translating it stops at its next decoding step (the
batcher runs the call again for the requests that shared it). The time limit counts from the
request's arrival, reading its body included.

SIGTERM or Ctrl-C: new requests get 503, and so do those still sending their body; the requests
already accepted are answered, then the process exits 0; a second signal exits at once (128 +
signal). The ASGI stack (Starlette, uvicorn) is the optional extra `serve` and is imported only
here, when the server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import os
import re
import signal
import socket
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

from nmt.api import Translator
from nmt.commands.batcher import Batcher, Job, Settings
from nmt.config import ConfigError, DecodeConfig
from nmt.errors import UserError

# Decode keys fixed for the whole server (`nmt serve` flags), with why a request may not set them.
SERVER_KEYS = {
    "batch_tokens": "the server's batching", "max_batch_size": "the server's batching",
    "workers": "the server's threads",
    "protect_pattern": "a regular expression run on every line (a slow one would stall every request)",
}
REQUEST_KEYS = tuple(k for k in DecodeConfig.__dataclass_fields__ if k not in SERVER_KEYS)
FIELDS = ("text", "options", "prefix")  # of a POST /translate body
RETRY_AFTER = "1"  # seconds, with 503 for a full queue
ANY_ADDRESS = ("0.0.0.0", "::", "")  # --host values that listen on every interface (any Host header)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")  # the names of this machine, for a loopback --host
SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate (from JSON's \ud800 escape): not Unicode text


class RequestError(Exception):
    """A request the server refuses: HTTP status, a one-line message, headers of the answer."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


# --------------------------------------------------------------------------- checking a request

def parse_request(body: bytes, settings: Settings) -> tuple[list[str], list[str] | None, dict]:
    """(lines, prefixes or None, decode options) of a POST /translate body, or RequestError."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON: {e}") from None
    except RecursionError:
        raise RequestError(400, "the body is not a translation request: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise RequestError(400, 'the body must be a JSON object: {"text": ["a sentence", ...], "options": {...}}')
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    lines = _string_list(data.get("text"), "text")
    prefixes = _string_list(data["prefix"], "prefix") if data.get("prefix") is not None else None
    if prefixes is not None and len(prefixes) != len(lines):
        raise RequestError(400, f"{len(prefixes)} prefixes for {len(lines)} lines")
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "options must be a JSON object of decode keys, e.g. {\"beam_size\": 4}")
    _check_size(lines, prefixes, settings)
    return lines, prefixes, options


def _string_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise RequestError(400, f"{name} must be a list of strings, one sentence each")
    for i, line in enumerate(value):
        if "\n" in line or "\r" in line:
            raise RequestError(400, f"{name}[{i}] contains a line break (one sentence per item)")
        bad = SURROGATE.search(line)
        if bad:  # no UTF-8 text has one (nmt translate refuses such input as invalid UTF-8)
            raise RequestError(400, f"{name}[{i}] is not Unicode text: a lone surrogate U+{ord(bad.group()):04X} at "
                                    f"character {bad.start()}")
    return value


def _check_size(lines: list[str], prefixes: list[str] | None, settings: Settings) -> None:
    if len(lines) > settings.max_lines:
        raise RequestError(413, f"{len(lines)} lines in one request (this server takes at most "
                                f"{settings.max_lines}: nmt serve --max-lines)")
    chars = sum(map(len, lines)) + sum(map(len, prefixes or ()))
    if chars > settings.max_chars:
        raise RequestError(413, f"{chars} characters in one request (this server takes at most "
                                f"{settings.max_chars}: nmt serve --max-chars)")


def check_options(translator, options: dict, settings: Settings) -> DecodeConfig:
    """The request's decode settings (the server's defaults with `options` applied), or RequestError
    400 with the messages `nmt translate` gives for the same flags, or naming the server's limit."""
    for key in options:
        if key in SERVER_KEYS:
            raise RequestError(400, f"option {key!r} is not set per request ({SERVER_KEYS[key]}: "
                                    f"nmt serve --{key.replace('_', '-')} sets it for the server)")
    try:
        decode = translator.decode_settings(**options)
        translator.check_language(**options)  # a multilingual model needs tgt_lang unless it has a default
    except ConfigError as e:
        raise RequestError(400, "; ".join(e.errors)) from None
    except UserError as e:
        raise RequestError(400, str(e)) from None
    errors = over_limits(decode, options, settings.max_beam, translator.max_positions)
    if errors:
        raise RequestError(400, errors[0])
    return decode


LENGTH_KEYS = ("min_len", "max_len_a", "max_len_b")


def over_limits(decode: DecodeConfig, lengths_given, max_beam: int, max_positions: int) -> list[str]:
    """What in `decode` is over the server's limits, one message each: beam_size and nbest over
    --max-beam; min_len, max_len_a, max_len_b (those in `lengths_given`: the model's own defaults
    may exceed them, and are capped as in `nmt translate`) past what the model can write, an output
    of at most max_positions - 1 tokens, EOS included (a request asking more would search to the
    model's limit and return less than it asked for)."""
    errors = [f"{key} {getattr(decode, key)} is over this server's limit {max_beam} (nmt serve --max-beam)"
              for key in ("beam_size", "nbest") if getattr(decode, key) > max_beam]
    longest = max_positions - 1
    for key, limit in zip(LENGTH_KEYS, (longest - 1, longest, longest)):
        if key in lengths_given and getattr(decode, key) > limit:
            errors.append(f"{key} {getattr(decode, key):g} is over this model's limit {limit} (its outputs have at "
                          f"most max_positions - 1 = {longest} tokens, EOS included)")
    return errors


# --------------------------------------------------------------------------- answers

def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no inf / nan


def _hypothesis(h, decode: DecodeConfig) -> dict:
    out = {"text": h.text, "score": _number(h.score), "log_prob": _number(h.log_prob), "finished": h.finished}
    if decode.alignment:
        out["alignment"] = h.format_alignment()
    return out


def result_json(result, decode: DecodeConfig, prefixed: bool = False) -> dict:
    """One item of the response's "translations" for a TranslationResult (prefixed: the request
    gave prefixes, so the item says whether its prefix was cut to the model's maximum)."""
    out = _hypothesis(result.hypotheses[0], decode)
    out["truncated"] = result.truncated
    if prefixed:
        out["prefix_truncated"] = result.prefix_truncated
    if decode.protect:
        out["protected"] = result.protected
    if decode.nbest > 1:
        out["nbest"] = [_hypothesis(h, decode) for h in result.hypotheses]
    return out


class ClientGone(Exception):
    """The client closed its connection before its answer."""


class Service:
    """What the app serves: the translator, the settings, the batcher (made when the event loop
    runs), whether it is shutting down (`draining`, set by the signal handler; `stopping`, the
    event the server sets from it, wakes the requests still sending their body), and how many
    requests are in progress (`in_flight`: being received or answered; the drain waits for them)."""

    def __init__(self, translator, settings: Settings, name: str):
        self.translator, self.settings, self.name = translator, settings, name
        self.batcher: Batcher | None = None
        self.draining = False
        self.stopping = asyncio.Event()
        self.in_flight = 0

    def translate(self, lines, prefixes, line_numbers, options, cancel):
        """One call of the translator (the batcher runs it in its worker thread)."""
        return self.translator.translate(lines, prefixes=prefixes, line_numbers=line_numbers, cancel=cancel,
                                         **options)

    def health(self) -> dict:
        stats = vars(self.batcher.stats) if self.batcher else {}
        return {"status": "draining" if self.draining else "ok", "model": self.name,
                "engine": self.translator.engine, "batching": self.settings.batching,
                "queued": self.batcher.queued if self.batcher else 0, "in_flight": self.in_flight,
                "request_keys": list(REQUEST_KEYS), **stats}

    async def receive(self, request, deadline: float) -> bytes:
        """The request's body, read until `deadline` (loop time): RequestError 408 after it, 503 when
        the server starts shutting down first (a slow upload holds neither), 413 past the limit."""
        # JSON escapes take up to 12 bytes per character (a surrogate pair \\uXXXX\\uXXXX)
        reading = asyncio.ensure_future(_read_body(request, 12 * self.settings.max_chars + 65536))
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({reading, stopping}, timeout=max(0.0, deadline - asyncio.get_running_loop().time()),
                               return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                return reading.result()  # the body, or its RequestError (413) or ClientDisconnect
        finally:
            stopping.cancel()
            reading.cancel()  # (nothing if done)
        close = {"Connection": "close"}  # (the body was not read: the connection cannot be used again)
        if self.stopping.is_set():
            raise RequestError(503, "the server is shutting down", close)
        raise RequestError(408, f"the request body did not arrive within {self.settings.timeout:g} s "
                                "(nmt serve --timeout)", close)

    async def answer(self, body: bytes, deadline: float, gone: asyncio.Future) -> dict:
        """The response body for a POST /translate body, or RequestError; ClientGone when `gone`
        (the client's disconnection) comes first. A request not answered by `deadline` (loop time)
        or whose client went away is abandoned: the batcher frees its slot, or stops its call."""
        lines, prefixes, options = parse_request(body, self.settings)
        decode = check_options(self.translator, options, self.settings)
        loop = asyncio.get_running_loop()
        job = Job(lines, prefixes, options, decode, loop.create_future(), loop.time())
        try:
            self.batcher.submit(job)
        except asyncio.QueueFull:
            raise RequestError(503, f"the server is busy ({self.settings.max_queue} requests queued: nmt serve "
                                    "--max-queue); retry later", {"Retry-After": RETRY_AFTER}) from None
        await asyncio.wait({job.future, gone}, timeout=max(0.0, deadline - loop.time()),
                           return_when=asyncio.FIRST_COMPLETED)
        if not job.future.done():
            job.future.cancel()  # abandoned
            if gone.done():
                raise ClientGone()
            raise RequestError(504, f"not translated within {self.settings.timeout:g} s (nmt serve --timeout)")
        try:
            results = job.future.result()
        except UserError as e:
            raise RequestError(400, str(e)) from None
        return {"translations": [result_json(r, decode, prefixes is not None) for r in results]}


# --------------------------------------------------------------------------- the app

def require_stack():
    """(starlette, uvicorn), or a one-line UserError naming the extra to install."""
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise UserError(f"nmt serve needs the optional extra 'serve' ({e.name} is not installed): "
                        "pip install -e \".[serve]\"") from None
    return starlette, uvicorn


async def _read_body(request, limit: int) -> bytes:
    """The request body, or RequestError 413 past `limit` bytes (checked before reading it all)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise RequestError(413, f"a body of {length} bytes (this server reads at most {limit}: nmt serve --max-chars)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"a body over {limit} bytes (nmt serve --max-chars)")
        chunks.append(chunk)
    return b"".join(chunks)


async def _disconnected(request) -> None:
    """Returns when the client closes its connection (called once its body is read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def error_response(status: int, message: str, headers: dict | None = None):
    """`{"error": message}` (ASCII JSON: any text a client sent can be quoted in it)."""
    from starlette.responses import Response

    return Response(json.dumps({"error": message}, separators=(",", ":")), status_code=status, headers=headers,
                    media_type="application/json")


def _name(host: str) -> str:
    """A host name or address as urlsplit's `hostname` gives it (lower case, IPv6 without brackets)."""
    return host.strip("[]").lower()


def allowed_hosts(host: str, extra: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The names a Host header may give for a server listening on `host` (None: any): any when it
    listens on every interface (it is meant to be reached by whatever name the network gives it)
    or `extra` holds "*"; else `host` itself, this machine's names for a loopback address, and
    `extra` (--allow-host). Checking the Host header stops DNS rebinding: a web page of another
    site whose name is made to point at this machine."""
    if host in ANY_ADDRESS or "*" in extra:
        return None
    names = {_name(host), *map(_name, extra)}
    try:
        loopback = host == "localhost" or ipaddress.ip_address(_name(host)).is_loopback
    except ValueError:  # a host name
        loopback = False
    return frozenset(names | set(LOOPBACK_NAMES) if loopback else names)


def _same_origin(origin: str, host: str) -> bool:
    """Whether a request's Origin header names the server it was sent to (its Host header)."""
    try:
        o, h = urlsplit(origin), urlsplit("//" + host)
        default = {"http": 80, "https": 443}.get(o.scheme)
        return o.hostname is not None and o.hostname == h.hostname and (o.port or default) == (h.port or default)
    except ValueError:  # a malformed port
        return False


class Guard:
    """ASGI middleware: the server's Host and Origin policy (README "Serving"). A Host header that
    is not one of `hosts` (None: any) gets 400; a request other than GET / HEAD with an Origin
    header that is neither the server's own nor one of `origins` ("*": any) gets 403, before the
    app reads it. Browsers send Origin with every POST, and a page of another site could make
    the browser of someone running the server post to it (the answer unreadable to the page, but
    the work done); curl and other clients that send no Origin are not affected."""

    def __init__(self, app, hosts: frozenset[str] | None, origins: frozenset[str]):
        self.app, self.hosts, self.origins = app, hosts, origins

    def refusal(self, scope) -> tuple[int, str] | None:
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and self.hosts is not None:
            try:
                name = urlsplit("//" + host).hostname
            except ValueError:
                name = None
            if name not in self.hosts:
                return 400, (f"the Host header {host!r} is not a name of this server (nmt serve --allow-host NAME "
                             "accepts another)")
        origin = headers.get("origin")
        if origin is not None and scope["method"] not in ("GET", "HEAD") and "*" not in self.origins \
                and origin not in self.origins and not _same_origin(origin, host or ""):
            return 403, (f"a cross-origin request from {origin!r} (nmt serve --allow-origin {origin} lets web pages "
                         "of that origin call this server)")
        return None

    async def __call__(self, scope, receive, send):
        refused = self.refusal(scope) if scope["type"] == "http" else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        await error_response(*refused, headers={"Connection": "close"})(scope, receive, send)


def build_app(service: Service, hosts: frozenset[str] | None = None, origins: frozenset[str] = frozenset()):
    """The Starlette app over `service` (the batcher task runs while the app does); `hosts` and
    `origins`: the Host and Origin policy (Guard), with CORS headers for `origins`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.requests import ClientDisconnect
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from nmt.commands.serve_page import PAGE

    async def translate(request):
        if service.draining:
            return error_response(503, "the server is shutting down", {"Connection": "close"})
        service.in_flight += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + service.settings.timeout
        gone = None
        try:
            body = await service.receive(request, deadline)
            gone = asyncio.ensure_future(_disconnected(request))
            return JSONResponse(await service.answer(body, deadline, gone))
        except RequestError as e:
            return error_response(e.status, str(e), e.headers)
        except (ClientGone, ClientDisconnect):  # nobody reads the answer (uvicorn sends nothing)
            return Response(status_code=204)
        except Exception as e:  # a failure in the model: logged with its traceback, answered 500
            import traceback

            traceback.print_exc()
            return error_response(500, f"internal error: {type(e).__name__}: {e}")
        finally:
            if gone is not None:
                gone.cancel()
            service.in_flight -= 1

    async def health(request):
        return JSONResponse(service.health(), status_code=503 if service.draining else 200)

    async def page(request):
        return HTMLResponse(PAGE)

    async def http_error(request, exc):  # 404, 405: JSON as every other answer
        return error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path} (this server "
                                               "has POST /translate, GET /health and GET /)", exc.headers)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.batcher = Batcher(service.translate, service.settings)
        task = asyncio.get_running_loop().create_task(service.batcher.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.get_running_loop().run_in_executor(None, service.batcher.close)

    routes = [Route("/translate", translate, methods=["POST"]), Route("/health", health, methods=["GET"]),
              Route("/", page, methods=["GET"])]
    middleware = [Middleware(Guard, hosts=hosts, origins=origins)]
    if origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(origins), allow_methods=["GET", "POST"],
                                     allow_headers=["Content-Type"]))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                     exception_handlers={HTTPException: http_error})


def _server_class(uvicorn):
    """uvicorn.Server that drains on the first SIGTERM / SIGINT (new requests 503, accepted ones
    answered, then exit) and stops at once on the second, and does not re-raise the signal
    afterwards (uvicorn does, which would end the process with 128 + signal instead of 0)."""

    class DrainingServer(uvicorn.Server):
        def __init__(self, config, service: Service):
            super().__init__(config)
            self.service = service
            self.signals: list[int] = []

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in old.items():
                    signal.signal(s, handler)

        def handle_exit(self, sig, frame):
            self.signals.append(sig)
            if self.service.draining:  # the second signal: stop now
                self.should_exit = self.force_exit = True
                return
            self.service.draining = True
            print(f"nmt serve: {signal.Signals(sig).name}: answering the {self.service.in_flight} requests in "
                  "progress, refusing new ones (a second signal stops at once)", file=sys.stderr, flush=True)

        async def on_tick(self, counter: int) -> bool:  # every 0.1 s
            if await super().on_tick(counter):
                return True
            if self.service.draining:
                self.service.stopping.set()  # requests still sending their body: 503 now
            return self.service.draining and self.service.in_flight == 0

    return DrainingServer


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), or a one-line UserError."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve_settings(*, port: int, max_lines: int, max_chars: int, max_beam: int, max_queue: int, timeout: float,
                   batch_window_ms: float, batch_lines: int, batching: bool, allow_origins: tuple[str, ...] = ()) -> Settings:
    """The server's Settings from `nmt serve`'s flags, each checked first (a one-line UserError naming the
    flag), --port and --allow-origin too."""
    given = {"max_lines": max_lines, "max_chars": max_chars, "max_beam": max_beam, "max_queue": max_queue,
             "batch_lines": batch_lines}
    for flag, value in given.items():
        if value < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1")
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    if not 0 < timeout < math.inf:
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if not 0 <= batch_window_ms < math.inf:
        raise UserError(f"--batch-window-ms must be a number of milliseconds, at least 0, got {batch_window_ms:g}")
    for origin in allow_origins:
        if origin != "*" and not _is_origin(origin):
            raise UserError(f"--allow-origin {origin}: not an origin (scheme://host[:port], e.g. https://example.com, "
                            "as browsers send it; * for any)")
    return Settings(max_lines=max_lines, max_chars=max_chars, max_beam=max_beam, max_queue=max_queue, timeout=timeout,
                    window=batch_window_ms / 1000, batch_lines=batch_lines, batching=batching)


def _is_origin(text: str) -> bool:
    """Whether `text` is a web origin as browsers send it in the Origin header: scheme://host[:port]."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (a malformed port raises ValueError)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and text == f"{parts.scheme}://{parts.netloc}"


def serve_command(path: str, *, engine: str = "auto", device: str = "auto", overrides: dict | None = None,
                  host: str = "127.0.0.1", port: int = 8000, settings: Settings = Settings(),
                  access_log: bool = False, allow_origins: tuple[str, ...] = (),
                  allow_hosts: tuple[str, ...] = ()) -> int:
    """`nmt serve`: load the model, listen on host:port, serve until SIGTERM / Ctrl-C. Returns 0
    after a drain; a second signal ends the process at once with 128 + signal. access_log: one
    line per request on stdout (uvicorn's access log). allow_origins: origins whose web pages
    may POST (with CORS headers; "*": any); allow_hosts: Host header names accepted besides the
    listening address (see `allowed_hosts`). UserError when the server's own default search
    settings are over its limits."""
    _, uvicorn = require_stack()
    translator = Translator(path, engine=engine, device=device, **(overrides or {}))
    errors = over_limits(translator.decode, overrides or {}, settings.max_beam, translator.max_positions)
    if errors:
        raise UserError(f"the server's default search settings are over its limits: {errors[0]}")
    sock = listen(host, port)
    service = Service(translator, settings, os.path.basename(os.path.normpath(path)))
    app = build_app(service, allowed_hosts(host, allow_hosts), frozenset(allow_origins))
    config = uvicorn.Config(app, log_level="info" if access_log else "warning",
                            access_log=access_log, lifespan="on")
    server = _server_class(uvicorn)(config, service)
    shown = f"[{host}]" if ":" in host else host
    print(f"nmt serve: http://{shown}:{sock.getsockname()[1]}/ ({service.name}, {translator.engine}, batching "
          f"{'on' if settings.batching else 'off'}; Ctrl-C or SIGTERM stops)", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    sock.close()
    if server.force_exit and server.signals:  # a second signal: do not wait for the running call either
        print(f"nmt serve: stopped ({signal.Signals(server.signals[-1]).name} twice)", file=sys.stderr, flush=True)
        os._exit(128 + server.signals[-1])  # (the interpreter's exit would join the translating thread)
    print("nmt serve: stopped", file=sys.stderr, flush=True)
    return 0

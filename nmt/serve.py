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
- GET /: a page to try the model (nmt/serve_page.py).

Each request is checked in the event loop (JSON shape, limits, decode options validated as
`nmt translate` validates its flags: the same one-line messages) and queued for the batcher
(nmt/batcher.py), which translates requests that arrive together in one `nmt.Translator` call
in a worker thread. Errors: 400 bad JSON or options, 413 too many lines or characters, 503 full
queue (Retry-After) or shutting down, 504 time limit passed, 500 a failure in the model. A
request can set only the decode keys in REQUEST_KEYS: the server-wide ones (SERVER_KEYS) are
fixed when it starts, and no request names a file or changes the server's state.

SIGTERM or Ctrl-C: new requests get 503, the requests already accepted are answered, then the
process exits 0; a second signal exits at once (128 + signal). The ASGI stack (Starlette, uvicorn)
is the optional extra `serve` and is imported only here, when the server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import sys
import threading
from typing import Any

from nmt.batcher import Batcher, Job, Settings
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


class RequestError(Exception):
    """A request the server refuses: HTTP status and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------- checking a request

def parse_request(body: bytes, settings: Settings) -> tuple[list[str], list[str] | None, dict]:
    """(lines, prefixes or None, decode options) of a POST /translate body, or RequestError."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON: {e}") from None
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
    400 with the messages `nmt translate` gives for the same flags."""
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
    for key in ("beam_size", "nbest"):
        if getattr(decode, key) > settings.max_beam:
            raise RequestError(400, f"{key} {getattr(decode, key)} is over this server's limit "
                                    f"{settings.max_beam} (nmt serve --max-beam)")
    return decode


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


class Service:
    """What the app serves: the translator, the settings, the batcher (made when the event loop
    runs), whether it is shutting down, and how many requests it has accepted but not answered."""

    def __init__(self, translator, settings: Settings, name: str):
        self.translator, self.settings, self.name = translator, settings, name
        self.batcher: Batcher | None = None
        self.draining = False
        self.in_flight = 0

    def translate(self, lines, prefixes, line_numbers, options):
        """One call of the translator (the batcher runs it in its worker thread)."""
        return self.translator.translate(lines, prefixes=prefixes, line_numbers=line_numbers, **options)

    def health(self) -> dict:
        stats = vars(self.batcher.stats) if self.batcher else {}
        return {"status": "draining" if self.draining else "ok", "model": self.name,
                "engine": self.translator.engine, "batching": self.settings.batching,
                "queued": self.batcher.queue.qsize() if self.batcher else 0, "in_flight": self.in_flight,
                "request_keys": list(REQUEST_KEYS), **stats}

    async def answer(self, body: bytes) -> dict:
        """The response body for a POST /translate body, or RequestError."""
        lines, prefixes, options = parse_request(body, self.settings)
        decode = check_options(self.translator, options, self.settings)
        loop = asyncio.get_running_loop()
        job = Job(lines, prefixes, options, decode, loop.create_future(), loop.time())
        try:
            self.batcher.submit(job)
        except asyncio.QueueFull:
            raise RequestError(503, f"the server is busy ({self.settings.max_queue} requests queued: nmt serve "
                                    "--max-queue); retry later") from None
        try:
            results = await asyncio.wait_for(job.future, self.settings.timeout)
        except asyncio.TimeoutError:
            raise RequestError(504, f"not translated within {self.settings.timeout:g} s (nmt serve --timeout)") \
                from None
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


def build_app(service: Service):
    """The Starlette app over `service` (the batcher task runs while the app does)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    from nmt.serve_page import PAGE

    def error(status: int, message: str, **headers: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers or None)

    async def translate(request):
        if service.draining:
            return error(503, "the server is shutting down", Connection="close")
        service.in_flight += 1
        try:
            # JSON escapes take up to 12 bytes per character (a surrogate pair \\uXXXX\\uXXXX)
            body = await _read_body(request, 12 * service.settings.max_chars + 65536)
            return JSONResponse(await service.answer(body))
        except RequestError as e:
            return error(e.status, str(e), **({"Retry-After": RETRY_AFTER} if e.status == 503 else {}))
        except Exception as e:  # a failure in the model: logged with its traceback, answered 500
            import traceback

            traceback.print_exc()
            return error(500, f"internal error: {type(e).__name__}: {e}")
        finally:
            service.in_flight -= 1

    async def health(request):
        return JSONResponse(service.health(), status_code=503 if service.draining else 200)

    async def page(request):
        return HTMLResponse(PAGE)

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
    return Starlette(routes=routes, lifespan=lifespan)


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
            print(f"nmt serve: {signal.Signals(sig).name}: answering the {self.service.in_flight} accepted "
                  "requests, refusing new ones (a second signal stops at once)", file=sys.stderr, flush=True)

        async def on_tick(self, counter: int) -> bool:
            if await super().on_tick(counter):
                return True
            return self.service.draining and self.service.in_flight == 0

    return DrainingServer


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), or a one-line UserError."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve_command(path: str, *, engine: str = "auto", device: str = "auto", overrides: dict | None = None,
                  host: str = "127.0.0.1", port: int = 8000, settings: Settings = Settings(),
                  access_log: bool = False) -> int:
    """`nmt serve`: load the model, listen on host:port, serve until SIGTERM / Ctrl-C. Returns 0
    after a drain; a second signal ends the process at once with 128 + signal."""
    from nmt.api import Translator

    _, uvicorn = require_stack()
    translator = Translator(path, engine=engine, device=device, **(overrides or {}))
    sock = listen(host, port)
    service = Service(translator, settings, os.path.basename(os.path.normpath(path)))
    config = uvicorn.Config(build_app(service), log_level="info" if access_log else "warning",
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

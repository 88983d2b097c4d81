"""`nmt serve`: a translation server over HTTP that batches across requests.

    nmt serve --checkpoint runs/quickstart/checkpoints/best.pt --port 8000
    curl -s localhost:8000/translate -d '{"text": ["Hola."], "options": {"beam_size": 4}}'

Endpoints:
- POST /translate `{"text": [line, ...], "options": {decode key: value}, "prefix": [line, ...]}` ->
  `{"translations": [{"text", "score", "log_prob", "finished", "truncated", ...}, ...]}`, one item
  per line in input order ("nbest", "alignment", "protected", "prefix_truncated" where asked). With
  `"stream": true`: JSON lines (application/x-ndjson), one item per line as soon as it is ready, then
  `{"done": true, "lines": n}`, or `{"error", "status"}` for a failure after the answer started.
- GET /health: 200 and the server's counters while it serves, 503 while it shuts down.
- GET /metrics: Prometheus' text format (nmt/commands/serve_metrics.py).
- GET /: a page to try the model (nmt/commands/serve_page.py).

Each request is checked in the event loop (JSON shape, limits, decode options with `nmt translate`'s
messages) and queued for the batcher (nmt/commands/batcher.py), which translates requests that
arrive together in one `nmt.Translator` call in a worker thread; with --scheduling step (the default)
calls run at once while their lines and source tokens stay within --batch-lines and --max-batch-tokens,
their decoding steps joined (nmt/search/joining.py; on CPU as many steps at once as torch has threads, each
on one: `_one_thread_each`; CTranslate2: taking turns between batches; each call searches in batches of
--max-batch-size sentences and --batch-tokens tokens, as `nmt translate` does).
Errors are one JSON line
`{"error": ...}`: 400 bad request or Host header, 403 a cross-origin POST not allowed by
--allow-origin, 404 / 405, 408 body too slow, 413 too large, 503 full queue or shutting down, 504
time limit passed, 500 a model failure. A request sets only the decode keys in REQUEST_KEYS.
A request past its time limit (counted from its arrival), or whose client went away, leaves the
queue at once, and its call stops at the next decoding step.

SIGTERM or Ctrl-C: new requests get 503, accepted ones are answered, then exit 0; a second signal
exits at once (128 + signal). Starlette, uvicorn and prometheus_client (the extra `serve`) are imported
only when the server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit

from nmt.api import Translator
from nmt.commands.batcher import Settings
from nmt.commands.serve_app import CLOSE_WAIT, Service, allowed_hosts, build_app
from nmt.commands.serve_request import over_limits
from nmt.errors import UserError


def require_stack():
    """(starlette, uvicorn), or a one-line UserError naming the extra to install (prometheus_client too)."""
    try:
        import starlette  # noqa: F401
        import uvicorn
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise UserError(f"nmt serve needs the optional extra 'serve' ({e.name} is not installed): "
                        "pip install -e \".[serve]\"") from None
    return starlette, uvicorn


def _server_class(uvicorn):
    """uvicorn.Server that drains on the first SIGTERM / SIGINT (new requests 503, accepted ones
    answered, then exit) and stops at once on the second (the requests in progress answered 503 in
    JSON first), and does not re-raise the signal afterwards (uvicorn does, which would end the
    process with 128 + signal instead of 0)."""

    class DrainingServer(uvicorn.Server):
        def __init__(self, config, service: Service):
            super().__init__(config)
            self.service = service
            self.signals: list[int] = []
            self.closing = False  # the drain is over: the app closes (its running calls stop, CLOSE_WAIT)

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
            if self.service.draining and self.closing:  # a second signal while the app closes: end here
                print(f"nmt serve: stopped ({signal.Signals(sig).name} twice)", file=sys.stderr, flush=True)
                os._exit(128 + sig)
            if self.service.draining:  # the second signal: stop now
                self.should_exit = self.force_exit = True
                return
            self.service.draining = True
            print(f"nmt serve: {signal.Signals(sig).name}: answering the {self.service.in_flight} requests in "
                  "progress, refusing new ones (a second signal stops at once)", file=sys.stderr, flush=True)

        async def shutdown(self, sockets=None) -> None:
            if not self.force_exit:
                self.closing = True
                await super().shutdown(sockets)
                return
            # the second signal: the requests in progress are answered (503, JSON), the connections closed, and
            # the process ends here, waiting neither for the running call nor for the event loop's teardown
            # (which would cancel the app's tasks, and log their tracebacks)
            self.service.stopped.set()
            for _ in range(100):  # (each answers at once; at most 1 s)
                if not self.service.in_flight:
                    break
                await asyncio.sleep(0.01)
            await super().shutdown(sockets)  # (sends what was answered)
            print(f"nmt serve: stopped ({signal.Signals(self.signals[-1]).name} twice)", file=sys.stderr, flush=True)
            os._exit(128 + self.signals[-1])  # (the interpreter's exit would join the translating thread)

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


@dataclass(frozen=True)
class ServeOptions:
    """`nmt serve`'s flags: the model and its default search settings, where to listen, the limits."""

    checkpoint: str  # a checkpoint file or an `nmt export` directory (--checkpoint, --model)
    engine: str = "auto"
    device: str = "auto"
    overrides: dict = field(default_factory=dict)  # {decode key: value}: the server's default search settings
    host: str = "127.0.0.1"
    port: int = 8000  # 0: a free one
    access_log: bool = False  # one line per request on stdout (uvicorn's access log)
    allow_origins: tuple[str, ...] = ()  # origins whose web pages may POST (CORS; "*": any)
    allow_hosts: tuple[str, ...] = ()  # Host header names accepted besides the address (`allowed_hosts`)
    max_lines: int = 256
    max_chars: int = 100_000
    max_beam: int = 16
    max_queue: int = 256
    timeout: float = 60.0  # seconds
    batch_window_ms: float = 5.0
    batch_lines: int = 1024
    batching: bool = True
    scheduling: str = "step"
    max_batch_tokens: int = 32768


def serve_settings(opts: ServeOptions) -> Settings:
    """The server's Settings from `nmt serve`'s flags, each checked first (a one-line UserError naming the
    flag), --port and --allow-origin too."""
    given = {"max_lines": opts.max_lines, "max_chars": opts.max_chars, "max_beam": opts.max_beam,
             "max_queue": opts.max_queue, "batch_lines": opts.batch_lines, "max_batch_tokens": opts.max_batch_tokens}
    for flag, value in given.items():
        if value < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1")
    if not 0 <= opts.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {opts.port}")
    if not 0 < opts.timeout < math.inf:
        raise UserError(f"--timeout must be a positive number of seconds, got {opts.timeout:g}")
    if not 0 <= opts.batch_window_ms < math.inf:
        raise UserError(f"--batch-window-ms must be a number of milliseconds, at least 0, got {opts.batch_window_ms:g}")
    for origin in opts.allow_origins:
        if origin != "*" and not _is_origin(origin):
            raise UserError(f"--allow-origin {origin}: not an origin (scheme://host[:port], e.g. https://example.com, "
                            "as browsers send it; * for any)")
    if opts.scheduling not in ("step", "call"):
        raise UserError(f"--scheduling must be step or call, got {opts.scheduling!r}")
    return Settings(**given, timeout=opts.timeout, window=opts.batch_window_ms / 1000, batching=opts.batching,
                    scheduling=opts.scheduling)


def _is_origin(text: str) -> bool:
    """Whether `text` is a web origin as browsers send it in the Origin header: scheme://host[:port]."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (a malformed port raises ValueError)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and text == f"{parts.scheme}://{parts.netloc}"


@contextlib.contextmanager
def _one_thread_each(translator: Translator, step: bool) -> Iterator[None]:
    """While the server runs with step scheduling on CPU: as many joined decoding steps at once as torch has CPU
    threads (`Translator.parallel_steps`), and every thread that computes, on one of them (no OpenMP team whose
    threads wait for each other between a step's small operations: BENCHMARKS.md "Serving")."""
    import torch

    threads = torch.get_num_threads()
    if not (step and threads > 1 and translator.parallel_steps(threads)):
        yield
        return
    torch.set_num_threads(1)  # (read by each thread at its first operation)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def serve_command(opts: ServeOptions) -> int:
    """`nmt serve`: load the model, listen on host:port, serve until SIGTERM / Ctrl-C. Returns 0
    after a drain; a second signal ends the process at once with 128 + signal. UserError when the
    server's own default search settings are over its limits."""
    settings = serve_settings(opts)
    _, uvicorn = require_stack()
    path, host, access_log = opts.checkpoint, opts.host, opts.access_log
    translator = Translator(path, engine=opts.engine, device=opts.device, **opts.overrides)
    if settings.scheduling == "step" and translator.decode.workers > 1 and not translator.shares_steps():
        raise UserError("--workers applies to --scheduling call with the PyTorch engine on CPU (with step scheduling "
                        "the calls' decoding steps join, as many steps at once as torch has threads, each on one)")
    errors = over_limits(translator.decode, opts.overrides, settings.max_beam, translator.max_positions)
    if errors:
        raise UserError(f"the server's default search settings are over its limits: {errors[0]}")
    sock = listen(host, opts.port)
    service = Service(translator, settings, os.path.basename(os.path.normpath(path)))
    app = build_app(service, allowed_hosts(host, opts.allow_hosts), frozenset(opts.allow_origins))
    config = uvicorn.Config(app, log_level="info" if access_log else "warning",
                            access_log=access_log, lifespan="on")
    server = _server_class(uvicorn)(config, service)
    shown = f"[{host}]" if ":" in host else host
    print(f"nmt serve: http://{shown}:{sock.getsockname()[1]}/ ({service.name}, {translator.engine}, batching "
          f"{'on' if settings.batching else 'off'}, scheduling {settings.scheduling}; Ctrl-C or SIGTERM stops)",
          file=sys.stderr, flush=True)
    with _one_thread_each(translator, settings.scheduling == "step"):
        server.run(sockets=[sock])  # (a second signal ends the process in it: DrainingServer.shutdown)
    sock.close()
    if service.left_running:  # the interpreter's exit would wait for that call, answered to nobody
        print(f"nmt serve: stopped (a call of abandoned requests still ran after {CLOSE_WAIT:g} s: not waited for)",
              file=sys.stderr, flush=True)
        os._exit(0)
    print("nmt serve: stopped", file=sys.stderr, flush=True)
    return 0

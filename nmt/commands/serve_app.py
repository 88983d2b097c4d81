"""The HTTP app of `nmt serve` (nmt/commands/serve.py): the service behind it (the translator, the batcher, the
drain), the Host and Origin policy, and the Starlette routes. Starlette is imported when the app is built."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import json
import traceback
from typing import Any
from urllib.parse import urlsplit

from nmt.commands.batcher import Batcher, Job, Settings
from nmt.commands.serve_metrics import Metrics
from nmt.commands.serve_request import (REQUEST_KEYS, RequestError, check_options, parse_request, request_message,
                                        result_json)
from nmt.errors import UserError

RETRY_AFTER = "1"  # seconds, with 503 for a full queue
CLIENT_GONE = 499  # the status counted for a request whose client went away (nginx's; nobody reads it)
ANY_ADDRESS = ("0.0.0.0", "::", "")  # --host values that listen on every interface (any Host header)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")  # the names of this machine, for a loopback --host
CLOSE_WAIT = 5.0  # seconds a stopping server waits for the running calls (of requests nobody waits for any more)


class ClientGone(Exception):
    """The client closed its connection before its answer."""


class Service:
    """What the app serves: the translator, the settings, the batcher (made when the event loop runs),
    whether it shuts down (`draining`; `stopping` wakes the requests still sending their body; `stopped`,
    a second signal, answers the waiting ones 503), `in_flight`, the requests the drain waits for (a
    stream until its end), `left_running` (a call still running after CLOSE_WAIT when the app stopped), and the
    metrics of GET /metrics (nmt/commands/serve_metrics.py)."""

    def __init__(self, translator, settings: Settings, name: str):
        self.translator, self.settings, self.name = translator, settings, name
        self.batcher: Batcher | None = None
        self.draining = False
        self.stopping = asyncio.Event()
        self.stopped = asyncio.Event()
        self.in_flight = 0
        self.left_running = False
        self.metrics = Metrics(lambda: self.batcher.queued if self.batcher else 0, settings.batch_lines,
                               translator.step_counts)

    def translate(self, lines, prefixes, line_numbers, decode, cancel, glossary=None, on_line=None):
        """One call of the translator with a request's validated settings and glossary (the batcher runs
        it in a worker thread). Scheduling "step": one decode worker (the calls' steps join, as many steps at once
        as torch has CPU threads, and no call changes the process' thread setting while others run)."""
        if self.settings.scheduling == "step":
            decode = dataclasses.replace(decode, workers=1)
        with self.metrics.call(len(lines)):
            return self.translator.translate(lines, prefixes=prefixes, line_numbers=line_numbers, cancel=cancel,
                                             settings=decode, glossary=glossary, on_line=on_line)

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        """The app's lifespan: the batcher runs while the app does, and is closed after it."""
        self.batcher = Batcher(self.translate, self.settings)
        task = asyncio.get_running_loop().create_task(self.batcher.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            closed = functools.partial(self.batcher.close, CLOSE_WAIT)
            if not await asyncio.get_running_loop().run_in_executor(None, closed):
                self.left_running = True  # (a call of requests nobody waits for: serve_command exits without it)

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

    def accept(self, body: bytes) -> tuple[Job, bool]:
        """(the job of a POST /translate body, queued for the batcher; whether its answer is streamed), or
        RequestError: 400 or 413 for the body or its options, 503 when the queue is full."""
        request = parse_request(body, self.settings)
        decode = check_options(self.translator, request.options, self.settings)
        if request.glossary is not None:
            try:
                self.translator.check_glossary(decode, request.glossary)
            except UserError as e:
                raise RequestError(400, request_message(e)) from None
        loop = asyncio.get_running_loop()
        tokens = sum(self.translator.source_tokens(request.lines, decode)) if self.settings.scheduling == "step" else 0
        job = Job(request.lines, request.prefixes, decode, loop.create_future(), loop.time(), request.glossary, tokens,
                  asyncio.Queue() if request.stream else None)
        try:
            self.batcher.submit(job)
        except asyncio.QueueFull:
            raise RequestError(503, f"the server is busy ({self.settings.max_queue} requests queued: nmt serve "
                                    "--max-queue); retry later", {"Retry-After": RETRY_AFTER}) from None
        return job, request.stream

    async def results(self, job: Job, arrived: float, deadline: float, gone: asyncio.Future) -> list:
        """A queued job's TranslationResults, or RequestError; ClientGone when `gone` (the client's
        disconnection) comes first. A request not answered by `deadline` (loop time; `arrived`: when it
        came, for the metrics), whose client went away, or still waiting when the server stops
        (`stopped`: RequestError 503) is abandoned: the batcher frees its slot, or stops its call."""
        loop = asyncio.get_running_loop()
        stopped = asyncio.ensure_future(self.stopped.wait())
        try:
            await asyncio.wait({job.future, gone, stopped}, timeout=max(0.0, deadline - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not job.future.done():
            job.future.cancel()  # abandoned
            if gone.done():
                raise ClientGone()
            if self.stopped.is_set():
                raise RequestError(503, "the server is stopping (a second signal): not translated",
                                   {"Connection": "close"})
            raise RequestError(504, f"not translated within {self.settings.timeout:g} s (nmt serve --timeout)")
        try:
            results = job.future.result()
        except UserError as e:
            raise RequestError(400, request_message(e)) from None
        done = loop.time()
        self.metrics.served(results, done - arrived, (job.first_line or done) - arrived)
        return results

    async def answer(self, job: Job, arrived: float, deadline: float, gone: asyncio.Future) -> dict:
        """The JSON answer of a queued job: `{"translations": [...]}` (`results` says when it fails)."""
        return {"translations": _items(job, await self.results(job, arrived, deadline, gone))}

    async def stream(self, job: Job, arrived: float, deadline: float, gone: asyncio.Future, send) -> int:
        """Send the streamed answer of a queued job on ASGI `send`: 200 (application/x-ndjson) at once, then one
        JSON object per line, in order, each as soon as it and those before it are translated, and last
        `{"done": true, "lines": n}`; a failure after the start ends it with `{"error": message, "status": n}`.
        Returns the status it counts as: 200, the failure's, 499 when the client went away."""
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache")]})
        whole = asyncio.ensure_future(self.results(job, arrived, deadline, gone))
        ready: dict[int, Any] = {}  # lines final but not sent (a line before them is not final yet)
        sent = 0
        try:
            while not whole.done():
                line = asyncio.ensure_future(job.ready.get())
                try:
                    await asyncio.wait({whole, line}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    line.cancel()
                if line.done() and not line.cancelled():
                    k, result = line.result()
                    if k >= sent:  # (a call run again hands its lines over again)
                        ready[k] = result
                    while sent in ready:
                        if job.first_line is None:
                            job.first_line = asyncio.get_running_loop().time()
                        await _send_line(send, result_json(ready.pop(sent), job.decode, job.prefixes is not None))
                        sent += 1
            results = whole.result()
        except Exception as e:
            status, message, _ = failure(e)
            if status != CLIENT_GONE:
                await _send_line(send, {"error": message, "status": status}, more=False)
            return status
        finally:
            if not whole.done():  # (the client went away while a line was sent): the request is abandoned
                whole.cancel()
                job.future.cancel()
        for item in _items(job, results[sent:]):
            await _send_line(send, item)
        await _send_line(send, {"done": True, "lines": len(results)}, more=False)
        return 200


def failure(error: Exception) -> tuple[int, str, dict | None]:
    """(status, one-line message, headers) of a failed request: a RequestError's own; CLIENT_GONE when the
    client went away; 500 for a failure in the model (logged with its traceback)."""
    from starlette.requests import ClientDisconnect

    if isinstance(error, RequestError):
        return error.status, str(error), error.headers
    if isinstance(error, (ClientGone, ClientDisconnect)):
        return CLIENT_GONE, "the client went away", None
    traceback.print_exception(error)
    return 500, f"internal error: {type(error).__name__}: {error}", None


def _items(job: Job, results) -> list[dict]:
    """The answer's item of each of a job's TranslationResults."""
    return [result_json(r, job.decode, job.prefixes is not None) for r in results]


async def _send_line(send, item: dict, more: bool = True) -> None:
    """One object of a streamed answer: a line of ASCII JSON."""
    body = json.dumps(item, separators=(",", ":")).encode() + b"\n"
    await send({"type": "http.response.body", "body": body, "more_body": more})


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
    """ASGI middleware: the server's Host and Origin policy. A Host header not in `hosts` (None: any) gets
    400; a request other than GET / HEAD whose Origin is neither the server's own nor in `origins` ("*":
    any) gets 403 before the app reads it, so a page of another site cannot make a visitor's browser post
    to the server. Clients that send no Origin (curl) are not affected."""

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


class Streamed:
    """The ASGI answer of a streamed request: `send_all(send)` (Service.stream, which returns the status it
    counts as), then `done(status)`, however it ends."""

    def __init__(self, send_all, done):
        self.send_all, self.done = send_all, done

    async def __call__(self, scope, receive, send):
        status = CLIENT_GONE  # (cancelled: the server stops at once)
        try:
            status = await self.send_all(send)
        finally:
            self.done(status)


async def post_translate(service: Service, request):
    """POST /translate: the JSON answer, a Streamed one (`"stream": true`), or a JSON error. The request counts
    in `in_flight` and in the metrics until its answer is whole."""
    from starlette.responses import JSONResponse, Response

    loop = asyncio.get_running_loop()
    arrived = loop.time()
    if service.draining:
        service.metrics.requests.labels("503").inc()
        return error_response(503, "the server is shutting down", {"Connection": "close"})
    service.in_flight += 1
    deadline = arrived + service.settings.timeout
    gone, status, streamed = None, 503, False  # (503: cancelled, the server stops at once)

    def done(status: int) -> None:
        if gone is not None:
            gone.cancel()
        service.in_flight -= 1
        service.metrics.requests.labels(str(status)).inc()
        if status == 200:
            service.metrics.request_time.observe(loop.time() - arrived)

    try:
        body = await service.receive(request, deadline)
        gone = asyncio.ensure_future(_disconnected(request))
        job, stream = service.accept(body)
        if stream:
            streamed = True
            return Streamed(lambda send: service.stream(job, arrived, deadline, gone, send), done)
        answer = await service.answer(job, arrived, deadline, gone)
        status = 200
        return JSONResponse(answer)
    except Exception as e:
        status, message, headers = failure(e)
        if status == CLIENT_GONE:  # nobody reads the answer (uvicorn sends nothing)
            return Response(status_code=204)
        return error_response(status, message, headers)
    finally:
        if not streamed:
            done(status)


def build_app(service: Service, hosts: frozenset[str] | None = None, origins: frozenset[str] = frozenset()):
    """The Starlette app over `service` (the batcher task runs while the app does); `hosts` and
    `origins`: the Host and Origin policy (Guard), with CORS headers for `origins`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from nmt.commands.serve_page import PAGE

    async def translate_route(request):
        return await post_translate(service, request)

    async def health(request):
        return JSONResponse(service.health(), status_code=503 if service.draining else 200)

    async def metrics(request):
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    async def page(request):
        return HTMLResponse(PAGE)

    async def http_error(request, exc):  # 404, 405: JSON as every other answer
        return error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path} (this server "
                                               "has POST /translate, GET /health, GET /metrics and GET /)", exc.headers)

    routes = [Route("/translate", translate_route, methods=["POST"]), Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]), Route("/", page, methods=["GET"])]
    middleware = [Middleware(Guard, hosts=hosts, origins=origins)]
    if origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(origins), allow_methods=["GET", "POST"],
                                     allow_headers=["Content-Type"]))
    return Starlette(routes=routes, lifespan=service.lifespan, middleware=middleware,
                     exception_handlers={HTTPException: http_error})

"""nmt serve: a real server process on a free localhost port, with a tiny model.

Every answer is compared with `nmt translate` (the command's own function, nmt.cli.main, on the
same lines and flags): greedy, beam, n-best, sampling with a seed, prefixes, alignment; concurrent
clients whose requests share calls (the server's own counters say so) still get exactly their
own results; a streamed answer (JSON lines) equals the whole one. Limits and errors (400, 403,
404, 405, 408, 413, 503, 504, all JSON), the Host and Origin policy, abandoned requests (time
limit, client gone, streamed or not: their slot freed, their call stopped), /health, /metrics
(read by prometheus_client's parser), the access log, the web page in a real headless browser,
SIGTERM draining, and the batcher's grouping and cancelling on its own (no HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from nmt import cli
from nmt.commands.batcher import MAX_WAIT, Batcher, Job, Settings, gather_wait, groups, merge
from nmt.config import DecodeConfig
from nmt.errors import Cancelled
from nmt.commands.serve_app import allowed_hosts

from helpers import make_pairs, make_tiny_checkpoint
from helpers import ROOT

pytest.importorskip("starlette", reason="nmt serve needs the optional extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="nmt serve needs the optional extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="nmt serve needs the optional extra: pip install -e '.[serve]'")

NBEST_LINE = re.compile(r"^(\d+) \|\|\| (.*) \|\|\| (-?\d+\.\d{4})$")


# --------------------------------------------------------------------------- a server process

class Server:
    """`nmt serve -c MODEL --port 0 ARGS` (ct2: `--engine ctranslate2 --model MODEL`) as a subprocess;
    its URL read from its first stderr line; its stderr lines in `log`, its stdout lines in `out`."""

    def __init__(self, model: str, *args: str, ct2: bool = False):
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
        what = ["--engine", "ctranslate2", "--model", model] if ct2 else ["-c", model]
        self.proc = subprocess.Popen([sys.executable, "-m", "nmt", "serve", *what, "--port", "0", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        self.out: list[str] = []
        first = self.proc.stderr.readline()
        match = re.search(r"http://[^/ ]+", first)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"nmt serve did not start: {first}{self.proc.stderr.read()}")
        self.url = match.group(0)
        self.port = int(self.url.rsplit(":", 1)[1])
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True).start()

    def request(self, path: str, body: bytes | None = None, timeout: float = 60, headers: dict | None = None,
                method: str | None = None) -> tuple[int, dict, dict]:
        """(status, headers (lower-case names), JSON body) of GET path, or POST path with body (or
        `method`: a body that is not JSON is given as text)."""
        req = urllib.request.Request(self.url + path, data=body, headers=headers or {},
                                     method=method or ("GET" if body is None else "POST"))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, answer_headers, answer = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, answer_headers, answer = e.code, e.headers, e.read()
        headers = {k.lower(): v for k, v in answer_headers.items()}
        json_body = headers.get("content-type") == "application/json" or method is None
        return status, headers, json.loads(answer) if json_body else answer.decode()

    def send(self, head: bytes, body: bytes = b"") -> socket.socket:
        """A raw client: a connection that has sent `head` (request line and headers) and `body`
        (all or part of it), to read from or close."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.sendall(head + b"\r\n\r\n" + body)
        return sock

    def post(self, body: bytes, length: int | None = None) -> socket.socket:
        """A raw POST /translate that has sent `body` of a declared `length` (default: all of it)."""
        length = len(body) if length is None else length
        return self.send(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(length).encode(), body)

    def translate(self, text, options=None, prefix=None, **kw) -> tuple[int, dict]:
        body = {"text": text}
        if options is not None:
            body["options"] = options
        if prefix is not None:
            body["prefix"] = prefix
        status, _, data = self.request("/translate", json.dumps(body).encode(), **kw)
        return status, data

    def health(self) -> dict:
        return self.request("/health")[2]

    def stream(self, body: dict, timeout: float = 60) -> tuple[int, str, list[dict]]:
        """(status, content type, the objects of its JSON lines) of POST /translate `body` with "stream": true."""
        req = urllib.request.Request(self.url + "/translate", data=json.dumps({**body, "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers["content-type"], [json.loads(line) for line in r.read().splitlines()]

    def metrics(self) -> dict[tuple, float]:
        """GET /metrics parsed by prometheus_client's own parser: {(sample name, *sorted labels): value}."""
        from prometheus_client.parser import text_string_to_metric_families

        status, headers, text = self.request("/metrics", method="GET")
        assert status == 200 and headers["content-type"].startswith("text/plain"), (status, headers)
        return {(s.name, *sorted(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


PAGE_ORIGIN = "http://page.example"  # a web site allowed to call the module's server (--allow-origin)


@pytest.fixture(scope="module")
def server(ckpt):
    """One server for the module: small limits (cheap 413s), a 50 ms window (visible sharing), one
    allowed origin, the access log. No client error leaves a traceback in its log."""
    s = Server(ckpt, "--max-lines", "40", "--max-chars", "2000", "--max-beam", "4", "--batch-window-ms", "50",
               "--allow-origin", PAGE_ORIGIN, "--access-log")
    yield s
    assert s.stop() == 0, "".join(s.log)
    assert "Traceback" not in "".join(s.log), "".join(s.log)


def _read_answer(sock: socket.socket) -> tuple[int, dict]:
    """(status, JSON body) of the answer on a raw connection (read until the server closes it or
    the body is complete)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


def _length(data: bytes) -> int:
    match = re.search(rb"content-length: (\d+)", data.split(b"\r\n\r\n", 1)[0], re.I)
    return int(match.group(1)) if match else 1 << 30


LINES = [p[0] for p in make_pairs(10, 5)] + ["", " ".join(p[0] for p in make_pairs(8, 6))]  # empty, truncated


def nmt_translate(ckpt, lines, options=None, prefix=None, tmp_path=None) -> list[str]:
    """The output lines of `nmt translate -c CKPT --quiet FLAGS` (the command's function) on `lines`."""
    directory = tmp_path or os.path.dirname(ckpt)
    src, out = os.path.join(directory, "in.txt"), os.path.join(directory, "out.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    argv = ["translate", "-c", ckpt, "-i", src, "-o", out, "--quiet"]
    for key, value in (options or {}).items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    if prefix is not None:
        with open(src + ".prefix", "w", encoding="utf-8") as f:
            f.write("".join(p + "\n" for p in prefix))
        argv += ["--prefix", src + ".prefix"]
    assert cli.main(argv) == 0
    with open(out, encoding="utf-8") as f:
        return f.read().splitlines()


def as_command_output(translations: list[dict], options: dict) -> list[str]:
    """The server's answer written as `nmt translate` writes its output."""
    if options.get("nbest", 1) > 1:
        return [f"{i} ||| {h['text']} ||| {h['score']:.4f}" for i, t in enumerate(translations) for h in t["nbest"]]
    if options.get("alignment"):
        return [f"{t['text']} ||| {t['alignment']}" for t in translations]
    return [t["text"] for t in translations]


# --------------------------------------------------------------------------- the contract

OPTION_SETS = [
    {},  # the checkpoint's decode section: beam 2
    {"beam_size": 1},
    {"beam_size": 2, "nbest": 2, "length_penalty_type": "average"},
    {"sampling": "topk", "topk": 3, "seed": 4, "nbest": 3},
    {"sampling": "topp", "topp": 0.9, "temperature": 1.5, "seed": 7},
    {"beam_size": 3, "no_repeat_ngram": 2, "min_len": 2},
    {"beam_size": 1, "alignment": True},
    {"beam_size": 2, "min_len": 22, "max_len_a": 0, "max_len_b": 23},  # the longest output the model can write
]


@pytest.mark.slow
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_answers_equal_nmt_translate(server, ckpt, options):
    status, data = server.translate(LINES, options)
    assert status == 200, data
    got = data["translations"]
    assert len(got) == len(LINES)
    assert as_command_output(got, options) == nmt_translate(ckpt, LINES, options)
    assert [t["truncated"] for t in got] == [False] * (len(LINES) - 1) + [True]
    assert got[-2]["text"] == "" and got[-2]["score"] == 0.0  # an empty line stays empty
    assert all(t["text"] == t.get("nbest", [t])[0]["text"] for t in got)


@pytest.mark.slow
def test_prefixes_equal_nmt_translate(server, ckpt):
    prefix = ["the", "", "the red", "", "the cat", "", "", "", "", "", "", "the"]
    status, data = server.translate(LINES, {"beam_size": 2}, prefix=prefix)
    assert status == 200, data
    texts = [t["text"] for t in data["translations"]]
    assert texts == nmt_translate(ckpt, LINES, {"beam_size": 2}, prefix=prefix)
    assert [t["prefix_truncated"] for t in data["translations"]] == [False] * len(LINES)
    assert texts[2].startswith("the red") and texts[4].startswith("the cat")


@pytest.mark.slow
def test_streamed_answers_equal_the_whole_answer_and_nmt_translate(server, ckpt):
    """`"stream": true`: JSON lines, one per input line in order, each the item the answer without it gives
    (which is nmt translate's), then the totals."""
    for options in ({"beam_size": 1}, {"beam_size": 2, "nbest": 2}):
        status, content_type, items = server.stream({"text": LINES, "options": options})
        assert (status, content_type) == (200, "application/x-ndjson")
        assert items[-1] == {"done": True, "lines": len(LINES)}
        status, whole = server.translate(LINES, options)
        assert status == 200 and items[:-1] == whole["translations"]
        assert as_command_output(items[:-1], options) == nmt_translate(ckpt, LINES, options)


@pytest.mark.slow
def test_metrics_count_what_was_served(server):
    """GET /metrics, read by prometheus_client's parser: after two answers of known lines (one streamed) and a
    refused request, the counters moved by exactly those (every output forced to 4 tokens), and the
    histograms by one per answer or call."""
    before = server.metrics()
    options = {"beam_size": 1, "min_len": 4, "max_len_a": 0, "max_len_b": 4}  # 4 tokens, no EOS
    status, data = server.translate(LINES[:5], options)
    assert status == 200 and not any(t["finished"] for t in data["translations"])
    assert server.stream({"text": LINES[5:8], "options": options})[0] == 200
    assert server.translate(["el sol"], {"beam_size": 9})[0] == 400
    after = server.metrics()
    delta = {key: value - before.get(key, 0) for key, value in after.items()}
    assert delta[("nmt_requests_total", ("status", "200"))] == 2
    assert delta[("nmt_requests_total", ("status", "400"))] == 1
    assert (delta[("nmt_lines_total",)], delta[("nmt_tokens_total",)]) == (8, 8 * 4)
    assert delta[("nmt_request_seconds_count",)] == delta[("nmt_time_to_first_line_seconds_count",)] == 2
    assert delta[("nmt_batch_fill_count",)] == 2 and delta[("nmt_batch_fill_sum",)] == pytest.approx(8 / 1024)
    assert after[("nmt_queue_length",)] == after[("nmt_running_lines",)] == 0
    assert delta[("nmt_decoding_rows_total",)] == 8 * 4  # each line one row for 4 steps (however batched)
    assert 8 <= delta[("nmt_decoding_steps_total",)] <= 8 * 4 and ("nmt_joined_decoding_steps_total",) in after
    assert after[("nmt_running_rows",)] == 0  # (nothing runs now)


@pytest.mark.slow
def test_concurrent_clients_share_calls_and_get_their_own_results(server, ckpt):
    """Requests sent at once by 12 threads with five kinds of options: several share one translate call (the
    server's counters), the calls run side by side, and each answer equals `nmt translate` on that request's
    lines alone (with sampling, a line's samples depend on its number within its own request)."""
    before = server.health()
    pairs = [p[0] for p in make_pairs(60, 11)]
    options = [{"sampling": "topk", "topk": 4, "seed": 3}, {"beam_size": 2}, {}, {"beam_size": 3, "no_repeat_ngram": 2},
               {"min_len": 3, "beam_size": 1}]
    requests = [(pairs[i * 5: i * 5 + 1 + i % 5], options[i % 5], None if i % 4 else ["the"] * (1 + i % 5))
                for i in range(12)]
    answers: list = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def client(i: int) -> None:
        lines, opts, prefix = requests[i]
        barrier.wait()
        answers[i] = server.translate(lines, opts, prefix)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = server.health()
    for (lines, opts, prefix), (status, data) in zip(requests, answers):
        assert status == 200, data
        assert [t["text"] for t in data["translations"]] == nmt_translate(ckpt, lines, opts, prefix)
    assert after["requests"] - before["requests"] == len(requests)
    assert after["calls"] - before["calls"] < len(requests)  # some requests shared a call
    assert after["shared_calls"] > before["shared_calls"] and after["largest_call"] >= 2


@pytest.mark.slow
@pytest.mark.parametrize("body, message", [
    (b"{not json", "the body is not JSON"),
    (b'["a"]', "must be a JSON object"),
    (b'{"text": "a sentence"}', "text must be a list of strings"),
    (b'{"text": ["a", 1]}', "text must be a list of strings"),
    (b'{"text": ["a\\nb"]}', "text[0] contains a line break"),
    (b'{"text": ["a"], "lines": ["b"]}', "unknown field 'lines'"),
    (b'{"text": ["a", "b"], "prefix": ["c"]}', "1 prefixes for 2 lines"),
    (b'{"text": ["a"], "options": [1]}', "options must be a JSON object"),
    (b'{"text": ["a"], "stream": "yes"}', "stream must be true or false"),
    (b'{"text": ["a"], "stream": true, "options": {"beam_size": 5}}', "beam_size 5 is over this server's limit 4"),
    (b'{"text": ["a"], "options": {"beam": 2}}', "unknown key 'decode.beam' - did you mean 'decode.beam_size'?"),
    (b'{"text": ["a"], "options": {"workers": 2}}', "option 'workers' is not set per request"),
    (b'{"text": ["a"], "options": {"batch_tokens": 9}}', "option 'batch_tokens' is not set per request"),
    (b'{"text": ["a"], "options": {"protect_pattern": "x+"}}', "option 'protect_pattern' is not set per request"),
    (b'{"text": ["a"], "options": {"beam_size": 5}}', "beam_size 5 is over this server's limit 4"),
    (b'{"text": ["a"], "options": {"glossary_beam_size": 8}}', "glossary_beam_size 8 is over this server's limit 4"),
    (b'{"text": ["a"], "options": {"protect": true}}', "protect needs a model trained with data.protect: true"),
    (b'{"text": ["a"], "options": {"tgt_lang": "de"}}', "this model translates into one language only"),
    (b'{"text": ["Hola \\ud800"]}', "text[0] is not Unicode text: a lone surrogate U+D800 at character 5"),
    (b'{"text": ["a", "b"], "prefix": ["", "\\udfff"]}', "prefix[1] is not Unicode text: a lone surrogate U+DFFF"),
    (b'{"text": ["a"], "options": {"\\ud800": 1}}', "unknown key 'decode.\ud800'"),  # the answer quotes it
    (b"[" * 20_000 + b"]" * 20_000, "JSON nested too deeply"),
    (b'{"text": ["a"], "options": {"seed": ' + b"[" * 20_000 + b"]" * 20_000 + b"}}", "JSON nested too deeply"),
    # the model's max_positions is 24: an output has at most 23 tokens, EOS included
    (b'{"text": ["a"], "options": {"min_len": 23}}', "min_len 23 is over this model's limit 22 (its outputs have "
                                                     "at most max_positions - 1 = 23 tokens, EOS included)"),
    (b'{"text": ["a"], "options": {"max_len_b": 1000}}', "max_len_b 1000 is over this model's limit 23"),
    (b'{"text": ["a"], "options": {"max_len_a": 23.5}}', "max_len_a 23.5 is over this model's limit 23"),
])
def test_bad_requests_get_400_with_one_line(server, body, message):
    status, headers, data = server.request("/translate", body)
    assert status == 400 and message in data["error"] and "\n" not in data["error"]
    assert headers["content-type"] == "application/json"


@pytest.mark.slow
def test_unknown_paths_and_methods_get_json(server):
    status, _, data = server.request("/translations", b'{"text": ["el sol"]}')
    assert status == 404 and data["error"].startswith("Not Found: POST /translations (this server has POST ")
    status, headers, data = server.request("/translate")
    assert status == 405 and data["error"].startswith("Method Not Allowed: GET /translate") and headers["allow"] == "POST"


@pytest.mark.slow
def test_host_and_origin_policy(server):
    """Only this machine's names in the Host header (the server listens on 127.0.0.1: no DNS
    rebinding); POSTs from web pages of other sites refused (403) unless --allow-origin names
    them, which also gives them CORS headers; the server's own page and clients without an
    Origin header (curl) are served."""
    body = b'{"text": ["el sol"]}'
    for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}"):
        assert server.request("/translate", body, headers={"Host": host})[0] == 200, host
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.evil.example"):
        status, _, data = server.request("/translate", body, headers={"Host": host})
        assert status == 400 and data["error"].startswith(f"the Host header {host!r} is not a name of this server")
    status, _, data = server.request("/translate", body, headers={"Origin": "http://evil.example"})
    assert status == 403 and data["error"] == ("a cross-origin request from 'http://evil.example' (nmt serve "
                                               "--allow-origin http://evil.example lets web pages of that origin "
                                               "call this server)")
    status, headers, _ = server.request("/translate", body, headers={"Origin": server.url})  # the server's own page
    assert status == 200 and "access-control-allow-origin" not in headers
    status, headers, _ = server.request("/translate", body, headers={"Origin": PAGE_ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == PAGE_ORIGIN
    status, headers, _ = server.request("/translate", method="OPTIONS", headers={  # the browser's preflight
        "Origin": PAGE_ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert status == 200 and headers["access-control-allow-origin"] == PAGE_ORIGIN  # (its body: Starlette's "OK")
    assert "POST" in headers["access-control-allow-methods"]
    assert server.request("/health", headers={"Origin": "http://evil.example"})[0] == 200  # reads change nothing
    status, _, data = server.request("/metrics", headers={"Host": "evil.example"})
    assert status == 400 and data["error"].startswith("the Host header 'evil.example' is not a name of this server")


def test_allowed_hosts():
    assert allowed_hosts("0.0.0.0") is None and allowed_hosts("::") is None  # every interface: any name
    assert allowed_hosts("127.0.0.1") == allowed_hosts("::1") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("10.1.2.3", ("mt.example.com", "[fe80::1]")) == {"10.1.2.3", "mt.example.com", "fe80::1"}
    assert allowed_hosts("10.1.2.3", ("*",)) is None


@pytest.mark.slow
def test_access_log_is_on_stdout_as_its_help_says(server, capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "--access-log log every request, one line each, on stdout" in " ".join(capsys.readouterr().out.split())
    server.request("/health?from=access-log-test")
    end = time.monotonic() + 30
    while not any('"GET /health?from=access-log-test HTTP/1.1" 200' in line for line in server.out):
        assert time.monotonic() < end, server.out
        time.sleep(0.02)
    assert "access-log-test" not in "".join(server.log)


@pytest.mark.slow
@pytest.mark.parametrize("options, flags", [
    ({"beam_size": 0}, ["--beam", "0"]),
    ({"nbest": 3, "beam_size": 2}, ["--nbest", "3", "--beam", "2"]),
    ({"topp": 1.5, "sampling": "topp"}, ["--topp", "1.5", "--sampling", "topp"]),
])
def test_option_errors_are_the_command_line_errors(server, ckpt, capsys, options, flags):
    status, data = server.translate(["el sol"], options)
    assert cli.main(["translate", "-c", ckpt, "-i", os.devnull, "--quiet", *flags]) == cli.EXIT_USAGE
    command_error = capsys.readouterr().err.strip()
    assert status == 400 and command_error == f"nmt translate: error: {data['error']}"


@pytest.mark.slow
def test_too_large_requests_get_413(server):
    status, data = server.translate(["el sol"] * 41)
    assert status == 413 and "41 lines in one request (this server takes at most 40" in data["error"]
    status, data = server.translate(["el sol " * 200, "la luna " * 200])
    assert status == 413 and "3000 characters in one request" in data["error"]
    status, _, data = server.request("/translate", b'{"text": ["' + b"x" * 200_000 + b'"]}')
    assert status == 413 and "bytes" in data["error"]
    status, _, data = server.request("/translate", json.dumps({"text": ["el sol"] * 41, "stream": True}).encode())
    assert status == 413 and "41 lines in one request" in data["error"]  # (before a stream starts: as without it)
    assert server.translate(["el sol"] * 40)[0] == 200  # at the limits


@pytest.mark.slow
def test_health_and_page(server):
    status, _, health = server.request("/health")
    assert status == 200 and health["status"] == "ok" and health["engine"] == "torch"
    assert health["model"] == "tiny.pt" and health["batching"] is True
    assert "beam_size" in health["request_keys"] and "workers" not in health["request_keys"]
    with urllib.request.urlopen(server.url + "/", timeout=30) as r:
        page = r.read().decode()
    assert r.headers["content-type"].startswith("text/html")
    assert 'id="source"' in page and 'id="translate"' in page and 'id="output"' in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: no external address


@pytest.fixture(scope="module")
def slow_ckpt(tmp_path_factory) -> str:
    """A tiny model that accepts 4,096 positions: LONG options force a search of thousands of steps."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("slow") / "slow.pt"), max_positions=4096)


def long_search(steps: int) -> dict:
    return {"min_len": steps, "max_len_a": 0, "max_len_b": steps, "beam_size": 4}


@pytest.mark.slow
def test_full_queue_503_and_time_limit_504(slow_ckpt):
    """A long search (4,000 forced steps, seconds here) keeps the model busy (--batch-lines 1: one line
    translated at a time); two more fill a queue of 2; the next request gets 503 with Retry-After. The time
    limit (0.5 s) passes for all three: 504 (each call stops when its requests' time is up)."""
    server = Server(slow_ckpt, "--max-queue", "2", "--timeout", "0.5", "--batch-lines", "1")
    try:
        answers: dict = {}

        def client(i: int) -> None:
            answers[i] = server.translate(["el sol"], long_search(4000))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        threads[0].start()
        _wait_for(server, lambda h: h["translating"] == 1)
        for t in threads[1:]:
            t.start()
        _wait_for(server, lambda h: h["queued"] == 2)
        status, headers, data = server.request("/translate", b'{"text": ["la luna"]}')
        assert status == 503 and headers["retry-after"] == "1" and "busy" in data["error"]
        for t in threads:
            t.join()
        for status, data in answers.values():
            assert status == 504 and "not translated within 0.5 s" in data["error"]
        _wait_for(server, lambda h: h["expired"] == 3 and h["translating"] == 0 and h["queued"] == 0)
    finally:
        server.proc.kill()  # (a drain would wait for the long search; draining has its own test)
        server.proc.wait()


@pytest.mark.slow
def test_sigterm_drains_accepted_requests_then_exits_0(slow_ckpt):
    """SIGTERM while a long search runs: new requests and /health get 503, and so does a request
    still sending its body (a slow upload does not hold the shutdown); the running request is
    answered (equal to nmt translate), and the process exits 0."""
    server = Server(slow_ckpt)
    try:
        answer: list = []
        t = threading.Thread(target=lambda: answer.append(server.translate(["el sol"], long_search(2000))))
        t.start()
        _wait_for(server, lambda h: h["translating"] == 1)
        upload = server.post(b'{"text": ["la', length=100)
        _wait_for(server, lambda h: h["in_flight"] == 2)
        server.proc.send_signal(signal.SIGTERM)
        _wait_for_log(server, "SIGTERM: answering the 2 requests in progress")
        assert _read_answer(upload) == (503, {"error": "the server is shutting down"})
        upload.close()
        status, _, data = server.request("/translate", b'{"text": ["la luna"]}')
        assert status == 503 and "shutting down" in data["error"]
        assert server.request("/health")[0] == 503
        t.join()
        assert server.proc.wait(timeout=30) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    status, data = answer[0]
    assert status == 200 and [x["text"] for x in data["translations"]] == \
        nmt_translate(slow_ckpt, ["el sol"], long_search(2000))
    assert "nmt serve: stopped" in "".join(server.log)


@pytest.mark.slow
def test_a_second_signal_stops_at_once(slow_ckpt):
    """The second signal ends the process at once (128 + signal); the requests in progress, translating or
    queued, are answered 503 in JSON as every answer is (issue 59 item 8: they got 500 in text/plain and the
    log ~130 lines of CancelledError tracebacks). (--batch-lines 1: the second request waits in the queue.)"""
    server = Server(slow_ckpt, "--batch-lines", "1")
    answers: list = []

    def client() -> None:
        body = json.dumps({"text": ["el sol"], "options": long_search(4000)}).encode()
        try:
            answers.append(server.request("/translate", body, method="POST", headers={"Content-Type": "x"}))
        except (OSError, ValueError) as e:  # no answer at all
            answers.append(e)

    threads = [threading.Thread(target=client) for _ in range(2)]
    try:
        threads[0].start()
        _wait_for(server, lambda h: h["translating"] == 1)
        threads[1].start()
        _wait_for(server, lambda h: h["queued"] == 1)
        server.proc.send_signal(signal.SIGTERM)
        _wait_for_log(server, "SIGTERM: answering the 2 requests in progress")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if server.proc.poll() is None:  # (a failed step above: no server left behind)
            server.proc.kill()
            server.proc.wait()
    for t in threads:
        t.join()
    log = "".join(server.log)
    assert "nmt serve: stopped (SIGTERM twice)" in log and "Traceback" not in log, log
    for answer in answers:
        assert not isinstance(answer, Exception), answer
        status, headers, body = answer
        assert (status, headers["content-type"]) == (503, "application/json"), answer
        assert body == {"error": "the server is stopping (a second signal): not translated"}


@pytest.mark.slow
def test_abandoned_requests_free_their_slot_and_stop_their_call(slow_ckpt):
    """With a queue of one: a long search runs, a second request waits, a third gets 503. The
    waiting client goes away: its slot is free at once (a new request may queue). The running
    client goes away: its call stops at the next step, and the next request is answered at once
    (equal to nmt translate). So does a streamed request whose client goes away once its answer started.
    /metrics counts each by its status (499: the client went away). (--batch-lines 1: one line translated at
    a time, so the second request waits.)"""
    server = Server(slow_ckpt, "--max-queue", "1", "--batch-lines", "1")
    try:
        running = server.post(json.dumps({"text": ["el sol"], "options": long_search(4000)}).encode())
        _wait_for(server, lambda h: h["translating"] == 1)
        waiting = server.post(b'{"text": ["la luna"]}')
        _wait_for(server, lambda h: h["queued"] == 1)
        status, _, data = server.request("/translate", b'{"text": ["la luna"]}')
        assert status == 503 and "busy" in data["error"]
        waiting.close()
        _wait_for(server, lambda h: h["queued"] == 0 and h["expired"] == 1 and h["translating"] == 1)
        running.close()
        _wait_for(server, lambda h: h["translating"] == 0 and h["expired"] == 2 and h["cancelled_calls"] == 1)
        status, data = server.translate(["el perro"], {"beam_size": 1})
        assert status == 200 and [t["text"] for t in data["translations"]] == \
            nmt_translate(slow_ckpt, ["el perro"], {"beam_size": 1})
        streamed = server.post(json.dumps({"text": ["el sol"], "options": long_search(4000), "stream": True}).encode())
        assert streamed.recv(4096).startswith(b"HTTP/1.1 200 ")  # the answer started
        _wait_for(server, lambda h: h["translating"] == 1)
        streamed.close()
        _wait_for(server, lambda h: h["translating"] == 0 and h["expired"] == 3 and h["cancelled_calls"] == 2)
        requests = {labels[0][1]: n for (name, *labels), n in server.metrics().items() if name == "nmt_requests_total"}
        assert requests == {"200": 1, "499": 3, "503": 1}
    finally:
        assert server.stop() == 0, "".join(server.log)
    assert "Traceback" not in "".join(server.log)


@pytest.mark.slow
@pytest.mark.parametrize("scheduling", ["step", "call"])
def test_a_short_request_is_not_held_up_by_a_long_one(slow_ckpt, scheduling):
    """A one-line request sent while a long search runs (2,000 forced beam steps): with step scheduling the
    two calls take turns at every decoding step, so the short one is answered while the long one still runs;
    with call scheduling it waits for the whole long call (the test tells them apart). Both answers equal
    `nmt translate` on their own lines."""
    server = Server(slow_ckpt, "--scheduling", scheduling)
    try:
        long: dict = {}

        def client() -> None:
            long["answer"] = server.translate(["el sol"], long_search(2000))
            long["at"] = time.monotonic()

        t = threading.Thread(target=client)
        t.start()
        _wait_for(server, lambda h: h["translating"] == 1)
        status, data = server.translate(["el perro come"], {"beam_size": 2})
        short_at = time.monotonic()
        t.join()
    finally:
        assert server.stop() == 0, "".join(server.log)
    assert status == 200 and [x["text"] for x in data["translations"]] == \
        nmt_translate(slow_ckpt, ["el perro come"], {"beam_size": 2})
    status, data = long["answer"]
    assert status == 200 and [x["text"] for x in data["translations"]] == \
        nmt_translate(slow_ckpt, ["el sol"], long_search(2000))
    assert (short_at < long["at"]) == (scheduling == "step")


@pytest.mark.slow
def test_a_streamed_line_is_sent_as_soon_as_it_and_those_before_it_are_final(slow_ckpt):
    """`"stream": true` (issue 58): with EOS held back every sentence runs to its own limit (max_len_a 150 x
    its source tokens, EOS included, plus 1), so the first line (3 source tokens: 451 steps) is final long before
    the second (16: 2,401 steps); its object arrives at about a fifth of the answer's time (the whole answer at the end,
    as before, would bring it with the rest), and the answer equals the unstreamed one and `nmt translate`.
    (One search batch for both: the checkpoint's 30-token batches would search them one after the other.)"""
    server = Server(slow_ckpt, "--batch-tokens", "1000")
    lines = ["el sol", "el perro come y el gato ve la casa y el sol ve el rio"]
    options = {"beam_size": 1, "min_len": 4000, "max_len_a": 150, "max_len_b": 1}
    try:
        req = urllib.request.Request(server.url + "/translate",
                                     data=json.dumps({"text": lines, "options": options, "stream": True}).encode())
        start, arrivals = time.monotonic(), []
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:  # one JSON object a line, read as it comes
                arrivals.append((time.monotonic() - start, json.loads(raw)))
        status, whole = server.translate(lines, options)
    finally:
        assert server.stop() == 0, "".join(server.log)
    assert [item for _, item in arrivals] == whole["translations"] + [{"done": True, "lines": 2}]
    assert [len(x["text"].split()) for x in whole["translations"]] == [451, 2401]
    assert [x["text"] for x in whole["translations"]] == nmt_translate(slow_ckpt, lines, options)  # (batching aside)
    first, second = arrivals[0][0], arrivals[1][0]
    assert first < 0.6 * second, arrivals[:2]


def test_concurrent_calls_share_the_machine_step_by_step():
    """nmt.api.Turns on a clock the calls advance: a long call L (steps of 10 s) runs; a short call S (steps
    of 1 s) comes during L's third step. At L's next step the turn goes to S, which used less, and S's ten
    steps run before L's fourth: S waits one of L's steps, not all of L (in plain round robin they would
    alternate). No two steps ever run at once, and a call alone goes on at once (it would hang otherwise)."""
    from nmt.api import Turns

    now, log, computing = [0.0], [], []
    turns = Turns(clock=lambda: now[0])
    short = threading.Thread(target=lambda: call("S", 10, 1.0))

    def call(name: str, steps: int, cost: float) -> None:
        with turns.turn() as step:
            for i in range(steps):
                step()
                computing.append(name)
                assert computing == [name], "two calls computing at once"
                if name == "L" and i == 2:
                    short.start()
                    end = time.monotonic() + 10
                    while not turns._waiting:  # (S waits in line)
                        assert time.monotonic() < end, "the short call never waited for its turn"
                        time.sleep(0.001)
                now[0] += cost
                log.append(name)
                computing.remove(name)

    call("L", 10, 10.0)
    short.join()
    assert "".join(log) == "LLL" + "S" * 10 + "L" * 7
    with turns.turn() as step:
        for _ in range(3):
            step()


def test_a_long_call_is_not_starved_and_a_cancelled_call_leaves_the_line():
    """nmt.api.Turns: a call S that comes after L has run 5 s gets HEAD_START (1 s) ahead of it, not more: it
    runs 3 steps, then the two alternate (least attained service would run all of S first, starving L under a
    stream of such calls). A waiting call whose cancel() turns true leaves the line at once (Cancelled) and
    is never given the turn; the next call is."""
    from nmt.api import Turns

    now, log = [0.0], []
    turns = Turns(clock=lambda: now[0])
    short = threading.Thread(target=lambda: call("S", 10))

    def call(name: str, steps: int) -> None:
        with turns.turn() as step:
            for i in range(steps):
                step()
                if name == "L" and i == 5:
                    short.start()
                    end = time.monotonic() + 10
                    while not turns._waiting:
                        assert time.monotonic() < end, "the short call never waited for its turn"
                        time.sleep(0.001)
                now[0] += 1.0
                log.append(name)

    call("L", 20)
    short.join()
    first = log.index("S")
    assert log[:first] == ["L"] * 6 and log[first:first + 4] == ["S", "S", "S", "L"], log
    assert "SSSS" not in "".join(log) and log.count("S") == 10

    stop, got = threading.Event(), []

    def waiting(name: str, cancel) -> None:
        try:
            with turns.turn(cancel):
                got.append(name)
        except Cancelled:
            got.append(f"{name} cancelled")

    with turns.turn():  # (holding the turn: the others wait in line)
        w = threading.Thread(target=waiting, args=("w", stop.is_set))
        w.start()
        end = time.monotonic() + 10
        while not turns._waiting:
            assert time.monotonic() < end
            time.sleep(0.001)
        stop.set()
        w.join(10)
        assert got == ["w cancelled"] and not turns._waiting
        x = threading.Thread(target=waiting, args=("x", None))
        x.start()
        while not turns._waiting:
            assert time.monotonic() < end
            time.sleep(0.001)
    x.join(10)
    assert got == ["w cancelled", "x"]


def test_a_stream_of_short_calls_does_not_starve_a_long_one():
    """nmt.api.Turns, injected clock: while two threads run short calls back to back (3 steps of 0.1 s each,
    each new call starting HEAD_START ahead), a long call that had run 5 s alone still gets steps: virtual
    time advances with the time computed, so new calls start later and later (when it only tracked the least
    time of the running calls, the short calls kept it down and the long call got none)."""
    from nmt.api import Turns

    now, log, lock = [0.0], [], threading.Lock()
    turns = Turns(clock=lambda: now[0])
    done = threading.Event()

    def shorts() -> None:
        for _ in range(40):
            with turns.turn() as step:
                for _ in range(3):
                    step()
                    with lock:
                        now[0] += 0.1
                        log.append("s")
        done.set()

    with turns.turn() as step:
        threads = [threading.Thread(target=shorts) for _ in range(2)]
        for i in range(200):
            step()
            with lock:
                now[0] += 1.0
                log.append("L")
            if i == 4:
                for t in threads:
                    t.start()
            if done.is_set():
                break
    for t in threads:
        t.join()
    last = len(log) - 1 - log[::-1].index("s")
    during = "".join(log[5:last + 1])  # from the short calls' start to the last short step
    assert during.count("s") == 240 and during.count("L") >= 5, during


@pytest.mark.slow
def test_the_time_limit_stops_the_work_and_covers_the_upload(slow_ckpt):
    """--timeout 2: a long search gets 504 and its call stops (the next request is answered, equal
    to nmt translate, within its own time limit); a streamed one ends with the error; a body that does not
    arrive in time gets 408."""
    server = Server(slow_ckpt, "--timeout", "2")
    try:
        status, data = server.translate(["el sol"], long_search(4000))
        assert status == 504 and data["error"] == "not translated within 2 s (nmt serve --timeout)"
        status, data = server.translate(["el perro"], {"beam_size": 1})
        assert status == 200 and [t["text"] for t in data["translations"]] == \
            nmt_translate(slow_ckpt, ["el perro"], {"beam_size": 1})
        health = server.health()
        assert (health["expired"], health["cancelled_calls"], health["requests"]) == (1, 1, 2)
        status, content_type, items = server.stream({"text": ["el sol"], "options": long_search(4000)})
        assert (status, content_type) == (200, "application/x-ndjson")  # (sent before the time limit passed)
        assert items == [{"error": "not translated within 2 s (nmt serve --timeout)", "status": 504}]
        upload = server.post(b'{"text": ["la', length=100)
        assert _read_answer(upload) == (408, {"error": "the request body did not arrive within 2 s (nmt serve "
                                                       "--timeout)"})
        assert upload.recv(1) == b""  # and the connection is closed
        upload.close()
    finally:
        assert server.stop() == 0, "".join(server.log)
    assert "Traceback" not in "".join(server.log)


def _ignore_errors(fn, *args) -> None:
    try:
        fn(*args)
    except (OSError, ValueError):  # the connection closed without an answer (or an empty one)
        pass


def _wait_for(server: Server, condition, timeout: float = 30) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        health = server.health()
        if condition(health):
            return health
        time.sleep(0.02)
    raise AssertionError(f"condition not reached: {server.health()}")


def _wait_for_log(server: Server, text: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while text not in "".join(server.log):
        assert time.monotonic() < end, "".join(server.log)
        time.sleep(0.02)


@pytest.mark.slow
def test_ctranslate2_model(ckpt, tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install -e '.[ct2]')")
    out = str(tmp_path / "ct2")
    assert cli.main(["export", "-c", ckpt, "-o", out]) == 0
    server = Server(out, "--workers", "1", ct2=True)
    try:
        assert server.health()["engine"] == "ctranslate2"
        for options in ({"beam_size": 1}, {"beam_size": 2}):
            status, data = server.translate(LINES, options)
            assert status == 200, data
            assert [t["text"] for t in data["translations"]] == nmt_translate(out, LINES, options, tmp_path=tmp_path)
    finally:
        assert server.stop() == 0


# --------------------------------------------------------------------------- command-line errors

def test_command_errors_are_one_line(ckpt, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", "-c", ckpt, "--port", str(port)]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip().startswith(f"nmt serve: error: cannot listen on 127.0.0.1:{port}: ")
    assert cli.main(["serve", "-c", ckpt + ".missing"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip().startswith("nmt serve: error: checkpoint not found")
    assert cli.main(["serve", "-c", ckpt, "--max-lines", "0"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip() == "nmt serve: error: --max-lines must be at least 1"


@pytest.mark.parametrize("flags, message", [
    (["--port", "70000"], "--port must be between 0 and 65535, got 70000"),
    (["--port", "-1"], "--port must be between 0 and 65535, got -1"),
    (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
    (["--timeout", "inf"], "--timeout must be a positive number of seconds, got inf"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0"),
    (["--batch-window-ms", "nan"], "--batch-window-ms must be a number of milliseconds, at least 0, got nan"),
    (["--beam", "20"], "the server's default search settings are over its limits: beam_size 20 is over this "
                       "server's limit 16 (nmt serve --max-beam)"),
    (["--max-beam", "1"], "the server's default search settings are over its limits: beam_size 2 is over this "
                          "server's limit 1 (nmt serve --max-beam)"),  # the checkpoint's own beam
    (["--allow-origin", "example.com"], "--allow-origin example.com: not an origin (scheme://host[:port], e.g. "
                                         "https://example.com, as browsers send it; * for any)"),
    (["--allow-origin", "https://example.com/page"], "--allow-origin https://example.com/page: not an origin "
                                                     "(scheme://host[:port], e.g. https://example.com, as browsers "
                                                     "send it; * for any)"),
    (["--min-len", "30"], "the server's default search settings are over its limits: min_len 30 is over this "
                          "model's limit 22 (its outputs have at most max_positions - 1 = 23 tokens, EOS included)"),
    (["--workers", "2"], "--workers applies to --scheduling call with the PyTorch engine on CPU (with step "
                         "scheduling the calls' decoding steps join, as many steps at once as torch has threads, each on one)"),
    (["--max-batch-tokens", "0"], "--max-batch-tokens must be at least 1"),
])
def test_settings_out_of_range_are_one_line_errors(ckpt, capsys, monkeypatch, flags, message):
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: pytest.fail("the server started"))
    assert cli.main(["serve", "-c", ckpt, "--port", "0", *flags]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [f"nmt serve: error: {message}"]


@pytest.mark.slow
def test_missing_extra_is_a_one_line_error(ckpt):
    code = ("import sys; sys.modules['uvicorn'] = None; from nmt.cli import main; "
            f"raise SystemExit(main(['serve', '-c', {ckpt!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "nmt serve: error: nmt serve needs the optional extra 'serve' (uvicorn is not installed): "
        "pip install -e \".[serve]\""]


def test_a_request_is_validated_once_and_its_settings_reach_the_translator(ckpt, monkeypatch):
    """Issue 35: a request's options were validated three times (check_options, check_language, and again by
    Translator.translate from the raw options the batcher carried beside the validated settings). Now they
    are validated once, when the request is parsed; the batcher carries only the frozen DecodeConfig, and
    the translator uses it as it is (the answer stays nmt translate's)."""
    from nmt import api
    from nmt.commands.serve_app import Service

    translator = api.Translator(ckpt, device="cpu")
    validated, seen = [], []
    real_config, real_translate = api.decode_config, translator.translate
    monkeypatch.setattr(api, "decode_config",
                        lambda base, options, **kw: validated.append(dict(options)) or real_config(base, options, **kw))
    monkeypatch.setattr(translator, "translate",
                        lambda lines, **kw: seen.append(kw.get("settings")) or real_translate(lines, **kw))
    service = Service(translator, Settings(), "tiny")

    async def answer():
        async with service.lifespan(None):
            loop = asyncio.get_running_loop()
            body = json.dumps({"text": LINES[:3], "options": {"beam_size": 2, "nbest": 2}}).encode()
            job, _ = service.accept(body)
            return await service.answer(job, loop.time(), loop.time() + 60, loop.create_future())

    got = asyncio.run(answer())
    assert validated == [{"beam_size": 2, "nbest": 2}]
    # (step scheduling: one decode worker per call, nmt/commands/serve_app.py's Service.translate)
    assert seen == [DecodeConfig(**{**vars(translator.decode), "beam_size": 2, "nbest": 2, "workers": 1})]
    assert as_command_output(got["translations"], {"nbest": 2}) == nmt_translate(ckpt, LINES[:3], {"beam_size": 2,
                                                                                                     "nbest": 2})


def test_errors_name_the_request_keys_not_the_command_line_flags(ckpt):
    """Issue 59 item 12: a request's errors quoted the command's flags (`leave --contrast-lang out`, `choose
    one with --tgt-lang`) where the request key is meant; flags of the server itself (`nmt serve --max-beam`)
    are still named as flags."""
    from nmt import api
    from nmt.commands.serve_app import Service
    from nmt.commands.serve_request import RequestError

    service = Service(api.Translator(ckpt, device="cpu"), Settings(), "tiny")

    async def answer(body: dict):
        async with service.lifespan(None):
            loop = asyncio.get_running_loop()
            job, _ = service.accept(json.dumps(body).encode())
            return await service.answer(job, loop.time(), loop.time() + 60, loop.create_future())

    for options, message in (({"tgt_lang": "de"}, "tgt_lang de: this model translates into one language only (it "
                                                   "has no target-language tokens); leave tgt_lang out"),
                             ({"contrast_lang": "de"}, "leave contrast_lang out"),
                             ({"precision": "fp16"}, "precision fp16"),
                             ({"beam_size": 17}, "beam_size 17 is over this server's limit 16 (nmt serve --max-beam)")):
        with pytest.raises(RequestError) as e:
            asyncio.run(answer({"text": ["el sol"], "options": options}))
        assert e.value.status == 400 and message in str(e.value), str(e.value)
        assert "--" not in str(e.value).replace("nmt serve --max-beam", ""), str(e.value)


def test_each_app_has_its_own_metrics():
    """Two apps in one process keep their own metrics (prometheus_client's global registry would refuse the
    second); the running lines are those of the call in progress, the batch fill its lines over batch_lines."""
    from prometheus_client.parser import text_string_to_metric_families

    from nmt.commands.serve_metrics import Metrics

    def values(metrics: Metrics) -> dict:
        text = metrics.render()[0].decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}

    a, b = Metrics(lambda: 3, batch_lines=8), Metrics(lambda: 0, batch_lines=8)
    with a.call(4):
        assert (values(a)["nmt_running_lines"], values(b)["nmt_running_lines"]) == (4, 0)
    assert values(a)["nmt_running_lines"] == 0 and values(a)["nmt_batch_fill_sum"] == 0.5
    assert (values(a)["nmt_queue_length"], values(b)["nmt_queue_length"], values(b)["nmt_batch_fill_count"]) == (3, 0, 0)


# --------------------------------------------------------------------------- the batcher alone

def _job(loop, lines, decode="d", prefixes=None) -> Job:
    return Job(list(lines), prefixes, decode, loop.create_future(), loop.time())


def test_groups_and_merge():
    loop = asyncio.new_event_loop()
    try:
        a, b, c = _job(loop, ["a1", "a2"], "x"), _job(loop, ["b1"], "y", ["p"]), _job(loop, ["c1", "c2"], "x", ["q", ""])
        assert groups([a, b, c]) == [[a, c], [b]]
        assert merge([a, c]) == (["a1", "a2", "c1", "c2"], ["", "", "q", ""], [0, 1, 0, 1])
        assert merge([a]) == (["a1", "a2"], None, [0, 1])
    finally:
        loop.close()


def test_gather_wait_is_the_window_or_a_fraction_of_the_last_call():
    settings = Settings(window=0.005, wait_fraction=0.05)
    assert gather_wait(settings, 0.0) == 0.005 and gather_wait(settings, 0.05) == 0.005  # short calls: the window
    assert gather_wait(settings, 4.0) == pytest.approx(0.2)  # 5% of a 4 s call
    assert gather_wait(settings, 1000.0) == MAX_WAIT


def test_batcher_gathers_groups_splits_and_skips():
    calls: list = []

    def translate(lines, prefixes, numbers, decode, cancel, on_line=None):
        calls.append((list(lines), prefixes, list(numbers), decode))
        if "boom" in lines:
            raise RuntimeError("engine failure")
        return [f"{line}/{n}" for line, n in zip(lines, numbers)]

    async def scenario(settings: Settings):
        batcher = Batcher(translate, settings)
        loop = asyncio.get_running_loop()
        x, y = DecodeConfig(), DecodeConfig(beam_size=1)  # (equal settings are one group, whichever object)
        jobs = [_job(loop, ["a", "b"], x), _job(loop, ["c"], y), _job(loop, ["d", "e", "f"], DecodeConfig()),
                _job(loop, ["g"], x), _job(loop, ["boom"], DecodeConfig(beam_size=2))]
        jobs[3].future.cancel()  # its time limit passed while queued
        for job in jobs:
            batcher.submit(job)
        task = loop.create_task(batcher.run())
        await asyncio.wait([j.future for j in jobs], timeout=5)
        for job in jobs:
            if job.future.done() and not job.future.cancelled():
                job.future.exception()  # retrieved (asyncio logs unretrieved exceptions)
        task.cancel()
        batcher.close()
        return jobs, batcher.stats

    jobs, stats = asyncio.run(scenario(Settings(window=0.05)))
    assert [j.future.result() for j in jobs[:3]] == [["a/0", "b/1"], ["c/0"], ["d/0", "e/1", "f/2"]]
    assert calls[:2] == [(["a", "b", "d", "e", "f"], None, [0, 1, 0, 1, 2], DecodeConfig()),
                         (["c"], None, [0], DecodeConfig(beam_size=1))]
    assert isinstance(jobs[4].future.exception(), RuntimeError)
    assert (stats.calls, stats.shared_calls, stats.largest_call, stats.expired, stats.requests) == (3, 1, 2, 1, 4)

    calls.clear()
    jobs, stats = asyncio.run(scenario(Settings(batching=False)))
    assert [c[0] for c in calls] == [["a", "b"], ["c"], ["d", "e", "f"], ["boom"]]  # one request per call
    assert stats.shared_calls == 0 and stats.largest_call == 1

    calls.clear()
    asyncio.run(scenario(Settings(window=0.05, batch_lines=3)))  # a call stops gathering at 3 lines
    assert [c[0] for c in calls] == [["a", "b"], ["c"], ["d", "e", "f"], ["boom"]]


@pytest.mark.parametrize("scheduling", ["step", "call"])
def test_a_request_sharing_a_call_is_answered_when_its_own_lines_are_final(scheduling):
    """Issue 58: two requests in one call; the call hands the second one's line over (translate's on_line)
    and goes on: that request is answered then, the first when its lines are final, the call still running
    (one call, not stopped: an answered request does not count as abandoned)."""
    release, stopped = threading.Event(), []

    def translate(lines, prefixes, numbers, decode, cancel, on_line=None):
        assert on_line is not None  # (a call of two requests)
        on_line(2, "b1!")
        assert release.wait(10)
        stopped.append(cancel())
        on_line(0, "a1!")
        on_line(1, "a2!")
        return ["a1!", "a2!", "b1!"]

    async def scenario():
        batcher = Batcher(translate, Settings(window=0.05, scheduling=scheduling))
        loop = asyncio.get_running_loop()
        a, b = _job(loop, ["a1", "a2"]), _job(loop, ["b1"])
        batcher.submit(a)
        batcher.submit(b)
        task = loop.create_task(batcher.run())
        try:
            assert await asyncio.wait_for(b.future, 5) == ["b1!"]
            assert not a.future.done()
            release.set()
            assert await asyncio.wait_for(a.future, 5) == ["a1!", "a2!"]
            await asyncio.sleep(0.05)
            return batcher.stats
        finally:
            task.cancel()
            batcher.close()

    stats = asyncio.run(scenario())
    assert stopped == [False]
    assert (stats.calls, stats.shared_calls, stats.cancelled_calls, stats.expired) == (1, 1, 0, 0)


def test_a_failing_request_does_not_fail_the_requests_it_shared_a_call_with():
    calls: list = []

    def translate(lines, prefixes, numbers, decode, cancel, on_line=None):
        calls.append(list(lines))
        if "boom" in lines:
            raise RuntimeError("engine failure")
        return [line.upper() for line in lines]

    async def scenario():
        batcher = Batcher(translate, Settings(window=0.05))
        loop = asyncio.get_running_loop()
        jobs = [_job(loop, ["a"]), _job(loop, ["boom", "b"]), _job(loop, ["c"])]
        for job in jobs:
            batcher.submit(job)
        task = loop.create_task(batcher.run())
        await asyncio.wait([j.future for j in jobs], timeout=5)
        task.cancel()
        batcher.close()
        return [j.future.exception() or j.future.result() for j in jobs], batcher.stats

    results, stats = asyncio.run(scenario())
    assert results[0] == ["A"] and results[2] == ["C"] and isinstance(results[1], RuntimeError)
    assert calls == [["a", "boom", "b", "c"], ["a"], ["boom", "b"], ["c"]]  # shared, then each alone
    assert (stats.requests, stats.calls, stats.shared_calls) == (3, 4, 1)


@pytest.mark.parametrize("scheduling", ["step", "call"])
def test_an_abandoned_request_leaves_the_queue_at_once(scheduling):
    """A queue of 2 behind a running call is full (step scheduling: one line may run at a time); one queued
    request is abandoned (its handler cancels its future): its slot is free at once, and it is never
    translated."""
    calls: list = []
    release = threading.Event()

    def translate(lines, prefixes, numbers, decode, cancel=None, on_line=None):
        calls.append(list(lines))
        release.wait(10)
        return [line.upper() for line in lines]

    async def scenario():
        batcher = Batcher(translate, Settings(max_queue=2, window=0.0, scheduling=scheduling,
                                              batch_lines=1 if scheduling == "step" else 1024))
        loop = asyncio.get_running_loop()
        task = loop.create_task(batcher.run())
        running, queued, abandoned, late = (_job(loop, [x]) for x in "abcd")
        batcher.submit(running)
        await _until(lambda: batcher.stats.translating == 1)
        batcher.submit(abandoned)
        batcher.submit(queued)
        with pytest.raises(asyncio.QueueFull):
            batcher.submit(late)
        abandoned.future.cancel()
        await asyncio.sleep(0)  # (its done callbacks run)
        batcher.submit(late)
        assert batcher.queued == 2 and batcher.stats.expired == 1
        release.set()
        await asyncio.wait([running.future, queued.future, late.future], timeout=10)
        task.cancel()
        batcher.close()
        return [j.future.result() for j in (running, queued, late)]

    assert asyncio.run(scenario()) == [["A"], ["B"], ["D"]]
    assert calls == ([["a"], ["b"], ["d"]] if scheduling == "step" else [["a"], ["b", "d"]])  # (call: gathered)


def test_an_abandoned_request_stops_its_call_and_the_others_get_their_results():
    """Three requests share a call; one is abandoned while it runs: the call is cancelled (the
    translate function sees cancel() turn True and raises Cancelled) and runs again over the two
    others, which get their results."""
    calls: list = []

    def translate(lines, prefixes, numbers, decode, cancel, on_line=None):
        calls.append(list(lines))
        if "slow" in lines:
            end = time.monotonic() + 10
            while not cancel():
                assert time.monotonic() < end, "never cancelled"
                time.sleep(0.005)
            raise Cancelled()
        return [line.upper() for line in lines]

    async def scenario():
        batcher = Batcher(translate, Settings(window=0.05))
        loop = asyncio.get_running_loop()
        jobs = [_job(loop, ["a"]), _job(loop, ["slow"]), _job(loop, ["b", "c"])]
        for job in jobs:
            batcher.submit(job)
        task = loop.create_task(batcher.run())
        await _until(lambda: batcher.stats.translating == 3)
        jobs[1].future.cancel()
        await asyncio.wait([jobs[0].future, jobs[2].future], timeout=10)
        task.cancel()
        batcher.close()
        return [jobs[0].future.result(), jobs[2].future.result()], batcher.stats

    results, stats = asyncio.run(scenario())
    assert results == [["A"], ["B", "C"]]
    assert calls == [["a", "slow", "b", "c"], ["a", "b", "c"]]
    assert (stats.calls, stats.cancelled_calls, stats.expired, stats.requests) == (2, 1, 1, 3)


async def _until(condition, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------- the page in a browser

def _browser(profile: str):
    """A selenium Chrome driver on Debian's chromium, or pytest.skip with the reason."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip(reason="no headless browser: apt-get install chromium chromium-driver")
    from selenium.webdriver.chrome.service import Service as DriverService

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    return webdriver, webdriver.Chrome(options=opts, service=DriverService(executable_path=driver))


@pytest.mark.slow
def test_page_translates_in_a_headless_browser(server, ckpt, tmp_path):
    webdriver, browser = _browser(str(tmp_path / "profile"))
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda b: "tiny.pt" in b.find_element(By.ID, "model").text)
        browser.find_element(By.ID, "source").send_keys("el perro rojo ve la casa\nla luna come el sol")
        browser.find_element(By.ID, "translate").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "time"), " ms"))
        output = browser.find_element(By.ID, "output").get_attribute("textContent")
        assert output.split("\n") == nmt_translate(ckpt, ["el perro rojo ve la casa", "la luna come el sol"],
                                                   tmp_path=str(tmp_path))
        assert re.fullmatch(r"2 lines in \d+ ms", browser.find_element(By.ID, "time").text)
        assert browser.find_element(By.ID, "error").text == ""
    finally:
        browser.quit()


def _asgi_get(app, path: str) -> tuple[int, dict, bytes]:
    """One GET through the ASGI app in this process: (status, headers, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_the_page_is_served_and_calls_only_routes_the_server_has():
    """GET / answers the page (nmt/commands/serve_page.py), and every path the page fetches is a route of the
    app with the method it uses (the browser test drives the page itself)."""
    pytest.importorskip("starlette", reason="nmt serve's stack is the serve extra")
    from types import SimpleNamespace

    from nmt.commands.serve_app import build_app
    from nmt.commands.serve_page import PAGE

    app = build_app(SimpleNamespace(lifespan=None), hosts=None)
    status, headers, body = _asgi_get(app, "/")
    assert status == 200 and headers["content-type"].startswith("text/html") and body.decode() == PAGE
    assert "stream: true" in PAGE  # (the browser test reads its streamed answer)
    fetched = re.findall(r'fetch\("([^"]+)"(?:, \{ method: "([A-Z]+)")?', PAGE)
    routes = {route.path: route.methods for route in app.routes}
    assert {path for path, _ in fetched} == {"/health", "/translate"}
    for path, method in fetched:
        assert path in routes and (method or "GET") in routes[path], (path, method, routes)


def test_closing_waits_for_a_call_that_does_not_stop_at_most_its_wait():
    """A CTranslate2 call stops only before its next batch: a call of timed-out requests kept a stopping server
    (and then the interpreter's exit) waiting for minutes; `close(wait)` says it still runs, and `nmt serve`
    exits without it (serve_command)."""
    release, started = threading.Event(), threading.Event()

    def translate(lines, prefixes, numbers, decode, cancel, on_line=None):
        started.set()
        release.wait(30)  # (never looks at `cancel`)
        return list(lines)

    async def scenario():
        batcher = Batcher(translate, Settings())
        loop = asyncio.get_running_loop()
        job = _job(loop, ["a"], DecodeConfig())
        batcher.submit(job)
        task = loop.create_task(batcher.run())
        await loop.run_in_executor(None, started.wait, 5)
        job.future.cancel()  # its time limit passed
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return batcher

    batcher = asyncio.run(scenario())
    assert batcher.close(wait=0.2) is False
    release.set()
    assert batcher.close(wait=5) is True

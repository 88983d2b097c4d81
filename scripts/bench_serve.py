"""Load benchmark of `nmt serve` (issue 26): throughput and latency under concurrent clients,
cross-request batching on against off, against `nmt translate` on the same lines, and a soak run.

    python3 scripts/bench_serve.py --checkpoint runs/quickstart/checkpoints/best.pt \\
        --clients 1 8 32 64 --seconds 20 --soak-requests 10000 --json /tmp/bench_serve.json

What it does:
1. Reads the test sentences (default data/bible-es-en/test.es.gz) and times `nmt translate` on
   all of them (whole command; its output is the reference every answer is checked against).
2. Starts two servers on free localhost ports: batching on (the default) and `--no-batching`
   (one request per translate call). Each is warmed up.
3. For each number of clients, both servers in turn (the order alternates from one level to the
   next): every client (a thread with one keep-alive connection) sends requests of 1-20
   consecutive sentences (a seeded plan) for `--seconds`, then finishes its request. Throughput
   = sentences answered / wall time; latency percentiles per request. Every answer is compared
   with `nmt translate`'s lines: a request with a missing, extra, different or reordered line is
   counted as wrong; an HTTP error or a lost connection as failed.
4. Soak (optional): `--soak-requests` requests from `--soak-clients` clients on the batching
   server, the same checks, and the server's RSS sampled as it goes.
5. Poisson (optional, `--poisson RATE ...`, instead of 3-4): step against call scheduling (`--scheduling`),
   on the same seeded open-loop arrivals (requests per second; each request sent at its time, whatever
   the server is doing): 10% long requests of 33-64 lines, 45% of one line, 45% of 2-4. Per server and rate:
   latency p50/p95 of the one-line requests and of all, sentences/s (answered lines over the time from the
   first arrival to the last answer). First, the idle latency of one-line requests (one at a time), and
   head-of-line blocking: a one-line request sent 0.3 s after a 64-line one, 5 times per server. With
   `--p95-target MS` and ascending rates: each server's sentences/s at the best rate whose p95 latency (all
   requests) stays within MS (the GPU measure of issue 58; a server passing MS is not run at higher rates);
   `--eager` adds a step server with `NMT_CUDA_GRAPHS=0` (on CUDA: joined eager steps, not graphed turns).
6. Streamed answers (optional, `--stream N`, instead of 3-5): one streamed request of N consecutive test lines
   at a time, 5 times (different lines each time) after a warm-up: when its first line arrives, when its
   first N/4 lines have, and when the whole answer has, in ms from the request; every line checked. The
   same script run with PYTHONPATH=OLD_CHECKOUT measures another version's server (its children get
   PYTHONSAFEPATH and the working directory after PYTHONPATH, so that a run from a checkout's root does not
   import that checkout instead; Python 3.11+).

Clients and servers share this machine's cores: the clients' own CPU time is part of the load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

from nmt.textio import read_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------- servers and the reference

class ServerProcess:
    """`nmt serve` as a subprocess on a free localhost port."""

    def __init__(self, checkpoint: str, *args: str, env: dict[str, str] | None = None):
        cmd = [sys.executable, "-m", "nmt", "serve", "-c", checkpoint, "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env=child_env(env or {}))
        first = self.proc.stderr.readline()
        match = re.search(r"http://([^/: ]+):(\d+)", first)
        if not match:
            raise SystemExit(f"nmt serve did not start: {first}{self.proc.stderr.read()}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.log: list[str] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return kb / 1024

    def health(self) -> dict:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=120)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a `python -m nmt` child. With PYTHONPATH set (another checkout's nmt), PYTHONSAFEPATH
    keeps `-m` from putting the working directory first on the child's sys.path, where a run from this checkout's
    root would import this checkout's nmt, not PYTHONPATH's; the working directory goes after PYTHONPATH instead,
    so a PYTHONPATH without nmt (extra packages only) still finds it there."""
    env = {**os.environ, **extra}
    if env.get("PYTHONPATH"):
        env["PYTHONSAFEPATH"] = "1"
        env["PYTHONPATH"] += os.pathsep + os.getcwd()
    return env


def decode_flags(options: dict) -> list[str]:
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def reference(checkpoint: str, lines: list[str], options: dict, workdir: str) -> tuple[list[str], float]:
    """(`nmt translate`'s output lines, its whole-command seconds)."""
    src, out = os.path.join(workdir, "in.txt"), os.path.join(workdir, "ref.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", checkpoint, "-i", src, "-o", out, "--quiet",
                    *decode_flags(options)], check=True, env=child_env({}))
    seconds = time.perf_counter() - start
    with open(out, encoding="utf-8") as f:
        return f.read().split("\n")[:-1], seconds


# --------------------------------------------------------------------------- clients

class Plan:
    """A seeded endless sequence of requests: (first line, count), 1..max_lines consecutive lines."""

    def __init__(self, n_lines: int, max_lines: int, seed: int):
        self.rng, self.n, self.max_lines = random.Random(seed), n_lines, max_lines
        self.lock = threading.Lock()

    def next(self) -> tuple[int, int]:
        with self.lock:
            count = self.rng.randint(1, self.max_lines)
            return self.rng.randrange(self.n - count + 1), count


class Tally:
    """Answers counted for throughput and latency (those that came before the cell's end) and the
    checks of every answer (also those that came after it)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.sentences = self.checked = self.wrong = self.failed = 0

    def add(self, seconds: float, n: int, ok: bool | None, counted: bool) -> None:
        with self.lock:
            self.checked += 1
            if ok is None:
                self.failed += 1
                return
            self.wrong += not ok
            if counted:
                self.latencies.append(seconds)
                self.sentences += n


def client(server: ServerProcess, plan: Plan, lines: list[str], ref: list[str], options: dict, tally: Tally,
           stop: threading.Event, end: float, budget: list[int] | None) -> None:
    """Send requests until `stop` is set (or the shared request budget is spent); check each answer.
    An answer that comes after `end` (perf_counter) is checked but not counted."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=900)
    while not stop.is_set():
        if budget is not None:
            with plan.lock:
                if budget[0] <= 0:
                    return
                budget[0] -= 1
        first, count = plan.next()
        body = json.dumps({"text": lines[first:first + count], "options": options}).encode()
        start = time.perf_counter()
        try:
            conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read())
        except (OSError, http.client.HTTPException, ValueError):
            tally.add(0.0, count, None, False)
            conn.close()
            conn = http.client.HTTPConnection(server.host, server.port, timeout=900)
            continue
        now = time.perf_counter()
        if response.status != 200:
            tally.add(now - start, count, None, False)
            continue
        got = [t["text"] for t in data.get("translations", [])]
        tally.add(now - start, count, got == ref[first:first + count], now <= end)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else float("nan")


def load(server: ServerProcess, n_clients: int, lines, ref, options, *, seconds: float | None = None,
         requests: int | None = None, max_lines: int = 20, seed: int = 0, on_tick=None) -> dict:
    """n_clients clients for `seconds` (throughput and latency of the answers that came within
    them; the requests still out then are answered and checked, not counted), or until `requests`
    are sent (all counted). The measured row."""
    plan, tally, stop = Plan(len(lines), max_lines, seed), Tally(), threading.Event()
    budget = [requests] if requests is not None else None
    start = time.perf_counter()
    end = start + seconds if seconds is not None else float("inf")
    threads = [threading.Thread(target=client, args=(server, plan, lines, ref, options, tally, stop, end, budget))
               for _ in range(n_clients)]
    cpu0, calls0 = _cpu_seconds(server.proc.pid), server.health()["calls"]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if time.perf_counter() >= end and not stop.is_set():
            stop.set()
            cpu, load_avg = _cpu_seconds(server.proc.pid), os.getloadavg()[0]
        if on_tick is not None:
            on_tick(len(tally.latencies))
        time.sleep(0.05)
    wall = min(time.perf_counter(), end) - start
    if seconds is None:
        cpu, load_avg = _cpu_seconds(server.proc.pid), os.getloadavg()[0]
    health = server.health()
    return {"clients": n_clients, "requests": len(tally.latencies), "sentences": tally.sentences,
            "wall_s": wall, "sentences_per_s": tally.sentences / wall,
            "p50_ms": 1000 * percentile(tally.latencies, 50), "p95_ms": 1000 * percentile(tally.latencies, 95),
            "p99_ms": 1000 * percentile(tally.latencies, 99), "checked": tally.checked, "wrong": tally.wrong,
            "failed": tally.failed, "server_cpu": (cpu - cpu0) / wall, "load_avg": load_avg,
            "calls": health["calls"] - calls0, "largest_call": health["largest_call"]}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


# --------------------------------------------------------------------------- the run

def row_text(mode: str, r: dict) -> str:
    return (f"| {r['clients']} | {mode} | {r['sentences_per_s']:.1f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | "
            f"{r['p99_ms']:.0f} | {r['requests']} | {r['calls']} | {r['checked']} | {r['wrong']} | {r['failed']} | "
            f"{r['server_cpu']:.2f} | {r['sentences_per_s'] / max(r['server_cpu'], 1e-9):.1f} | {r['load_avg']:.1f} |")


def soak(server: ServerProcess, args, lines, ref, options) -> dict:
    samples: list[tuple[int, float]] = [(0, server.rss_mb())]
    every = max(1, args.soak_requests // 10)

    def tick(done: int) -> None:
        if done >= samples[-1][0] + every:
            samples.append((done, server.rss_mb()))

    row = load(server, args.soak_clients, lines, ref, options, requests=args.soak_requests,
               max_lines=args.soak_max_lines, seed=args.seed + 1, on_tick=tick)
    samples.append((row["requests"], server.rss_mb()))
    return {**row, "rss_mb": samples}


def arrivals(rate: float, seconds: float, n_lines: int, seed: int) -> list[tuple[float, int, int]]:
    """Seeded Poisson arrivals: (time, first line, count): 10% long requests of 33-64 lines, 45% one line,
    45% 2-4 lines."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        u = rng.random()
        count = rng.randint(33, 64) if u < 0.1 else 1 if u < 0.55 else rng.randint(2, 4)
        out.append((t, rng.randrange(n_lines - count + 1), count))


def open_loop(server: ServerProcess, plan, lines, ref, options) -> dict:
    """Send each planned request at its time (threads, a connection per request); latencies and checks."""
    from concurrent.futures import ThreadPoolExecutor

    done: list[tuple[int, float, float, bool | None]] = []  # (count, latency, answered at, ok)

    def send(first: int, count: int, sent: float) -> None:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=900)
        body = json.dumps({"text": lines[first:first + count], "options": options}).encode()
        try:
            conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read())
            ok = response.status == 200 and [t["text"] for t in data["translations"]] == ref[first:first + count]
        except (OSError, http.client.HTTPException, ValueError):
            ok = None
        finally:
            conn.close()
        now = time.perf_counter()
        done.append((count, now - sent, now, ok))

    cpu0 = _cpu_seconds(server.proc.pid)
    with ThreadPoolExecutor(max_workers=512) as pool:
        start = time.perf_counter()
        for at, first, count in plan:
            delay = start + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, first, count, time.perf_counter())
    wall = max(d[2] for d in done) - start
    one = [d[1] for d in done if d[0] == 1]
    every = [d[1] for d in done]
    return {"requests": len(done), "sentences": sum(d[0] for d in done), "wall_s": wall,
            "sentences_per_s": sum(d[0] for d in done) / wall, "one_line_requests": len(one),
            "one_line_p50_ms": 1000 * percentile(one, 50), "one_line_p95_ms": 1000 * percentile(one, 95),
            "p50_ms": 1000 * percentile(every, 50), "p95_ms": 1000 * percentile(every, 95),
            "wrong": sum(d[3] is False for d in done), "failed": sum(d[3] is None for d in done),
            "server_cpu": (_cpu_seconds(server.proc.pid) - cpu0) / wall, "load_avg": os.getloadavg()[0]}


def _post(server: ServerProcess, text: list[str], options: dict) -> tuple[float, list[str]]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=900)
    start = time.perf_counter()
    conn.request("POST", "/translate", json.dumps({"text": text, "options": options}).encode(),
                 {"Content-Type": "application/json"})
    data = json.loads(conn.getresponse().read())
    conn.close()
    return time.perf_counter() - start, [t["text"] for t in data["translations"]]


def behind_long(server: ServerProcess, lines, ref, options, rounds: int = 5) -> dict:
    """A one-line request sent 0.3 s after a 64-line one: both latencies per round, and both answers checked."""
    rows = []
    for k in range(rounds):
        first, one = 200 + 64 * k, 100 + k
        long: dict = {}
        t = threading.Thread(target=lambda: long.update(answer=_post(server, lines[first:first + 64], options)))
        t.start()
        time.sleep(0.3)
        seconds, got = _post(server, [lines[one]], options)
        t.join()
        ok = got == ref[one:one + 1] and long["answer"][1] == ref[first:first + 64]
        rows.append({"one_line_ms": 1000 * seconds, "long_ms": 1000 * long["answer"][0], "ok": ok})
    return {"rounds": rows, "one_line_ms": [r["one_line_ms"] for r in rows], "long_ms": [r["long_ms"] for r in rows],
            "wrong": sum(not r["ok"] for r in rows)}


def poisson(args, lines, ref, options, extra) -> dict:
    """Section 5 of the module docstring."""
    if args.p95_target is not None and args.poisson != sorted(args.poisson):
        raise SystemExit("--p95-target: give the --poisson rates in ascending order")
    servers: dict[str, ServerProcess] = {}
    out: dict = {"rows": []}
    over: set[str] = set()  # (--p95-target) servers whose p95 passed the target at a lower rate
    try:
        for mode in ("step", "call"):
            servers[mode] = ServerProcess(args.checkpoint, "--scheduling", mode, *extra)
        if args.eager:
            servers["step-eager"] = ServerProcess(args.checkpoint, "--scheduling", "step", *extra,
                                                  env={"NMT_CUDA_GRAPHS": "0"})
        for server in servers.values():
            load(server, 4, lines, ref, options, requests=8, max_lines=args.max_lines, seed=99)
        idle = [load(servers["step"], 1, lines, ref, options, requests=1, max_lines=1, seed=s)["p50_ms"] / 1000
                for s in range(40)]
        out["idle_one_line_ms"] = {"p50": 1000 * percentile(idle, 50), "p95": 1000 * percentile(idle, 95)}
        print(f"idle one-line requests (40, one at a time): p50 {1000 * percentile(idle, 50):.0f} ms, p95 "
              f"{1000 * percentile(idle, 95):.0f} ms", flush=True)
        for mode, server in servers.items():
            b = out[f"behind_long_{mode}"] = behind_long(server, lines, ref, options)
            print(f"{mode}: a one-line request 0.3 s after a 64-line one: "
                  f"{', '.join(f'{x:.0f}' for x in b['one_line_ms'])} ms (the 64-line one: "
                  f"{', '.join(f'{x:.0f}' for x in b['long_ms'])} ms); wrong {b['wrong']}", flush=True)
        print("| rate (req/s) | scheduling | sentences/s | one-line p50 ms | one-line p95 ms | all p50 ms | all p95 ms "
              "| requests | wrong | failed | server CPU (cores) | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for k, rate in enumerate(args.poisson):
            plan = arrivals(rate, args.seconds, len(lines), args.seed + k)
            for mode in (list(servers) if k % 2 == 0 else list(servers)[::-1]):
                if mode in over:
                    continue
                r = open_loop(servers[mode], plan, lines, ref, options)
                out["rows"].append({"rate": rate, "scheduling": mode, **r})
                print(f"| {rate:g} | {mode} | {r['sentences_per_s']:.1f} | {r['one_line_p50_ms']:.0f} | "
                      f"{r['one_line_p95_ms']:.0f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['requests']} | "
                      f"{r['wrong']} | {r['failed']} | {r['server_cpu']:.2f} | {r['load_avg']:.1f} |", flush=True)
                if args.p95_target is not None and r["p95_ms"] > args.p95_target:
                    over.add(mode)
        if args.p95_target is not None:
            out["at_p95_target"] = at_target(out["rows"], args.p95_target)
            for mode, best in out["at_p95_target"].items():
                print(f"{mode}: sentences/s at p95 <= {args.p95_target:g} ms: " + (
                    f"{best['sentences_per_s']:.1f} (at {best['rate']:g} requests/s)" if best else "none of the rates"),
                    flush=True)
    finally:
        out["exit_codes"] = {m: s.stop() for m, s in servers.items()}
    return out


def at_target(rows: list[dict], target_ms: float) -> dict[str, dict | None]:
    """Per server the row with the most sentences/s among those whose p95 latency (all requests) is within
    `target_ms` and that answered every request right (None: no such row)."""
    best: dict[str, dict | None] = {}
    for r in rows:
        ok = r["p95_ms"] <= target_ms and not r["wrong"] and not r["failed"]
        current = best.setdefault(r["scheduling"], None)
        if ok and (current is None or r["sentences_per_s"] > current["sentences_per_s"]):
            best[r["scheduling"]] = {"rate": r["rate"], "sentences_per_s": r["sentences_per_s"], "p95_ms": r["p95_ms"]}
    return best


def streamed(args, lines: list[str], ref: list[str], options: dict, extra: list[str]) -> dict:
    """Section 6: the arrival times of one streamed N-line request's lines (module docstring)."""
    n, server = args.stream, ServerProcess(args.checkpoint, *extra)
    rows, wrong = [], 0
    try:
        for k in range(6):  # the first is the warm-up
            first = (k * 97) % (len(lines) - n)
            conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
            body = json.dumps({"text": lines[first:first + n], "options": options, "stream": True})
            start = time.perf_counter()
            conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            times, items = [], []
            while line := r.readline():
                times.append(1000 * (time.perf_counter() - start))
                items.append(json.loads(line))
            conn.close()
            texts = [x.get("text") for x in items[:-1]]
            wrong += texts != ref[first:first + n] or items[-1] != {"done": True, "lines": n}
            if k:
                rows.append({"first_ms": times[0], "quarter_ms": times[max(0, n // 4 - 1)], "whole_ms": times[-1]})
    finally:
        code = server.stop()
    med = lambda key: sorted(r[key] for r in rows)[len(rows) // 2]  # noqa: E731
    print(f"streamed {n}-line requests: first line {med('first_ms'):.0f} ms, first quarter {med('quarter_ms'):.0f} "
          f"ms, whole answer {med('whole_ms'):.0f} ms (medians of {len(rows)}); {wrong} wrong; exit {code}; "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    return {"stream": n, "rows": rows, "wrong": wrong, "exit_code": code, "options": options}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "-c", required=True)
    p.add_argument("--input", default=os.path.join(ROOT, "data/bible-es-en/test.es.gz"))
    p.add_argument("--clients", type=int, nargs="*", default=[1, 8, 32, 64], help="(none: the soak only)")
    p.add_argument("--seconds", type=float, default=15.0, help="per measured cell, at least")
    p.add_argument("--seconds-per-client", type=float, default=1.2,
                   help="cells last max(--seconds, clients x this): several rounds of every client's requests")
    p.add_argument("--max-lines", type=int, default=20, help="sentences per request: 1..N")
    p.add_argument("--options", default="{}", help="decode options of every request, JSON (default: the model's)")
    p.add_argument("--soak-requests", type=int, default=0)
    p.add_argument("--soak-clients", type=int, default=64)
    p.add_argument("--soak-max-lines", type=int, default=20)
    p.add_argument("--server-args", default="", help="extra flags for both servers, e.g. '--batch-window-ms 10'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--poisson", type=float, nargs="*", help="request rates (per second): section 5 only")
    p.add_argument("--p95-target", type=float, metavar="MS",
                   help="(--poisson, rates ascending) each server's sentences/s at p95 <= MS: its best rate within it; "
                        "a server is not run at higher rates once its p95 passed MS")
    p.add_argument("--eager", action="store_true",
                   help="(--poisson) a third server: step scheduling with NMT_CUDA_GRAPHS=0 (on CUDA its calls join "
                        "their steps instead of taking turns at CUDA-graphed ones)")
    p.add_argument("--stream", type=int, metavar="N", help="lines per streamed request: section 6 only")
    p.add_argument("--json", help="write every measurement here")
    args = p.parse_args()
    options = json.loads(args.options)
    lines = [line for line in read_lines(args.input) if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        ref, cmd_s = reference(args.checkpoint, lines, options, tmp)
    print(f"nmt translate: {len(lines)} sentences in {cmd_s:.1f} s whole command = {len(lines) / cmd_s:.1f} "
          f"sentences/s (load avg {os.getloadavg()[0]:.1f})", flush=True)
    extra = args.server_args.split() + ["--max-queue", "1024", "--timeout", "600", *decode_flags(options)]
    if args.poisson or args.stream:
        out = (poisson if args.poisson else streamed)(args, lines, ref, options, extra)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return 0
    servers = {"on": ServerProcess(args.checkpoint, *extra), "off": ServerProcess(args.checkpoint, "--no-batching", *extra)}
    out = {"nmt_translate": {"sentences": len(lines), "seconds": cmd_s}, "rows": [], "options": options}
    try:
        for server in servers.values():  # warm-up: first calls allocate
            load(server, 4, lines, ref, options, requests=8, max_lines=args.max_lines, seed=99)
        out["rss_after_warmup_mb"] = {m: s.rss_mb() for m, s in servers.items()}
        print("| clients | batching | sentences/s | p50 ms | p95 ms | p99 ms | requests | calls | checked | wrong | "
              "failed | server CPU (cores) | sentences per server CPU-s | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for k, n in enumerate(args.clients):
            for mode in (("on", "off") if k % 2 == 0 else ("off", "on")):
                seconds = max(args.seconds, n * args.seconds_per_client)
                row = load(servers[mode], n, lines, ref, options, seconds=seconds, max_lines=args.max_lines,
                           seed=args.seed + k)
                out["rows"].append({"batching": mode, **row})
                print(row_text(mode, row), flush=True)
        out["rss_after_table_mb"] = {m: s.rss_mb() for m, s in servers.items()}
        if args.soak_requests:
            servers["off"].stop()
            out["soak"] = soak(servers["on"], args, lines, ref, options)
            s = out["soak"]
            print(f"soak: {s['requests']} requests ({s['sentences']} sentences) from {args.soak_clients} clients in "
                  f"{s['wall_s']:.0f} s: wrong {s['wrong']}, failed {s['failed']}; {s['sentences_per_s']:.1f} "
                  f"sentences/s, p50/p95/p99 {s['p50_ms']:.0f}/{s['p95_ms']:.0f}/{s['p99_ms']:.0f} ms; RSS MB "
                  + ", ".join(f"{n}: {mb:.0f}" for n, mb in s["rss_mb"]), flush=True)
    finally:
        out["exit_codes"] = {m: s.stop() if s.proc.poll() is None else s.proc.returncode for m, s in servers.items()}
    print(f"server exit codes after SIGTERM: {out['exit_codes']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

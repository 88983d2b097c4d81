"""The metrics of `nmt serve` (nmt/commands/serve.py) at GET /metrics, in Prometheus' text format: one
registry per app (never prometheus_client's global one, so several apps in a process keep their own).

    nmt_requests_total{status}           POST /translate answers by status (not the Guard's refusals; 499:
                                         the client went away; a stream: 200, or the status of its error)
    nmt_lines_total, nmt_tokens_total    lines answered, and the subword tokens of their best translations
    nmt_queue_length                     requests waiting for the model
    nmt_running_lines                    lines in the translate calls now running
    nmt_time_to_first_line_seconds       from a request's arrival to its first line ready to send
    nmt_request_seconds                  from a request's arrival to its whole answer (requests answered 200)
    nmt_batch_fill                       lines per translate call over --batch-lines (above 1: one request
                                         holds more lines than that)
    nmt_decoding_steps_total             decoding steps run (PyTorch: one forward pass each, nmt/search/joining.py)
    nmt_joined_decoding_steps_total      ... of them, those that served the searches of several calls at once
    nmt_decoding_rows_total              rows (sentences x beams) those steps decoded: over the steps, the rows
                                         running per step
    nmt_running_rows                     rows of the searches running now
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # histogram buckets
FILL = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0)


class Metrics:
    """The server's metrics (module docstring) in their own registry; `queued` says how many requests wait."""

    def __init__(self, queued: Callable[[], int], batch_lines: int,
                 steps: Callable[[], dict[str, int] | None] = lambda: None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.batch_lines = batch_lines
        self.requests = Counter("nmt_requests", "POST /translate answers by status (499: the client went away)",
                                ["status"], registry=r)
        self.lines = Counter("nmt_lines", "lines answered", registry=r)
        self.tokens = Counter("nmt_tokens", "subword tokens of the best translation of the lines answered", registry=r)
        Gauge("nmt_queue_length", "requests waiting for the model", registry=r).set_function(queued)
        self.running = Gauge("nmt_running_lines", "lines in the translate calls now running", registry=r)
        self.first_line = Histogram("nmt_time_to_first_line_seconds", "from a request's arrival to its first line",
                                    buckets=SECONDS, registry=r)
        self.request_time = Histogram("nmt_request_seconds", "from a request's arrival to its whole answer",
                                      buckets=SECONDS, registry=r)
        self.fill = Histogram("nmt_batch_fill", "lines per translate call over --batch-lines", buckets=FILL,
                              registry=r)
        r.register(_StepCounts(steps))

    @contextlib.contextmanager
    def call(self, lines: int) -> Iterator[None]:
        """Around a translate call of `lines` lines (the lines running while it runs)."""
        self.fill.observe(lines / self.batch_lines)
        self.running.inc(lines)
        try:
            yield
        finally:
            self.running.dec(lines)

    def served(self, results: Sequence, seconds: float, first: float | None = None) -> None:
        """A request's results (TranslationResults) are ready to send, `seconds` after its arrival, its first
        line `first` seconds after it (a streamed answer; default: with the others)."""
        self.lines.inc(len(results))
        self.tokens.inc(sum(r.hypotheses[0].tokens for r in results))
        self.first_line.observe(seconds if first is None else first)

    def render(self) -> tuple[bytes, str]:
        """(the text exposition of every metric, its content type)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _StepCounts:
    """The translator's decoding step counters (`Translator.step_counts`), read when the metrics are."""

    NAMES = {"steps": ("nmt_decoding_steps", "decoding steps run"),
             "joined": ("nmt_joined_decoding_steps", "decoding steps that served several calls at once"),
             "rows": ("nmt_decoding_rows", "rows (sentences x beams) the decoding steps decoded")}

    def __init__(self, counts: Callable[[], dict[str, int] | None]):
        self.counts = counts

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        counts = self.counts()
        if counts is None:
            return
        for key, (name, text) in self.NAMES.items():
            yield CounterMetricFamily(name, text, value=counts[key])
        yield GaugeMetricFamily("nmt_running_rows", "rows (sentences x beams) of the searches running now",
                                value=counts["running_rows"])

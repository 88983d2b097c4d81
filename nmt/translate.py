"""Translate text with a trained model: batching, order, n-best, and `nmt translate`.

`translate_nbest` / `translate_lines` are the library entry points (also used
by training validation). They encode the lines, sort them by source length
into token-budget batches (`decode.batch_tokens` padded source positions, at
most `decode.max_batch_size` sentences), run `greedy_search` (beam_size 1) or
`beam_search`, restore the input order and detokenize. Guarantees:

- one result per input line, in the input's order;
- a line that encodes to no tokens (empty, blank) gives "" without reaching
  the model;
- a line longer than the model accepts is truncated to
  `model.max_positions - 1` tokens (room for the source EOS), never dropped;
  one warning counts them;
- each sentence is decoded independently of its batch companions (masks), so
  results do not depend on batch composition.

`translate_command` (`nmt translate`) reads stdin or a file, writes stdout or
a file, and streams: the input is processed in chunks of `CHUNK_LINES` lines
(one line at a time when stdin is a terminal), each sorted, translated and
written in order. Output format: one line per input line; with nbest > 1,
`nbest` lines per input line, `INDEX ||| TEXT ||| SCORE` (INDEX the 0-based
input line, SCORE the hypothesis score after the length penalty, best first).
"""

from __future__ import annotations

import contextlib
import gzip
import dataclasses
import os
import sys
from typing import IO, Callable, Iterator, Sequence

import torch

from nmt.config import DecodeConfig
from nmt.errors import UserError
from nmt.masks import padding_mask
from nmt.tokenizer import EOS_ID, PAD_ID

CHUNK_LINES = 10_000  # lines sorted and translated together by translate_command
Warn = Callable[[str], None]


def _stderr_warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- setup

def resolve_device(name: str | torch.device | None) -> torch.device:
    """"auto"/None -> CUDA if available, else CPU; otherwise torch.device(name)."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"invalid device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but CUDA is not available")
    return device


def load_model(checkpoint: str, device: str | torch.device = "auto", pack_weights: bool = True):
    """(model in eval mode, tokenizer, Config) from a checkpoint file. On CPU the linear layers
    get oneDNN-packed weights for decoding (`nmt.runtime.pack_linear_weights`) unless pack_weights=False."""
    from nmt.checkpoint import load_for_inference
    from nmt.runtime import pack_linear_weights

    if not os.path.isfile(checkpoint):
        raise UserError(f"checkpoint not found: {checkpoint}")
    model, tokenizer, cfg = load_for_inference(checkpoint, resolve_device(device))
    if pack_weights and model_device(model).type == "cpu":
        pack_linear_weights(model)
    return model, tokenizer, cfg


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def decode_settings(decode: DecodeConfig, **overrides) -> DecodeConfig:
    """`decode` with the non-None overrides applied (CLI names: beam, nbest,
    batch_tokens, max_len_a, max_len_b, min_len, length_penalty), checked."""
    names = {"beam": "beam_size"}
    changes = {names.get(k, k): v for k, v in overrides.items() if v is not None}
    unknown = set(changes) - {f.name for f in dataclasses.fields(DecodeConfig)}
    if unknown:
        raise TypeError(f"unknown decode settings: {sorted(unknown)}")
    d = dataclasses.replace(decode, **changes)
    checks = [(d.beam_size >= 1, f"beam size must be >= 1, got {d.beam_size}"),
              (d.nbest >= 1, f"nbest must be >= 1, got {d.nbest}"),
              (d.nbest <= d.beam_size, f"nbest ({d.nbest}) cannot exceed the beam size ({d.beam_size})"),
              (d.batch_tokens >= 1, f"batch tokens must be >= 1, got {d.batch_tokens}"),
              (d.max_batch_size >= 1, f"max batch size must be >= 1, got {d.max_batch_size}"),
              (d.workers >= 0, f"workers must be >= 0 (0 = auto), got {d.workers}"),
              (d.max_len_a >= 0 and d.max_len_b >= 1, f"need max_len_a >= 0 and max_len_b >= 1, got {d.max_len_a}, {d.max_len_b}"),
              (d.min_len >= 0, f"min_len must be >= 0, got {d.min_len}"),
              (d.length_penalty >= 0, f"length penalty must be >= 0, got {d.length_penalty}")]
    for ok, msg in checks:
        if not ok:
            raise UserError(msg)
    return d


# --------------------------------------------------------------------------- batching

def max_source_tokens(model) -> int:
    """Longest source (subword tokens, EOS not counted) the model accepts."""
    return model.max_positions - 1


def make_batches(lengths: Sequence[int], batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Indices grouped into batches, longest sentences first.

    `lengths` are padded-tensor lengths (EOS included). A batch holds at most
    `max_batch_size` sentences and `B * max(length) <= batch_tokens` positions;
    a sentence over the budget on its own gets a batch of one. Equal lengths
    keep their input order (stable sort), so batching is deterministic.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted descending: the first sentence of a batch is its longest.
        width = lengths[current[0]] if current else lengths[i]
        if current and ((len(current) + 1) * width > batch_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def resolve_workers(workers: int, device: torch.device | str, threads: int | None = None) -> int:
    """decode.workers with 0 (auto) resolved: 2 on a CPU with at least 2 threads (default: torch's
    intra-op threads), else 1. Two workers with half the threads each decode a median 1.17x faster
    than one on 2 cores at batch 32 (0.97-1.48x over 12 whole-command pairs), with the same output
    (BENCHMARKS.md); more workers are not measured."""
    if workers:
        return workers
    threads = torch.get_num_threads() if threads is None else threads
    return 2 if torch.device(device).type == "cpu" and threads >= 2 else 1


def run_batches(fn: Callable[[list[int]], object], batches: Sequence[list[int]], workers: int,
                torch_device: torch.device | None = None,
                costs: Sequence[float] | None = None) -> Iterator[tuple[list[int], object]]:
    """(batch, fn(batch)) for each batch, in order; with workers > 1, `workers` batches run at
    once in a thread pool (torch and CTranslate2 release the GIL inside their work).

    torch_device: the device of a torch model that fn runs. On CPU the workers share torch's
    intra-op threads (threads / workers each, restored afterwards): at 32-160 rows one op does
    not keep two cores busy (an OpenMP fork/join per op, Python between ops), two batches at
    once with one thread each do (BENCHMARKS.md). On other devices batches run one at a time.
    costs: each batch's estimated work (`batch_cost`). Given them, the pool
    takes the largest batches first, and the batches run one at a time, with all threads, when
    they cannot be shared out evenly (see `_balanced`): one large batch and one small one
    would otherwise leave a core idle while the large one runs on half the threads.
    On an error, queued batches are dropped and running ones finish before it propagates.
    """
    if torch_device is not None and torch_device.type != "cpu":
        workers = 1
    if costs is not None and workers > 1 and not _balanced(costs, workers):
        workers = 1
    if workers <= 1 or len(batches) <= 1:
        for batch in batches:
            yield batch, fn(batch)
        return
    from concurrent.futures import ThreadPoolExecutor

    threads = torch.get_num_threads()
    if torch_device is not None:
        torch.set_num_threads(max(1, threads // workers))  # read by each worker thread at its first op
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nmt-decode")
    try:
        order = range(len(batches)) if costs is None else sorted(range(len(batches)), key=lambda i: -costs[i])
        futures = {i: pool.submit(fn, batches[i]) for i in order}  # largest first
        for i, batch in enumerate(batches):
            yield batch, futures[i].result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if torch_device is not None:
            torch.set_num_threads(threads)


def batch_cost(lengths: Sequence[int]) -> int:
    """A batch's estimated decoding work for `run_batches`: its padded source tokens."""
    return len(lengths) * max(lengths)


def _balanced(costs: Sequence[float], workers: int, slack: float = 1.2) -> bool:
    """True when the largest-first schedule of `costs` on `workers` workers ends within `slack` x
    the perfectly even share. A worker with 1/workers of the threads runs a batch about 1.35-1.8x
    slower than all threads do (2 cores, BENCHMARKS.md), so a worse balance is slower than
    running the batches one at a time."""
    loads = [0.0] * workers
    for c in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += c
    return max(loads) <= slack * sum(loads) / workers


def _decode_batch(model, src_ids: list[list[int]], decode: DecodeConfig, device: torch.device) -> list[list]:
    """Search over one batch; returns per sentence a list of Hypothesis, best first."""
    from nmt.search import beam_search, greedy_search

    width = max(len(ids) for ids in src_ids)
    src = torch.tensor([ids + [PAD_ID] * (width - len(ids)) for ids in src_ids], device=device)  # [B,S]
    lengths = torch.tensor([len(ids) for ids in src_ids], device=device)  # [B]
    src_mask = padding_mask(lengths, width)  # [B,S] True = token
    limits = dict(max_len_a=decode.max_len_a, max_len_b=decode.max_len_b, min_len=decode.min_len)
    if decode.beam_size == 1:
        return [[h] for h in greedy_search(model, src, src_mask, **limits)]
    return beam_search(model, src, src_mask, beam_size=decode.beam_size, nbest=decode.nbest,
                       length_penalty=decode.length_penalty, length_penalty_type=decode.length_penalty_type,
                       **limits)


def _translate(model, tokenizer, lines: Sequence[str], decode: DecodeConfig, device,
               on_batch: Callable[[int], None] | None = None) -> tuple[list[list[tuple[str, float]]], int]:
    """Core of translation: per line the n-best (text, score) pairs, and the number of truncated lines.

    `model` may be wrapped (DDP, torch.compile); the plain model is used. Its
    train/eval mode is restored afterwards. `on_batch(n)` reports progress.
    """
    from nmt.checkpoint import unwrap

    if decode.nbest > decode.beam_size:
        raise UserError(f"nbest ({decode.nbest}) cannot exceed the beam size ({decode.beam_size})")
    model, device = unwrap(model), torch.device(device)
    encoded = tokenizer.encode_src(list(lines))
    limit = max_source_tokens(model)
    n_truncated = sum(len(ids) > limit for ids in encoded)
    src_ids = [ids[:limit] + [EOS_ID] for ids in encoded]  # as in training: x + EOS, no BOS
    results: list[list[tuple[str, float]]] = [[("", 0.0)] * decode.nbest for _ in lines]
    todo = [i for i, ids in enumerate(encoded) if ids]  # lines without tokens stay ""
    if on_batch is not None and len(todo) < len(lines):
        on_batch(len(lines) - len(todo))
    was_training = model.training
    model.eval()
    batches = [[todo[j] for j in batch]  # positions in `lines`
               for batch in make_batches([len(src_ids[i]) for i in todo], decode.batch_tokens, decode.max_batch_size)]
    search = lambda indices: _decode_batch(model, [src_ids[i] for i in indices], decode, device)
    costs = [batch_cost([len(src_ids[i]) for i in b]) for b in batches]
    workers = resolve_workers(decode.workers, device)
    try:
        with torch.inference_mode(), contextlib.closing(run_batches(search, batches, workers, device, costs)) as done:
            for indices, nbests in done:
                texts = iter(tokenizer.decode_tgt([h.tokens for hyps in nbests for h in hyps]))
                for i, hyps in zip(indices, nbests):
                    results[i] = [(one_line(next(texts)), float(h.score)) for h in hyps]
                if on_batch is not None:
                    on_batch(len(indices))
    finally:
        model.train(was_training)
    return results, n_truncated


def one_line(text: str) -> str:
    """A hypothesis on one line, whatever the vocabulary holds."""
    return text.replace("\r", " ").replace("\n", " ") if ("\n" in text or "\r" in text) else text


def truncation_warning(n: int, max_positions: int) -> str:
    return (f"warning: {n} input line{'s' if n != 1 else ''} longer than {max_positions - 1} tokens "
            f"(model.max_positions - 1) {'were' if n != 1 else 'was'} truncated")


def translate_nbest(model, tokenizer, lines: Sequence[str], decode: DecodeConfig, device, progress: bool = False,
                    warn: Warn | None = None) -> list[list[tuple[str, float]]]:
    """Per input line, `decode.nbest` (text, score) pairs, best first (greedy when beam_size == 1).

    Empty lines give `decode.nbest` copies of ("", 0.0). Over-long lines are
    truncated and counted in one warning passed to `warn` (default: stderr).
    `progress` shows a tqdm bar (sentences) on stderr.
    """
    from tqdm import tqdm

    with tqdm(total=len(lines), disable=not progress, unit="sent", file=sys.stderr, dynamic_ncols=True) as bar:
        results, n_truncated = _translate(model, tokenizer, lines, decode, device, bar.update)
    if n_truncated:
        from nmt.checkpoint import unwrap

        (warn or _stderr_warn)(truncation_warning(n_truncated, unwrap(model).max_positions))
    return results


def translate_lines(model, tokenizer, lines: Sequence[str], decode: DecodeConfig, device, progress: bool = False,
                    warn: Warn | None = None) -> list[str]:
    """One translation per input line, in order (the best hypothesis; see translate_nbest)."""
    decode = dataclasses.replace(decode, nbest=1)
    return [nbest[0][0] for nbest in translate_nbest(model, tokenizer, lines, decode, device, progress, warn)]


def format_nbest(index: int, hyps: Sequence[tuple[str, float]]) -> list[str]:
    """n-best lines `INDEX ||| TEXT ||| SCORE` for input line `index` (0-based)."""
    return [f"{index} ||| {text} ||| {score:.4f}" for text, score in hyps]


# --------------------------------------------------------------------------- files

@contextlib.contextmanager
def open_input(path: str | None, stdin: IO[bytes] | None = None) -> Iterator[IO[bytes]]:
    """A binary stream: the file at `path` (.gz read transparently), or standard input
    when path is None or "-"."""
    if path is None or path == "-":
        yield stdin if stdin is not None else sys.stdin.buffer
        return
    if not os.path.isfile(path):
        raise UserError(f"input file not found: {path}")
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        yield f


def iter_source_chunks(stream: IO[bytes], name: str, chunk_lines: int) -> Iterator[list[str]]:
    """Decoded lines (newline removed) in lists of at most `chunk_lines`.
    Invalid UTF-8 raises UserError naming the line."""
    chunk: list[str] = []
    for number, raw in enumerate(stream, 1):
        try:
            chunk.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError:
            raise UserError(f"{name}: line {number} is not valid UTF-8") from None
        if len(chunk) >= chunk_lines:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def read_source(stream: IO[bytes], name: str) -> list[str]:
    """All lines of a binary stream (see iter_source_chunks)."""
    return [line for chunk in iter_source_chunks(stream, name, CHUNK_LINES) for line in chunk]


def count_lines(path: str) -> int:
    n, last = 0, b"\n"
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def check_io_paths(input: str | None, output: str | None) -> None:
    """Fail early (before loading a model) on a missing input or an output that is the input."""
    if input is None or input == "-":
        return
    if not os.path.isfile(input):
        raise UserError(f"input file not found: {input}")
    if output not in (None, "-") and os.path.exists(output) and os.path.samefile(input, output):
        raise UserError(f"input and output are the same file: {input}")


def stream_translations(translate_chunk: Callable[[list[str], Callable[[int], None]], tuple[list, int]],
                        input: str | None, output: str | None, *, nbest: int, max_positions: int,
                        quiet: bool = False, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
                        stderr: IO[str] | None = None, chunk_lines: int = CHUNK_LINES) -> None:
    """The I/O loop of `nmt translate`, for any engine.

    Reads `input` (file, .gz, or stdin when None/"-") in chunks, calls
    `translate_chunk(lines, on_batch) -> (per-line n-best (text, score) lists, n_truncated)`,
    writes one line per input line (or the n-best format) to `output` (stdout when None/"-"),
    with a progress bar when reading a file and one truncation warning at the end, both
    unless quiet. `max_positions` is the model's, for the warning.
    """
    stderr = stderr if stderr is not None else sys.stderr
    from_file = input is not None and input != "-"
    with open_input(input, stdin) as src:
        if not from_file and getattr(src, "isatty", lambda: False)():
            chunk_lines = 1  # interactive: answer each line as it is typed
        from tqdm import tqdm

        total = count_lines(input) if from_file and not quiet else None
        with contextlib.ExitStack() as stack:
            bar = stack.enter_context(tqdm(total=total, disable=quiet or not from_file, unit="sent",
                                           file=stderr, dynamic_ncols=True))
            if output is None or output == "-":
                out = stdout if stdout is not None else sys.stdout.buffer
            else:
                out = stack.enter_context(open(output, "wb"))
            n_truncated, index = 0, 0
            for lines in iter_source_chunks(src, input if from_file else "<stdin>", chunk_lines):
                results, n = translate_chunk(lines, bar.update)
                n_truncated += n
                if nbest == 1:
                    text = "".join(r[0][0] + "\n" for r in results)
                else:
                    text = "".join(line + "\n" for k, r in enumerate(results) for line in format_nbest(index + k, r))
                index += len(lines)
                out.write(text.encode("utf-8"))
                out.flush()
    if n_truncated and not quiet:
        print(truncation_warning(n_truncated, max_positions), file=stderr, flush=True)


def translate_command(checkpoint: str, input: str | None, output: str | None, *, beam: int | None = None,
                      nbest: int | None = None, batch_tokens: int | None = None, device: str = "auto",
                      max_len_a: float | None = None, max_len_b: int | None = None, min_len: int | None = None,
                      length_penalty: float | None = None, batch_size: int | None = None, workers: int | None = None,
                      quiet: bool = False, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
                      stderr: IO[str] | None = None, chunk_lines: int = CHUNK_LINES) -> int:
    """`nmt translate`: input file or stdin -> output file or stdout. Settings left None
    come from the checkpoint's `decode` section. A progress bar (stderr) is shown when
    reading a file, unless quiet; quiet also silences the truncation warning. Returns 0."""
    check_io_paths(input, output)
    model, tokenizer, cfg = load_model(checkpoint, device)
    decode = decode_settings(cfg.decode, beam=beam, nbest=nbest, batch_tokens=batch_tokens, max_len_a=max_len_a,
                             max_len_b=max_len_b, min_len=min_len, length_penalty=length_penalty,
                             max_batch_size=batch_size, workers=workers)
    dev = model_device(model)
    stream_translations(lambda lines, on_batch: _translate(model, tokenizer, lines, decode, dev, on_batch),
                        input, output, nbest=decode.nbest, max_positions=model.max_positions, quiet=quiet,
                        stdin=stdin, stdout=stdout, stderr=stderr, chunk_lines=chunk_lines)
    return 0


def average_command(checkpoints: Sequence[str], output: str, *, quiet: bool = False) -> int:
    """`nmt average`: write the parameter average of `checkpoints` to `output`. Returns 0."""
    from nmt.checkpoint import average_checkpoints

    if not checkpoints:
        raise UserError("average needs at least one checkpoint")
    for path in checkpoints:
        if not os.path.isfile(path):
            raise UserError(f"checkpoint not found: {path}")
    if any(os.path.exists(output) and os.path.samefile(output, p) for p in checkpoints):
        raise UserError(f"the output {output} is one of the checkpoints being averaged")
    average_checkpoints(list(checkpoints), output)
    if not quiet:
        print(f"averaged {len(checkpoints)} checkpoints into {output}", file=sys.stderr)
    return 0

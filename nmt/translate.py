"""The one text pipeline: `nmt translate`, and translation for `nmt evaluate`, `nmt score`
and validation during training, for both engines (nmt/engine.py).

`translate_nbest(engine, lines, decode)` encodes the lines, sorts them by source
length into token-budget batches (`decode.batch_tokens` padded source positions, at
most `decode.max_batch_size` sentences), runs `engine.search_batch` on them (several
batches at once with `decode.workers`), detokenizes and restores the input order.
Guarantees:

- one result per input line, in the input's order;
- a line that encodes to no tokens (empty, blank) gives "" without reaching the model;
- a line longer than the model accepts is truncated to `max_positions - 1` tokens (room
  for the source EOS), never dropped; one warning counts them;
- each sentence is searched independently of its batch companions, so results do not
  depend on batching or workers;
- every output text is one line (`textio.one_line`).

`translate_command` (`nmt translate`) streams: the input is read in chunks of
`CHUNK_LINES` lines (one line at a time when stdin is a terminal), each sorted,
translated and written in order. Output: one line per input line; with nbest > 1,
`nbest` lines per input line, `INDEX ||| TEXT ||| SCORE` (INDEX the 0-based input line,
SCORE the hypothesis score after the length penalty, best first). A file output is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, Sequence

from nmt import protect, textio
from nmt.config import DecodeConfig, decode_config
from nmt.engine import Engine
from nmt.errors import UserError

CHUNK_LINES = 10_000  # lines sorted and translated together by translate_command
Warn = Callable[[str], None]
Progress = Callable[[int], None]


@dataclass
class Translation:
    """One output of one input line: text, score (after the length penalty), log_prob (summed
    token log-probabilities), finished (False: it stopped at the maximum length), alignment
    ((source, target) subword index pairs, with decode.alignment) and protected (with
    decode.protect: None if the line had no protected span, else whether every span came
    back exactly once)."""

    text: str
    score: float
    log_prob: float
    finished: bool = True
    alignment: list[tuple[int, int]] | None = None
    protected: bool | None = None

    def format_alignment(self) -> str:
        return " ".join(f"{i}-{j}" for i, j in self.alignment or [])


EMPTY = Translation("", 0.0, 0.0, True)


def _stderr_warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- batching

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


def run_batches(fn: Callable[[list[int]], object], batches: Sequence[list[int]], workers: int,
                torch_device=None, costs: Sequence[float] | None = None) -> Iterator[tuple[list[int], object]]:
    """(batch, fn(batch)) for each batch, in order; with workers > 1, `workers` batches run at
    once in a thread pool (torch and CTranslate2 release the GIL inside their work).

    torch_device: the device of a torch model that fn runs. On CPU the workers share torch's
    intra-op threads (threads / workers each, restored afterwards): at 32-160 rows one op does
    not keep two cores busy (an OpenMP fork/join per op, Python between ops), two batches at
    once with one thread each do. On other devices batches run one at a time.
    costs: each batch's estimated work (`batch_cost`). Given them, the pool
    takes the largest batches first, and the batches run one at a time, with all threads, when
    they cannot be shared out evenly (see `_balanced`): one large batch and one small one
    would otherwise leave a core idle while the large one runs on half the threads.
    On an error, queued batches are dropped and running ones finish before it propagates.
    """
    import torch

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
    the perfectly even share. A worker with 1/workers of the threads runs a batch markedly slower
    than all threads do, so a worse balance is slower than running the batches one at a time."""
    loads = [0.0] * workers
    for c in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += c
    return max(loads) <= slack * sum(loads) / workers


def run_engine(engine, fn: Callable[[list[int]], Any], lengths: Sequence[int], decode: DecodeConfig,
               on_batch: Progress | None = None) -> Iterator[tuple[list[int], Any]]:
    """fn over the token-budget batches of items with these padded `lengths`, with the engine's
    workers, in batch order: (item indices, fn(item indices)). Used for search and scoring."""
    from nmt.engine import resolve_workers

    batches = make_batches(lengths, decode.batch_tokens, decode.max_batch_size)
    torch_device = engine.torch_device
    workers = engine.workers if engine.workers is not None else resolve_workers(decode.workers, torch_device)
    costs = [batch_cost([lengths[i] for i in b]) for b in batches] if torch_device is not None else None
    with engine.running(), contextlib.closing(run_batches(fn, batches, workers, torch_device, costs)) as done:
        for batch, result in done:
            yield batch, result
            if on_batch is not None:
                on_batch(len(batch))


# --------------------------------------------------------------------------- text

def encode_sources(engine, lines: Sequence[str]) -> tuple[list[list[int]], int]:
    """Subword ids of each line (no EOS), truncated to max_positions - 1, and how many were truncated."""
    encoded = engine.tokenizer.encode_src(list(lines))
    limit = engine.max_positions - 1
    return [ids[:limit] for ids in encoded], sum(len(ids) > limit for ids in encoded)


def truncation_warning(n: int, max_positions: int) -> str:
    return (f"warning: {n} input line{'s' if n != 1 else ''} longer than {max_positions - 1} tokens "
            f"(model.max_positions - 1) {'were' if n != 1 else 'was'} truncated")


def translate_chunk(engine, lines: Sequence[str], decode: DecodeConfig, on_batch: Progress | None = None, *,
                    first_line: int = 0, prefixes: Sequence[str] | None = None) -> tuple[list[list[Translation]], int]:
    """The core: per line `decode.nbest` Translations (best first), and the number of truncated lines.

    first_line: the input line number of lines[0] (sampling keys). prefixes: per line a target
    prefix text the output must start with (may be empty).
    """
    spans: list[list[str]] = [[] for _ in lines]
    if decode.protect:
        check_protect(engine.tokenizer)
        lines, spans = zip(*(protect.mask(line, decode.protect_pattern) for line in lines)) if lines else ((), ())
        if prefixes is not None:
            prefixes = [protect.mask_like(p, s, decode.protect_pattern) for p, s in zip(prefixes, spans)]
    src_ids, n_truncated = encode_sources(engine, lines)
    prefix_ids = _encode_prefixes(engine, prefixes) if prefixes is not None else None
    results: list[list[Translation]] = [[EMPTY] * decode.nbest for _ in lines]
    todo = [i for i, ids in enumerate(src_ids) if ids]  # lines without tokens give "" (or their prefix)
    for i in set(range(len(lines))) - set(todo):
        if prefixes is not None and prefixes[i]:
            results[i] = [Translation(textio.one_line(protect.restore(prefixes[i], spans[i]).text), 0.0, 0.0)] \
                * decode.nbest
    if on_batch is not None and len(todo) < len(lines):
        on_batch(len(lines) - len(todo))

    def search(batch: list[int]) -> tuple[list[list], list | None]:
        """(n-best hypotheses per sentence, their alignments in the same flat order or None)."""
        rows = [todo[j] for j in batch]
        nbests = engine.search_batch([src_ids[i] for i in rows], decode, keys=[first_line + i for i in rows],
                                     prefixes=[prefix_ids[i] for i in rows] if prefix_ids is not None else None)
        if not decode.alignment:
            return nbests, None
        pairs = [(src_ids[i], h.tokens) for i, hyps in zip(rows, nbests) for h in hyps]
        return nbests, engine.align_batch([x for x, _ in pairs], [y for _, y in pairs])

    for batch, (nbests, alignments) in run_engine(engine, search, [len(src_ids[i]) + 1 for i in todo], decode,
                                                  on_batch):
        flat = [h for hyps in nbests for h in hyps]
        texts = engine.tokenizer.decode_tgt([h.tokens for h in flat])
        alignments = alignments or [None] * len(flat)
        k = 0
        for j, hyps in zip(batch, nbests):
            i, out = todo[j], []
            for h in hyps:
                text, exact = texts[k], None
                if spans[i]:
                    restored = protect.restore(text, spans[i])
                    text, exact = restored.text, restored.exact
                out.append(Translation(textio.one_line(text), float(h.score), float(h.log_prob), h.finished,
                                       alignments[k], exact))
                k += 1
            results[i] = out
    return results, n_truncated


def _encode_prefixes(engine, prefixes: Sequence[str]) -> list[list[int]]:
    """Target ids of each prefix, at most max_positions - 2 (room for one more token)."""
    limit = engine.max_positions - 2
    return [ids[:limit] for ids in engine.tokenizer.encode_tgt(list(prefixes))]


def check_protect(tokenizer) -> None:
    """UserError unless the model knows the placeholder tokens (trained with data.protect: true)."""
    if not all(tokenizer.is_target_symbol(p) for p in protect.PLACEHOLDERS):
        raise UserError("--protect needs a model trained with data.protect: true (its SentencePiece model has no "
                        "placeholder tokens <ph_0> ... <ph_15>)")


def translate_nbest(engine, lines: Sequence[str], decode: DecodeConfig | None = None, *, progress: bool = False,
                    warn: Warn | None = None, prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
    """Per input line `decode.nbest` Translations, best first (greedy when beam_size == 1).

    decode: default the engine's. Empty lines give `decode.nbest` copies of EMPTY. Over-long
    lines are truncated and counted in one warning passed to `warn` (default: stderr).
    `progress` shows a tqdm bar (sentences) on stderr. prefixes: see translate_chunk.
    """
    from tqdm import tqdm

    decode = decode or engine.decode
    with tqdm(total=len(lines), disable=not progress, unit="sent", file=sys.stderr, dynamic_ncols=True) as bar:
        results, n_truncated = translate_chunk(engine, lines, decode, bar.update, prefixes=prefixes)
    if n_truncated:
        (warn or _stderr_warn)(truncation_warning(n_truncated, engine.max_positions))
    return results


def translate_lines(engine, lines: Sequence[str], decode: DecodeConfig | None = None, **kwargs) -> list[str]:
    """One translation per input line, in order (the best hypothesis; see translate_nbest)."""
    decode = decode_config(decode or engine.decode, {"nbest": 1})
    return [nbest[0].text for nbest in translate_nbest(engine, lines, decode, **kwargs)]


def format_nbest(index: int, hyps: Sequence[Translation], alignment: bool = False) -> list[str]:
    """n-best lines `INDEX ||| TEXT ||| SCORE` (`||| ALIGNMENT` added with alignment) for input line
    `index` (0-based)."""
    return [f"{index} ||| {h.text} ||| {h.score:.4f}" + (f" ||| {h.format_alignment()}" if alignment else "")
            for h in hyps]


def format_results(results: Sequence[list[Translation]], decode: DecodeConfig, first_line: int) -> str:
    """The output lines of `nmt translate` for consecutive input lines, newline-terminated."""
    if decode.nbest > 1:
        return "".join(line + "\n" for k, r in enumerate(results)
                       for line in format_nbest(first_line + k, r, decode.alignment))
    if decode.alignment:
        return "".join(f"{r[0].text} ||| {r[0].format_alignment()}\n" for r in results)
    return "".join(r[0].text + "\n" for r in results)


def protect_report(n_lines: int, n_exact: int) -> str:
    return (f"protect: {n_exact} of {n_lines} line{'s' if n_lines != 1 else ''} with protected spans had every span "
            f"restored exactly once ({n_lines - n_exact} dropped or duplicated a span)")


# --------------------------------------------------------------------------- command

def load_engine(path: str, kind: str = "auto", device: str = "auto", *, workers: int | None = None) -> Engine:
    """An engine for `path`: a checkpoint file (torch) or a directory written by `nmt export`
    (ctranslate2). kind "auto" picks by what `path` is. `workers` (CTranslate2: replicas,
    fixed when the model is loaded; None = the export's decode.workers)."""
    if kind == "auto":
        kind = "ctranslate2" if os.path.isdir(path) and os.path.isfile(os.path.join(path, "model.bin")) else "torch"
    if kind == "ctranslate2":
        from nmt.ct2 import Ct2Engine  # the optional package is needed only here

        return Ct2Engine(path, device, workers=workers)
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a checkpoint file (a CTranslate2 export needs --engine ctranslate2)")
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    from nmt.engine import TorchEngine

    return TorchEngine.load(path, device)


def load_for_command(path: str, kind: str, device: str, overrides: dict[str, Any]):
    """(engine, decode settings) for a command: the overrides are checked before the model loads."""
    given = decode_config(None, overrides, check_rules=False)  # a bad flag fails before any work
    engine = load_engine(path, kind, device, workers=given.workers if overrides.get("workers") is not None else None)
    decode = decode_config(engine.decode, overrides)
    if decode.alignment and engine.name != "torch":
        raise UserError(f"--alignment is not supported by the {engine.name} engine (translate with the checkpoint "
                        "and --engine torch)")
    return engine, decode


def translate_command(path: str, input: str | None, output: str | None, *, engine: str = "auto",
                      device: str = "auto", overrides: dict[str, Any] | None = None, prefix: str | None = None,
                      quiet: bool = False, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
                      stderr: IO[str] | None = None, chunk_lines: int = CHUNK_LINES) -> int:
    """`nmt translate`: input file or stdin -> output file or stdout, with the checkpoint (or
    CTranslate2 export) at `path`. `overrides` {decode key: value} replace the model's `decode`
    settings; `prefix`: a file with one target prefix per input line. A progress bar (stderr) is
    shown when reading a file, unless quiet; quiet also silences the truncation warning and the
    protect report. Returns 0."""
    stderr = stderr if stderr is not None else sys.stderr
    overrides = overrides or {}
    inputs = {"--input": input, "--checkpoint": path, **({"--prefix": prefix} if prefix is not None else {})}
    textio.check_paths(inputs, {"--output": output}, stdin=stdin, stdout=stdout, input_dirs=("--checkpoint",))
    from_file = not textio.is_stdin(input)
    if prefix is not None and textio.is_stdin(prefix):
        raise UserError("--prefix must be a file (standard input is the text to translate)")
    n_prefixes = textio.count_lines(prefix) if prefix is not None else None
    if n_prefixes is not None and from_file and n_prefixes != textio.count_lines(input):
        raise UserError(f"line counts differ: {textio.count_lines(input)} lines in {input} but {n_prefixes} "
                        f"prefixes in {prefix}")
    eng, decode = load_for_command(path, engine, device, overrides)
    if decode.protect:
        check_protect(eng.tokenizer)
    from tqdm import tqdm

    total = textio.count_lines(input) if from_file and not quiet else None
    lines = textio.iter_lines(input, stdin)
    prefix_chunks = textio.iter_lines(prefix) if prefix is not None else None
    if not from_file and getattr(stdin if stdin is not None else sys.stdin, "isatty", lambda: False)():
        chunk_lines = 1  # interactive: answer each line as it is typed
    n_truncated, index, protected, exact = 0, 0, 0, 0
    with textio.open_output(output, stdout) as out, \
            tqdm(total=total, disable=quiet or not from_file, unit="sent", file=stderr, dynamic_ncols=True) as bar:
        for chunk in textio.iter_chunks(lines, chunk_lines):
            prefixes = None
            if prefix_chunks is not None:
                prefixes = [line for _, line in zip(chunk, prefix_chunks)]
                if len(prefixes) < len(chunk):
                    raise UserError(f"{prefix} has fewer lines ({index + len(prefixes)}) than the input")
            results, n = translate_chunk(eng, chunk, decode, bar.update, first_line=index, prefixes=prefixes)
            n_truncated += n
            protected += sum(r[0].protected is not None for r in results)
            exact += sum(bool(r[0].protected) for r in results)
            out.write(format_results(results, decode, index).encode("utf-8"))
            out.flush()
            index += len(chunk)
        if prefix_chunks is not None and next(prefix_chunks, None) is not None:
            raise UserError(f"{prefix} has more lines than the input ({index})")
    if n_truncated and not quiet:
        print(truncation_warning(n_truncated, eng.max_positions), file=stderr, flush=True)
    if decode.protect and not quiet:
        print(protect_report(protected, exact), file=stderr, flush=True)
    return 0

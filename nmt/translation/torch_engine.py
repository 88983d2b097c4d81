"""TorchEngine: a Transformer (any device) searched by nmt/search/__init__.py, behind nmt/translation/engine.py's protocol."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from nmt.text import protect
from nmt.model.checkpoint import load_for_inference, unwrap
from nmt.config import DecodeConfig
from nmt.device import avoid_cudnn_attention, resolve_torch_device
from nmt.errors import Cancelled, UserError
from nmt.layout import source_tensors, target_tensors
from nmt.search import NO_INPUTS, PLAIN_OPS, Cancel, Final, Hypothesis, SearchInputs, SearchOps, SearchOptions, search
from nmt.search.joining import StepPool
from nmt.search.options import FEATURES


MAX_CPU_ROWS = 256  # decoder rows (sentences x beams) searched at once on CPU (search_batch)


class TorchEngine:
    """A Transformer searched by nmt/search/__init__.py.

    `TorchEngine.load(checkpoint, device, precision=...)` for the commands (with the CPU fast paths, or
    CUDA graphs on CUDA; int8 weights or autocast); `TorchEngine(model, tokenizer, decode, ops,
    autocast=dtype)` wraps a live model (validation). Calls run inside `running()` (eval mode).
    `precision` is fixed when it loads. autocast (torch.bfloat16 / torch.float16, or None) is
    thread-local, so every call enters it in its own thread."""

    name = "torch"
    workers = None
    supports = frozenset(FEATURES)  # every search feature is nmt.search's own

    def __init__(self, model, tokenizer, decode: DecodeConfig, ops: SearchOps | None = None, *,
                 autocast: torch.dtype | None = None):
        self.model = unwrap(model)  # DDP / torch.compile wrappers: search runs the plain model
        self.tokenizer, self.decode = tokenizer, decode
        self.max_positions = self.model.max_positions
        self.torch_device = next(self.model.parameters()).device
        self.ops = ops if ops is not None else PLAIN_OPS
        self.autocast = autocast
        self.precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, "fp32")
        self.steps = StepPool()  # the joined steps of `joined()`'s searches

    def joined(self) -> "TorchEngine | None":
        """This engine (sharing its model) whose searches join their decoding steps with those of the other
        `joined()` searches running at once in other threads (nmt/search/joining.py); None where its decoder
        cannot join (CUDA graphs). For calls with one decode worker: a run's own workers would join each other."""
        if self.ops.decoder_cls is not None:
            return None
        engine = copy.copy(self)
        engine.ops = dataclasses.replace(self.ops, steps=self.steps)
        return engine

    @classmethod
    def load(cls, checkpoint: str, device: str = "auto", *, fast: bool = True,
             precision: str | None = None) -> "TorchEngine":
        """The checkpoint's model in eval mode on `device`, its tokenizer and decode settings.
        precision: decode.precision (None: the checkpoint's own), checked against the device, then
        applied (int8: weights quantized now). With fast=True, the CPU fast paths are
        installed on CPU, and on CUDA decoding steps are replayed as CUDA graphs (nmt/search/cuda_graphs.py)."""
        from nmt.model import precision as reduced

        torch_device = resolve_torch_device(device)
        if torch_device.type == "cuda":
            avoid_cudnn_attention()  # never restored: see nmt/device.py
        model, tokenizer, cfg = load_for_inference(checkpoint, torch_device)
        precision = reduced.resolve(precision if precision is not None else cfg.decode.precision)
        reduced.check(precision, torch_device)
        autocast = reduced.prepare(model, precision)
        ops = None
        if fast and torch_device.type == "cpu":
            ops = _cpu_fast_paths(model)
        elif fast and torch_device.type == "cuda":
            from nmt.search import cuda_graphs

            ops = SearchOps(decoder_cls=cuda_graphs.GraphedDecoder) if cuda_graphs.enabled() else None
        engine = cls(model, tokenizer, cfg.decode, ops, autocast=autocast)
        engine.precision = precision
        return engine

    def check_precision(self, precision: str) -> None:
        """UserError unless calls with decode.precision `precision` can run on this engine (fixed at load)."""
        from nmt.model.precision import resolve

        if resolve(precision) != self.precision:
            raise UserError(f"--precision {precision}: the model was loaded with precision {self.precision} "
                            f"(precision is chosen when the model loads: pass it to the command or to Translator())")

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The model in eval mode for a run of calls (from any thread); its mode restored afterwards."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    def _precision(self) -> contextlib.AbstractContextManager:
        """The engine's autocast, entered in the calling thread (autocast is thread-local)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.torch_device.type, dtype=self.autocast)

    def _source(self, src_ids: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """src [B,S] (x + EOS, padded) and src_mask [B,S] on the model's device."""
        return source_tensors(src_ids, self.tokenizer.specials, self.torch_device)

    def search_batch(self, src_ids: Sequence[list[int]], options: SearchOptions, inputs: SearchInputs = NO_INPUTS,
                     cancel: Cancel | None = None, on_final: Final | None = None) -> list[list[Hypothesis]]:
        """Per source its n-best hypotheses (`search`). On CPU a batch is searched in consecutive parts of at
        most `MAX_CPU_ROWS` decoder rows (sentences x beams), as efficient and with less memory; each
        sentence's search is independent, so the results are the same. cancel: checked at every step.
        on_final(i, hypotheses): source i's as soon as they are final (`nmt.search.Final`). A joined engine
        whose steps run in parallel (`StepPool.parallel`, `nmt serve` on CPU) searches a batch of more rows than
        a step joins in parts at once, each in its own thread (`_search_apart`), as many as the pool has room
        for steps beside its searches and each of more than half a joined step's rows (so that the parts do not
        join each other): a long call alone uses the threads, under load the other calls do."""
        step = len(src_ids) if self.torch_device.type != "cpu" else max(1, MAX_CPU_ROWS // options.rows_per_sentence)
        pool = self.ops.steps
        free = 0 if pool is None or self.torch_device.type != "cpu" else pool.parallel - pool.members
        if free > 1:  # parts of more than join_rows / 2 rows each: two of them never join one step
            sentences = -(-(pool.join_rows // 2 + 1) // options.rows_per_sentence)  # a part's least, rounded up
            most = len(src_ids) // sentences
            if most > 1:
                parts = max(-(-len(src_ids) // step), min(free, most))
                return self._search_apart(src_ids, options, inputs, cancel, on_final, parts, min(free, parts))
        if len(src_ids) <= step:
            return self.search(src_ids, options, inputs, cancel, on_final)
        out: list[list[Hypothesis]] = []
        for i in range(0, len(src_ids), step):
            part = slice(i, i + step)
            final = None if on_final is None else (lambda b, hyps, i=i: on_final(i + b, hyps))
            out += self.search(src_ids[part], options, inputs.take(part), cancel, final)
        return out

    def _search_apart(self, src_ids: Sequence[list[int]], options: SearchOptions, inputs: SearchInputs,
                      cancel: Cancel | None, on_final: Final | None, parts: int,
                      threads: int) -> list[list[Hypothesis]]:
        """`search_batch` in `parts` searches, `threads` at a time, each in a thread of its own and so a member
        of the step pool of its own: part j holds sentences j, j + parts, ... (a batch comes sorted by length:
        the parts take about as many steps). When one part fails, the others stop at their next step and its
        error is raised."""
        failed = threading.Event()

        def stop() -> bool:
            return failed.is_set() or (cancel is not None and cancel())

        def part(j: int) -> list[list[Hypothesis]]:
            final = None if on_final is None else (lambda b, hyps: on_final(j + b * parts, hyps))
            if failed.is_set():  # (a part still queued when another failed: not even encoded)
                raise Cancelled()
            try:
                return self.search(src_ids[j::parts], options, inputs.take(slice(j, None, parts)), stop, final)
            except BaseException:
                failed.set()
                raise

        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="nmt-search") as executor:
            futures = [executor.submit(part, j) for j in range(parts)]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:  # the first that is not another part's stop
            raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
        out: list[list[Hypothesis]] = [[] for _ in src_ids]
        for j, future in enumerate(futures):
            out[j::parts] = future.result()
        return out

    def search(self, src_ids: Sequence[list[int]], options: SearchOptions, inputs: SearchInputs = NO_INPUTS,
               cancel: Cancel | None = None, on_final: Final | None = None) -> list[list[Hypothesis]]:
        """nmt.search.search over these sources (subword ids without EOS) as one batch, with the engine's
        fast paths and its precision's autocast entered in the calling thread (`nmt tune`, benchmarks).
        With `options.placeholder_tokens` (decode.protect) each sentence's placeholders come from its
        source (`inputs.placeholders` is replaced)."""
        src, src_mask = self._source(src_ids)
        if options.placeholder_tokens is not None:  # each of the source's placeholders copied exactly once
            inputs = dataclasses.replace(inputs, placeholders=protect.source_placeholders(src_ids, self.tokenizer))
        with self._precision():
            return search(self.model, src, src_mask, options, inputs, ops=self.ops, cancel=cancel, on_final=on_final)

    def score_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and EOS (fp32 log-softmax over
        the full vocabulary, as the search computes them)."""
        src, src_mask = self._source(src_ids)
        tgt_in, tgt_out = target_tensors(tgt_ids, self.tokenizer.specials, self.torch_device)  # [B,T]
        with torch.inference_mode(), self._precision():
            logits = self.model(src, src_mask, tgt_in)  # [B,T,V]
            logp = F.log_softmax(logits.float(), dim=-1).gather(-1, tgt_out[:, :, None]).squeeze(-1)  # [B,T]
        rows = logp.tolist()
        return [row[: len(y) + 1] for row, y in zip(rows, tgt_ids)]

    def align_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[tuple[int, int]]]:
        """Per pair, for each target token j the source token i (EOS excluded) with the largest
        last-layer cross-attention weight, averaged over heads, when predicting token j."""
        src, src_mask = self._source(src_ids)
        T = max(max(len(y) for y in tgt_ids), 1)
        # [B,T]: at position j the decoder input that predicts target token j
        tgt_in = target_tensors(tgt_ids, self.tokenizer.specials, self.torch_device)[0][:, :T]
        with torch.inference_mode(), self._precision():
            weights = self.model.alignment(src, src_mask, tgt_in)  # [B,T,S]
        out = []
        for b, (x, y) in enumerate(zip(src_ids, tgt_ids)):
            best = weights[b, : len(y), : len(x)].argmax(dim=1).tolist()  # source EOS (index len(x)) excluded
            out.append([(i, j) for j, i in enumerate(best)])
        return out


def _cpu_fast_paths(model) -> SearchOps | None:
    """Pack the model's larger linear layers and return the search's fast ops (nmt/model/fast.py,
    nmt/search/fast.py); None (the plain ops) with NMT_CPU_TUNING=0."""
    from nmt.device import cpu_tuning
    from nmt.model.fast import pack_linear_weights
    from nmt.search.fast import FAST_OPS

    if not cpu_tuning():
        return None
    pack_linear_weights(model)
    return FAST_OPS

"""Inference engines: the small interface between the text pipeline and a model.

nmt/translate.py owns the one text pipeline (read, encode, truncate, batch, run
workers, detokenize, restore order, write) for `nmt translate`, `nmt evaluate`,
`nmt score` and validation during training. It talks to a model only through this
protocol, which two engines implement: `TorchEngine` (below: a Transformer and
nmt/search.py) and `Ct2Engine` (nmt/ct2.py: a model exported with `nmt export`).

    class Engine(Protocol):
        name: str                       "torch" or "ctranslate2"
        tokenizer: Tokenizer
        decode: DecodeConfig            the model's default search settings (its config's `decode`)
        max_positions: int              longest sequence the model accepts
        torch_device: torch.device | None   a PyTorch model's device (None: the engine runs its own threads)
        workers: int | None             batches the engine searches at once (None: decided per call, `resolve_workers`)
        def running() -> ContextManager  around a run of calls: the model in eval mode
        def search_batch(src_ids, decode, keys=None, prefixes=None) -> list[list[Hypothesis]]
        def score_batch(src_ids, tgt_ids) -> list[list[float]]
        def align_batch(src_ids, tgt_ids) -> list[list[tuple[int, int]]]   (UserError where unsupported)

`src_ids` are subword ids without EOS (at most max_positions - 1 each, at least one);
the engine appends EOS. `search_batch` returns per source up to `decode.nbest`
hypotheses, best first (nmt.search.Hypothesis: tokens without BOS/EOS, score,
log_prob, finished); `keys` (one integer per source, the input line number) fix the
samples with `decode.sampling`; `prefixes` (target ids per source) are forced.
`score_batch` returns per pair the log-probability of each target token and of the
final EOS under the model (teacher forcing). `align_batch` gives per pair the
(source index, target index) alignment of each target token (nmt.model.Transformer.alignment).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator, Protocol, Sequence

from nmt.config import DecodeConfig
from nmt.errors import UserError


class Engine(Protocol):
    name: str
    tokenizer: object
    decode: DecodeConfig
    max_positions: int
    torch_device: object
    workers: int | None

    def running(self) -> ContextManager: ...

    def search_batch(self, src_ids: Sequence[list[int]], decode: DecodeConfig, keys: Sequence[int] | None = None,
                     prefixes: Sequence[list[int]] | None = None) -> list[list]: ...

    def score_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[float]]: ...

    def align_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[tuple[int, int]]]: ...


def parse_device(name: str | None) -> tuple[str, int | None]:
    """"auto"/None -> ("auto", None); "cpu" -> ("cpu", None); "cuda" -> ("cuda", None); "cuda:N" -> ("cuda", N).
    Anything else is a one-line UserError (both engines parse devices with this)."""
    if name is None or name == "auto":
        return "auto", None
    kind, sep, index = str(name).partition(":")
    if kind not in ("cpu", "cuda") or (sep and not index.isdigit()) or (kind == "cpu" and sep):
        raise UserError(f"invalid device {name!r} (use auto, cpu, cuda or cuda:N)")
    return kind, int(index) if sep else None


def resolve_torch_device(name):
    """"auto"/None -> CUDA if available, else CPU; otherwise that device (UserError if unavailable)."""
    import torch

    if isinstance(name, torch.device):
        return name
    kind, index = parse_device(name)
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but CUDA is not available")
    return torch.device(kind, index) if index is not None else torch.device(kind)


def resolve_workers(workers: int, device, threads: int | None = None) -> int:
    """decode.workers with 0 (auto) resolved: 2 on a CPU with at least 2 threads (default: torch's
    intra-op threads), else 1 (measurements: BENCHMARKS.md, "Decoding workers")."""
    if workers:
        return workers
    kind = device.type if hasattr(device, "type") else parse_device(str(device))[0]
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return 2 if kind == "cpu" and threads >= 2 else 1


class TorchEngine:
    """A Transformer (any device) searched by nmt/search.py.

    `TorchEngine.load(checkpoint, device)` for the commands (on CPU with nmt/fast.py's
    fast paths installed); `TorchEngine(model, tokenizer, decode)` wraps a live model
    (validation during training). Calls run inside `running()` (eval mode).
    """

    name = "torch"
    workers = None

    def __init__(self, model, tokenizer, decode: DecodeConfig, ops=None):
        from nmt.checkpoint import unwrap
        from nmt.search import PLAIN_OPS

        self.model = unwrap(model)  # DDP / torch.compile wrappers: search runs the plain model
        self.tokenizer, self.decode = tokenizer, decode
        self.max_positions = self.model.max_positions
        self.torch_device = next(self.model.parameters()).device
        self.ops = ops if ops is not None else PLAIN_OPS

    @classmethod
    def load(cls, checkpoint: str, device: str = "auto", *, fast: bool = True) -> "TorchEngine":
        """The checkpoint's model in eval mode on `device`, its tokenizer and decode settings.
        On CPU (and with fast=True) nmt/fast.py's inference fast paths are installed."""
        from nmt.checkpoint import load_for_inference

        model, tokenizer, cfg = load_for_inference(checkpoint, resolve_torch_device(device))
        ops = None
        if fast and next(model.parameters()).device.type == "cpu":
            from nmt import fast as fast_paths

            ops = fast_paths.install_for_inference(model)
        return cls(model, tokenizer, cfg.decode, ops)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The model in eval mode for a run of calls (from any thread); its mode restored afterwards."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    def _source(self, src_ids: Sequence[list[int]]):
        """src [B,S] (x + EOS, padded) and src_mask [B,S] on the model's device."""
        from nmt.layout import source_tensors

        return source_tensors(src_ids, self.tokenizer.specials, self.torch_device)

    def search_batch(self, src_ids: Sequence[list[int]], decode: DecodeConfig, keys: Sequence[int] | None = None,
                     prefixes: Sequence[list[int]] | None = None) -> list[list]:
        from nmt.sampling import sample_search
        from nmt.search import beam_search, greedy_search

        src, src_mask = self._source(src_ids)
        kw = dict(max_len_a=decode.max_len_a, max_len_b=decode.max_len_b, min_len=decode.min_len,
                  no_repeat_ngram=decode.no_repeat_ngram, prefixes=prefixes, ops=self.ops,
                  specials=self.tokenizer.specials)
        if decode.sampling != "none":
            return sample_search(self.model, src, src_mask, samples=decode.nbest, sampling=decode.sampling,
                                 topk=decode.topk, topp=decode.topp, temperature=decode.temperature, seed=decode.seed,
                                 keys=keys, **kw)
        if decode.beam_size == 1:
            return [[h] for h in greedy_search(self.model, src, src_mask, **kw)]
        return beam_search(self.model, src, src_mask, beam_size=decode.beam_size, nbest=decode.nbest,
                           length_penalty=decode.length_penalty, length_penalty_type=decode.length_penalty_type, **kw)

    def score_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and EOS (fp32 log-softmax over
        the full vocabulary, as the search computes them)."""
        import torch
        import torch.nn.functional as F

        from nmt.layout import target_tensors

        src, src_mask = self._source(src_ids)
        tgt_in, tgt_out = target_tensors(tgt_ids, self.tokenizer.specials, self.torch_device)  # [B,T]
        with torch.inference_mode():
            logits = self.model(src, src_mask, tgt_in)  # [B,T,V]
            logp = F.log_softmax(logits.float(), dim=-1).gather(-1, tgt_out[:, :, None]).squeeze(-1)  # [B,T]
        rows = logp.tolist()
        return [row[: len(y) + 1] for row, y in zip(rows, tgt_ids)]

    def align_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[tuple[int, int]]]:
        """Per pair, for each target token j the source token i (EOS excluded) with the largest
        last-layer cross-attention weight, averaged over heads, when predicting token j."""
        import torch

        from nmt.layout import target_tensors

        src, src_mask = self._source(src_ids)
        T = max(max(len(y) for y in tgt_ids), 1)
        # [B,T]: at position j the decoder input that predicts target token j
        tgt_in = target_tensors(tgt_ids, self.tokenizer.specials, self.torch_device)[0][:, :T]
        with torch.inference_mode():
            weights = self.model.alignment(src, src_mask, tgt_in)  # [B,T,S]
        out = []
        for b, (x, y) in enumerate(zip(src_ids, tgt_ids)):
            best = weights[b, : len(y), : len(x)].argmax(dim=1).tolist()  # source EOS (index len(x)) excluded
            out.append([(i, j) for j, i in enumerate(best)])
        return out

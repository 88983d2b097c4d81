"""Sampling: `nbest` independent outputs per sentence (`SearchOptions.sampling`), drawn token by token.

Each step draws from the model's distribution divided by `temperature`, cut to its `topk` most
probable tokens or to the smallest set reaching probability `topp` (nucleus), after the step rules.
The draw is the Gumbel-max trick with noise hashed from (seed, sentence key, sample number, step,
token), so a sentence's samples depend only on the seed and its key (the input line number).
`log_prob` is the model's own (temperature 1, before any cut), as in nmt/search/__init__.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.search.decoding import token_by_token
from nmt.search.rules import StepRules
from nmt.search.options import (NEG_INF, NO_INPUTS, PLAIN_OPS, Cancel, Final, Hypothesis, SearchInputs, SearchOps,
                                SearchOptions)


@torch.inference_mode()
def sample_search(model, src: Tensor, src_mask: Tensor, options: SearchOptions, inputs: SearchInputs = NO_INPUTS,
                  *, ops: SearchOps = PLAIN_OPS, cancel: Cancel | None = None,
                  on_final: Final | None = None) -> list[list[Hypothesis]]:
    """`options.nbest` independent samples per sentence (module docstring; `options.sampling`, topk, topp,
    temperature, seed), best log_prob first (score == log_prob). inputs.keys [B]: one integer per
    sentence (default 0..B-1); with the seed they fix its samples. cancel: see nmt.search.options.Cancel;
    on_final: see nmt.search.options.Final."""
    B, samples = src.shape[0], options.nbest
    rules = StepRules(options, inputs, B, src.device)
    keys = list(range(B)) if inputs.keys is None else list(inputs.keys)
    row_keys = torch.tensor([_row_key(options.seed, key, k) for key in keys for k in range(samples)],
                            dtype=torch.long, device=src.device)  # [B*samples]
    choose = _sampler(options, row_keys)
    best_first = lambda hyps: sorted(hyps, key=lambda h: -h.score)  # noqa: E731
    final = None if on_final is None else (lambda b, hyps: on_final(b, best_first(hyps)))
    out = token_by_token(model, src, src_mask, options, inputs, rules, choose, samples, ops, cancel, final)
    return [best_first(hyps) for hyps in out]


def _sampler(options: SearchOptions, row_keys: Tensor):
    """choose(logp [R,V], t, rows [R]) -> tokens [R]: a Gumbel-max draw from logp / temperature cut to
    the top-k or the nucleus; rows index `row_keys` (their noise)."""
    sampling, topk, topp, temperature = options.sampling, options.topk, options.topp, options.temperature

    def choose(logp: Tensor, t: int, rows: Tensor) -> Tensor:
        x = logp / temperature
        if sampling == "topk" and topk < x.shape[1]:
            kth = x.topk(topk, dim=1).values[:, -1:]  # [R,1]
            x = x.masked_fill(x < kth, NEG_INF)
        elif sampling == "topp":
            probs, order = F.softmax(x, dim=1).sort(dim=1, descending=True)
            drop = (probs.cumsum(dim=1) - probs) >= topp  # tokens after the nucleus is full
            x = x.masked_fill(torch.zeros_like(drop).scatter_(1, order, drop), NEG_INF)
        gumbel = -torch.log(-torch.log(uniform_noise(row_keys.index_select(0, rows), t, x.shape[1])))
        return (x + gumbel.float()).argmax(dim=1)

    return choose


# --------------------------------------------------------------------------- sampling noise

_M1, _M2, _M3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's constants


def _i64(x: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2^64)."""
    x = (x ^ _shr(x, 30)) * _i64(_M2)
    x = (x ^ _shr(x, 27)) * _i64(_M3)
    return x ^ _shr(x, 31)


def _row_key(seed: int, key: int, sample: int) -> int:
    """A 64-bit key per (seed, sentence key, sample number), mixed so that neighbours differ everywhere."""
    x = torch.tensor([_i64(seed * _M1 + key)], dtype=torch.long)
    x = _mix(_mix(x) + _i64((sample + 1) * _M1))
    return int(x)


def uniform_noise(row_keys: Tensor, t: int, V: int) -> Tensor:
    """[R, V] float64 in (0, 1): a hash of (row key, step t, token), uniform to 2^-53."""
    counter = (t * V + torch.arange(V, device=row_keys.device)) * _i64(_M1)  # [V]
    x = _mix(row_keys[:, None] + counter[None, :])  # [R, V]
    return (_shr(x, 11).double() + 0.5) * 2.0 ** -53

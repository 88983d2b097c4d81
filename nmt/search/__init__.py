"""Greedy, beam and sampling search over the model's step protocol: `search(model, src, src_mask,
options, inputs)`, the one entry point for a batch.

`SearchOptions` is built once from the decode settings (`SearchOptions.from_decode`); a batch's
per-sentence data (prefixes, placeholders, terms, sampling keys) is a `SearchInputs`
(nmt/search/options.py). The step rules: nmt/search/rules.py; greedy: nmt/search/decoding.py;
beam: nmt/search/beam.py; sampling (greedy's loop): nmt/search/sampling.py.

The search sees only `model.encode`, `model.init_cache`, `model.decode_step`, `cache.reorder`,
`model.max_positions` (and `model.decode` uncached). Beam rows are sentence-major
(`row = sentence * K + beam`); a finished sentence leaves the batch. Special ids come from
`specials` (nmt/layout.py): decoding starts from `specials.start`, a hypothesis ends with EOS.

Conventions (applied at every step by nmt/search/rules.py's `StepRules`):
- Step t (1-based) generates token t. PAD and the start token are never generated; EOS is
  forbidden while t <= min_len.
- A target prefix is forced token by token, then the search continues; the first `free_prefix`
  tokens (an imported M2M100/NLLB model's language token) count 0 in the log-probability.
- no_repeat_ngram N: a token that would complete an N-gram already in the hypothesis is forbidden.
- Placeholders and glossary terms: each of its source's exactly once, EOS only after all of them,
  the missing ones forced before the length limit when it has room.
- A row left with no allowed token may end; after a forced prefix only the best candidate may end
  at the first free step (beam search).
- Maximum output length: `min(floor(a * src_len + b), model.max_positions - 1)` tokens (at least
  1, at least len(prefix) + 1), src_len counting the real source tokens with EOS.
- A hypothesis ends with EOS (`tokens` excludes it, `log_prob` includes it) or at the maximum
  length (truncated); its length for the penalty counts the generated tokens with EOS.
- `log_prob` sums fp32 `log_softmax` values (no temperature); where rules removed tokens the
  values are renormalised over the allowed ones (CTranslate2's semantics), else it equals
  `nmt score`. `score = log_prob / lp(length)`; greedy and sampling: `score == log_prob`.
"""

from __future__ import annotations

from torch import Tensor

from nmt.search.beam import beam_search
from nmt.search.decoding import greedy_search
from nmt.search.sampling import sample_search
from nmt.search.options import (NO_INPUTS, PLAIN_OPS, Cancel, Final, Hypothesis, SearchInputs, SearchOps,
                                SearchOptions, length_penalty_factor, max_output_lengths)

__all__ = ["Cancel", "Final", "Hypothesis", "NO_INPUTS", "PLAIN_OPS", "SearchInputs", "SearchOps", "SearchOptions",
           "beam_search", "greedy_search", "length_penalty_factor", "max_output_lengths", "sample_search", "search"]


def search(model, src: Tensor, src_mask: Tensor, options: SearchOptions, inputs: SearchInputs = NO_INPUTS, *,
           ops: SearchOps = PLAIN_OPS, cancel: Cancel | None = None,
           on_final: Final | None = None) -> list[list[Hypothesis]]:
    """Search a batch: src [B,S] (source ids + EOS, padded), src_mask [B,S] (True = token) -> per sentence
    its hypotheses, best first (with terms, those that ended with EOS first): sampling (nbest samples),
    greedy (beam_size 1) or beam search (up to nbest; all finished ones with keep_all). inputs: the batch's
    per-sentence data. ops: the tensor operations. cancel(): checked before every step; True raises
    nmt.errors.Cancelled. on_final(b, hypotheses): each sentence's hypotheses as soon as they are final
    (`Final`). With `ops.steps` (a StepPool), its steps join those of the searches running at once in other
    threads (nmt/search/joining.py)."""
    if options.sampling != "none":
        strategy = sample_search
    else:
        strategy = greedy_search if options.beam_size == 1 else beam_search
    if ops.steps is None:
        return strategy(model, src, src_mask, options, inputs, ops=ops, cancel=cancel, on_final=on_final)
    with ops.steps.member():
        return strategy(model, src, src_mask, options, inputs, ops=ops, cancel=cancel, on_final=on_final)

"""Greedy, beam and sampling search over the model's step protocol: `search(model, src, src_mask,
options, inputs)`, the one entry point for a batch.

The settings are a `SearchOptions` built once (from the decode settings: `SearchOptions.from_decode`)
and passed down as it is; the batch's per-sentence data (prefixes, placeholders, sampling keys) is a
`SearchInputs` (nmt/search/options.py). The modules: nmt/search/options.py (options, inputs, results,
the length formulas), nmt/search/rules.py (`StepRules`, built from both once per batch), nmt/search/decoding.py (the
step protocol and greedy search's token-by-token loop), nmt/search/beam.py, nmt/search/sampling.py.

The search sees only `model.encode`, `model.init_cache`, `model.decode_step`,
`cache.reorder`, `model.max_positions` and, for the uncached path,
`model.decode`. Sentences are decoded together: beam rows are laid out
sentence-major (`row = sentence * K + beam`, B*K rows), and a sentence leaves
the batch as soon as it is finished, so the work shrinks as decoding goes on.

Shapes: B sentences, S source length, K beam, V target vocabulary,
N active sentences, t the current step (1-based).

Special ids come from `specials` (nmt/layout.py; the tokenizer's): the decoder starts from
`specials.start` (BOS for nmt's own models) and a hypothesis ends with `specials.eos`.

Conventions (shared by all searches; nmt/search/rules.py's `StepRules` applies them at every step):
- Step t generates token t. PAD and the start token are never generated (log-prob -inf;
  `Specials.never_generated`); EOS is forbidden while t <= min_len, so an output has
  >= min_len tokens.
- A target prefix (per sentence, optional) is forced: at steps t <= len(prefix) only
  prefix[t-1] may be generated (its log-probability counts, except for the first `free_prefix`
  tokens, which count 0: the language token of an imported M2M100/NLLB model, as transformers'
  `forced_bos_token_id`), then the search continues.
- no_repeat_ngram N > 0: a token that would complete an N-gram already present in the
  hypothesis (prefix included) is forbidden, so no N-gram occurs twice.
- Placeholders (with --protect: `SearchOptions.placeholder_tokens`, `SearchInputs.placeholders`): a
  placeholder token that is not in the sentence's source, or is already in the hypothesis, is
  forbidden; EOS is forbidden while
  one of the source's is missing; and once no more steps are left before the length limit than
  placeholders are missing, only a missing one may be generated. So every output has each of its
  source's placeholders exactly once (one cut at the length limit too, when the limit has room
  for them all).
- A row left with no allowed token may end (EOS allowed).
- After a forced prefix, the first free step lets only the best candidate end (beam search).
- Maximum output length per sentence: `min(floor(a * src_len + b), model.max_positions - 1)`
  tokens (at least 1; at least len(prefix) + 1 with a prefix), src_len = `src_mask.sum(1)`
  (real source tokens, EOS included).
- A hypothesis ends when it generates EOS (`tokens` excludes it, `log_prob`
  includes it) or when it reaches the maximum length without EOS (truncated:
  no EOS, nothing added). Either way its **length for the penalty is the
  number of generated tokens including EOS**, i.e. the step t at which it ended.
- `log_prob` is the sum of fp32 `log_softmax` values, not changed by a temperature. The
  rules that depend on the hypothesis (min_len, n-gram blocking, placeholders) remove tokens
  before the softmax, so at a step where they removed some, the values are the model's
  renormalised over the allowed tokens (CTranslate2's semantics); PAD and the start token are
  removed after it, and forced prefix tokens keep the model's plain log-probability (0 for the
  first `free_prefix`). Without
  such a step, `log_prob` is what `nmt score` gives. `score = log_prob / lp(length)`. Greedy
  search and sampling apply no length penalty: their `score == log_prob`.
Sampling (`sample_search`, nmt/search/sampling.py) uses greedy search's token-by-token loop.
"""

from __future__ import annotations

from torch import Tensor

from nmt.search.beam import beam_search
from nmt.search.decoding import greedy_search
from nmt.search.sampling import sample_search
from nmt.search.options import (NO_INPUTS, PLAIN_OPS, Cancel, Hypothesis, SearchInputs, SearchOps, SearchOptions,
                                length_penalty_factor, max_output_lengths)

__all__ = ["Cancel", "Hypothesis", "NO_INPUTS", "PLAIN_OPS", "SearchInputs", "SearchOps", "SearchOptions",
           "beam_search", "greedy_search", "length_penalty_factor", "max_output_lengths", "sample_search", "search"]


def search(model, src: Tensor, src_mask: Tensor, options: SearchOptions, inputs: SearchInputs = NO_INPUTS, *,
           ops: SearchOps = PLAIN_OPS, cancel: Cancel | None = None) -> list[list[Hypothesis]]:
    """Search a batch: src [B,S] (source ids + EOS, padded), src_mask [B,S] (True = token) -> per
    sentence its hypotheses, best first (with terms: those that ended with EOS first, nmt/search/beam.py):
    sampling (`options.sampling`: nbest samples), greedy search (beam_size 1: one) or beam search (up
    to nbest; all finished ones with keep_all). inputs: the batch's prefixes, placeholders, sampling
    keys, terms and source lengths. ops: the tensor operations (nmt/search/fast.py's on
    CPU). cancel(): checked before every step; True raises nmt.errors.Cancelled."""
    if options.sampling != "none":
        strategy = sample_search
    else:
        strategy = greedy_search if options.beam_size == 1 else beam_search
    return strategy(model, src, src_mask, options, inputs, ops=ops, cancel=cancel)

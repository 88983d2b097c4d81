"""Target languages of a multilingual model: the language token forced as the first target token.

A model that translates into several languages has one token per target language in its target
vocabulary (`Tokenizer.languages`: {code: token id}), the convention of M2M100 and NLLB: the
decoder starts from its start token, the language token is forced as the first output token,
and the translation follows. nmt uses the one mechanism for imported M2M100/NLLB models and for
multilingual models it trains, so `--tgt-lang` (`decode.tgt_lang`) means the same for both.

- Training targets are `[language token] + y` (the model learns to predict it, so its
  log-probability becomes ~0); translation forces it as a one-token prefix (before any
  `--prefix`); outputs never show it (`Tokenizer.decode_tgt` drops it); `nmt score` scores
  `[language token] + y + EOS`, as Hugging Face does with labels `[lang, y, </s>]`.
- A bilingual model has no language tokens: `tgt_lang` must be unset there.
- Imported M2M100/NLLB models (nmt/hf_tokenizer.py, `free_language_token`) score the forced token as
  transformers' generate() does (`forced_bos_token_id`): its log-probability counts 0 in the search's
  log_prob and score (`free_prefix`); `nmt score` still counts it (Hugging Face's labels do).
"""

from __future__ import annotations

from nmt.errors import UserError


def target_prefix(tokenizer, tgt_lang: str | None) -> list[int]:
    """The forced first target token(s) for `tgt_lang`: [] for a bilingual model; [id] for a
    multilingual one (tgt_lang, else the model's default). One-line UserError when the language
    is missing, unknown, or given to a bilingual model."""
    languages = getattr(tokenizer, "languages", None) or {}
    if not languages:
        if tgt_lang is None:
            return []
        raise UserError(f"--tgt-lang {tgt_lang}: this model translates into one language only (it has no "
                        "target-language tokens); leave --tgt-lang out")
    code = tgt_lang if tgt_lang is not None else tokenizer.default_tgt_lang
    known = ", ".join(sorted(languages))
    if code is None:
        raise UserError(f"this model translates into {len(languages)} languages: choose one with --tgt-lang ({known})")
    if code not in languages:
        raise UserError(f"unknown target language {code!r} for this model (it knows: {known})")
    return [languages[code]]


def free_prefix(tokenizer, prefixes) -> int:
    """How many leading forced tokens count log-probability 0 in a search: 1 (the language token,
    which the text pipeline puts first in every prefix) for a tokenizer that says so
    (`free_language_token`: imported M2M100/NLLB), else 0."""
    free = getattr(tokenizer, "free_language_token", False) and getattr(tokenizer, "languages", None)
    return 1 if free and prefixes is not None else 0

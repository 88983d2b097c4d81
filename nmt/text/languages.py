"""Target languages of a multilingual model: the language token forced as the first target token.

A model that translates into several languages has one token per target language in its target
vocabulary (`Tokenizer.languages`: {code: token id}), as M2M100 and NLLB: the decoder starts from its
start token, the language token is forced first, and the translation follows. Imported and
nmt-trained multilingual models share the mechanism, so `--tgt-lang` (`decode.tgt_lang`) means the same.

- Training targets are `[language token] + y`; translation forces it as a one-token prefix (before
  any `--prefix`); outputs never show it; `nmt score` scores `[language token] + y + EOS`, as Hugging
  Face's labels `[lang, y, </s>]`. A bilingual model has none: `tgt_lang` must be unset there.
- Imported M2M100/NLLB models (`free_language_token`) count the forced token 0 in the search's
  log_prob and score, as transformers' `forced_bos_token_id` (`free_prefix`); `nmt score` counts it.

Source languages: only an imported M2M100/NLLB model puts a source-language token first in every
source (`source_languages`): `decode.src_lang` (`--src-lang`) or a training corpus's src_lang picks
it, by default the model's data.src_lang (`check_source_language`).

What a model translates into is read one way: `target_languages(tokenizer, cfg)` for a loaded model,
`stored_target_languages(entry, config)` for a checkpoint or an export; both give a `TargetLanguages`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from nmt.errors import UserError


@dataclass(frozen=True)
class TargetLanguages:
    """What a model translates into (`target_languages`, `stored_target_languages`)."""

    tokens: Mapping[str, int] = field(default_factory=dict)  # {code: id of its token}; {} for a bilingual model
    default: str | None = None  # what it translates into without tgt_lang: a multilingual model's default
    # language (None: it has none), a bilingual model's data.tgt_lang (None when no config was given)
    free: bool = False  # the forced language token counts log-probability 0 in searches (imported M2M100/NLLB)

    @property
    def multilingual(self) -> bool:
        """Whether the model has target-language tokens (one is forced first in every output)."""
        return bool(self.tokens)

    def prefix(self, tgt_lang: str | None) -> list[int]:
        """The forced first target token(s) for `tgt_lang`: [] for a bilingual model; [id] for a
        multilingual one (tgt_lang, else the default). One-line UserError when the language is
        missing, unknown, or given to a bilingual model."""
        if not self.tokens:
            if tgt_lang is None:
                return []
            raise UserError(f"--tgt-lang {tgt_lang}: this model translates into one language only (it has no "
                            "target-language tokens); leave --tgt-lang out")
        code = tgt_lang if tgt_lang is not None else self.default
        known = ", ".join(sorted(self.tokens))
        if code is None:
            raise UserError(f"this model translates into {len(self.tokens)} languages: choose one with --tgt-lang "
                            f"({known})")
        if code not in self.tokens:
            raise UserError(f"unknown target language {code!r} for this model (it knows: {known})")
        return [self.tokens[code]]


def _languages(tokens: Mapping[str, int] | None, default: str | None, bilingual: str | None,
               free: bool = False) -> TargetLanguages:
    """The one rule: a model with language tokens translates into those (default: its default language);
    one without, into its config's data.tgt_lang."""
    tokens = dict(tokens or {})
    return TargetLanguages(tokens, default if tokens else bilingual, free and bool(tokens))


def target_languages(tokenizer, cfg: Any = None) -> TargetLanguages:
    """What the model of `tokenizer` (nmt's or an imported one: `languages`, `default_tgt_lang`,
    `free_language_token`) translates into; `cfg`: its Config, for a bilingual model's data.tgt_lang."""
    return _languages(tokenizer.languages, tokenizer.default_tgt_lang, cfg.data.tgt_lang if cfg is not None else None,
                      tokenizer.free_language_token)


def stored_target_languages(entry: Mapping[str, Any], config: Mapping[str, Any]) -> TargetLanguages:
    """The same from what a file stores: `entry` holds the tokenizer's `languages` and `default_tgt_lang`
    (a checkpoint's `tokenizer` entry, an export's nmt_export.json), `config` the model's config dict.
    `free` (the language token's log-probability counts 0) is not stored: False here; `target_languages`
    of the loaded tokenizer knows it."""
    return _languages(entry.get("languages"), entry.get("default_tgt_lang"), (config.get("data") or {}).get("tgt_lang"))


def target_prefix(tokenizer, tgt_lang: str | None) -> list[int]:
    """`TargetLanguages.prefix` of the model of `tokenizer`: [] for a bilingual model, [the language
    token] for a multilingual one (one-line UserError when the language is missing or unknown)."""
    return target_languages(tokenizer).prefix(tgt_lang)


def contrast_tokens(tokenizer, contrast_lang: str | None, tgt_lang: str | None, weight: float = 0.0) -> tuple[int, ...]:
    """The language tokens of `contrast_lang` (decode.contrast_lang: codes, comma-separated), () when unset
    or empty; the target language is left out, so one list serves every direction. One-line UserError for
    a bilingual model, an unknown code, or a `weight` that reaches 1 summed over the languages used. With
    no target language yet the codes are checked and the weight waits for it."""
    if not (contrast_lang or "").strip():
        return ()
    langs = target_languages(tokenizer)
    if not langs.multilingual:
        raise UserError(f"--contrast-lang {contrast_lang}: this model has no target-language tokens (language-"
                        "contrastive decoding needs a multilingual model); leave --contrast-lang out")
    codes = [c.strip() for c in contrast_lang.split(",")]
    for code in codes:
        if code not in langs.tokens:
            raise UserError(f"unknown contrast language {code!r} for this model (it knows: "
                            f"{', '.join(sorted(langs.tokens))})")
    target = langs.tokens.get(tgt_lang if tgt_lang is not None else langs.default)
    tokens = tuple(dict.fromkeys(langs.tokens[c] for c in codes if langs.tokens[c] != target))
    if target is not None and weight * len(tokens) >= 1:
        raise UserError(f"--contrast-weight {weight:g} with {len(tokens)} contrast languages: the weight times their "
                        "number must stay below 1 (a token all languages write alike, such as punctuation or a name, "
                        f"would be ruled out): at most {1 / len(tokens):.3g}, exclusive")
    return tokens


def check_source_language(tokenizer, src_lang: str | None) -> None:
    """One-line UserError when `src_lang` is not a language of a model whose sources start with a
    language token (`tokenizer.source_languages`: imported M2M100/NLLB). The other models' sources carry
    no language token: any `src_lang` is accepted there and changes nothing."""
    if src_lang is not None and tokenizer.source_languages and src_lang not in tokenizer.languages:
        raise UserError(f"unknown source language {src_lang!r} for this model (it knows: "
                        f"{', '.join(sorted(tokenizer.languages))})")


def free_prefix(tokenizer, prefixes) -> int:
    """How many leading forced tokens count log-probability 0 in a search: 1 (the language token,
    which the text pipeline puts first in every prefix) for a tokenizer that says so
    (`free_language_token`: imported M2M100/NLLB), else 0."""
    return 1 if target_languages(tokenizer).free and prefixes is not None else 0

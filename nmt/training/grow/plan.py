"""Which languages a fine-tuning source knows, and which new ones get a token (`check_languages`).

What the source knows: an imported M2M100/NLLB model its language codes; an nmt model the languages of its
training config (data.src_lang, data.tgt_lang, every corpus's) and its language tokens. One-line UserErrors
naming the key: a corpus language the source does not know must be listed in data.add_languages; a listed
code the source knows, or that no training corpus uses, is an error; an initialising code needs a token.

Tokens follow the model's convention: NLLB the code itself (`ita_Latn`-style codes only), M2M100 and nmt's
multilingual models `__it__` (`pt_BR` stays `__pt_BR__`). An imported M2M100/NLLB model starts every source
and target with a language token, so each new language gets one. nmt's models have target-language tokens
only: a new source language needs none, and a language known as a source only cannot become a target. A
bilingual model has no tokens: it can learn a new source language or a new single target language, not a
second target language.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from nmt.config import Config
from nmt.errors import UserError
from nmt.text.hf_tokenizer import NLLB_CODE
from nmt.text.tokens import TokenizerLike


def known_languages(tokenizer: TokenizerLike, config: Config) -> set[str]:
    """The languages a source model knows (module docstring): its tokenizer and its Config say."""
    known = set(tokenizer.languages)
    if tokenizer.source_languages:  # an imported M2M100/NLLB model: its language codes
        return known
    d = config.data
    known |= {d.src_lang, d.tgt_lang}
    for c in d.train_corpora + d.valid_corpora:
        known |= set(d.langs(c))
    return known - {None}


@dataclass(frozen=True)
class Plan:
    """What `check_languages` found: the new languages that get a token (in order), and per new
    language its initialising language (None: the mean of the language tokens)."""

    tokens: tuple[str, ...]
    init: dict[str, str | None] = field(default_factory=dict)


def check_languages(cfg: Config, tokenizer: TokenizerLike, source: Config) -> Plan:
    """The rules of the module docstring against the source model (its tokenizer and Config); the new tokens."""
    d, path = cfg.data, cfg.train.init_from
    kind = tokenizer.kind
    known = known_languages(tokenizer, source)
    languages = tokenizer.languages  # the model's language tokens
    added = dict(d.add_languages)
    corpora = [(d.train_key(i), c) for i, c in enumerate(d.train_corpora)] + \
        [(d.valid_key(i), c) for i, c in enumerate(d.valid_corpora)]
    for key, c in corpora:
        for side, code in zip(("src_lang", "tgt_lang"), d.langs(c)):
            if code not in known and code not in added:
                where = f"{key}.{side}" if getattr(c, side) else f"data.{side}"
                raise UserError(f"{where}: {code!r} is not a language of the model in train.init_from {path} (it knows "
                                f"{_list(known)}): list it in data.add_languages ({code}: an existing language whose "
                                "token starts it, or null)")
    if kind == "spm" and languages:  # nmt's multilingual models: a language known as a source only has no token
        for i, c in enumerate(d.train_corpora):
            code = d.langs(c)[1]
            if code in known and code not in languages:
                where = f"{d.train_key(i)}.tgt_lang" if c.tgt_lang else "data.tgt_lang"
                raise UserError(f"{where}: the model in train.init_from {path} knows {code!r} as a source language only "
                                f"(its target-language tokens: {_list(languages)}); a language it knows cannot be "
                                "given a target-language token (data.add_languages is for languages it does not know)")
    used = {code for c in d.train_corpora for code in d.langs(c)}
    for code, init in added.items():
        if code in known:
            raise UserError(f"data.add_languages.{code}: the model in train.init_from {path} already knows {code!r}")
        if code not in used:
            raise UserError(f"data.add_languages.{code}: no corpus of data.train has {code!r} as src_lang or tgt_lang "
                            "(a new language is learnt from its training text)")
        if kind == "nllb" and not NLLB_CODE.fullmatch(code):
            raise UserError(f"data.add_languages.{code}: an NLLB model's language codes look like ita_Latn (ISO 639-3 "
                            "code, '_', ISO 15924 script)")
        if init is not None and init not in languages:
            raise UserError(f"data.add_languages.{code}: {init!r} has no language token in the model in "
                            f"train.init_from {path} (its language tokens: {_list(languages) or 'none'}; or null)")
    targets = d.target_languages
    # M2M100/NLLB: one token per language, before the source and as the first target token; nmt's own
    # models: target-language tokens only
    tokens = tuple(added) if tokenizer.source_languages else tuple(code for code in added if code in targets)
    if not tokenizer.source_languages and tokens and not languages and len(targets) > 1:
        raise UserError(f"data.add_languages.{tokens[0]}: the model in train.init_from {path} translates into one "
                        "language and has no language tokens, so it cannot learn a second target language (train a "
                        "multilingual model, or fine-tune into the new language alone)")
    if kind == "nllb" and d.tokenizer.add_pieces and tokenizer.settings.get("added_pieces"):
        raise UserError(f"data.tokenizer.add_pieces: the vocabulary of the NLLB model in train.init_from {path} was grown "
                        "before (it holds appended pieces); growing it again is not supported: set add_pieces: 0 (new "
                        "language tokens are still added)")
    if kind == "marian" and d.tokenizer.add_pieces:
        raise UserError("data.tokenizer.add_pieces: growing the vocabulary of an imported marian model is not "
                        "supported (its source.spm / target.spm / vocab.json; M2M100, NLLB and nmt's own are)")
    if tokens and not languages:
        tokens = ()  # one target language: no token needed
    return Plan(tokens, added)


def _list(items: Iterable[str], most: int = 12) -> str:
    items = sorted(items)
    return ", ".join(items[:most]) + (f", ... ({len(items)})" if len(items) > most else "")

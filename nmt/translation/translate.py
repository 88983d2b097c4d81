"""The one text pipeline: translation for `nmt translate`, `nmt evaluate`, validation during training
and `nmt.Translator`, for both engines (nmt/translation/engine.py).

`translate_chunk(engine, lines, decode)` masks protected spans, encodes the lines, sorts them into
token-budget batches (nmt/translation/batching.py), runs `engine.search_batch` on them (several at
once with `decode.workers`), detokenizes, restores protected spans and the input order. Guarantees:
- one result per input line, in order; a line that encodes to no tokens gives "" without the model;
- a line longer than the model accepts is truncated to `max_positions - 1` tokens, never dropped
  (`TranslationResult.truncated`);
- each sentence is searched independently of its batch, so results do not depend on batching or
  workers (scores up to float rounding);
- every output text is one line (`textio.one_line`);
- with a glossary (PyTorch engine), every output holds the target term of each matched entry, and a
  line no entry matches is searched as without it (nmt/translation/line_terms.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from nmt import textio

from nmt.text import protect
from nmt.translation.batching import Progress, run_engine
from nmt.config import DecodeConfig, decode_config
from nmt.errors import UserError
from nmt.text.languages import target_prefix
from nmt.translation.line_terms import LineTerms

Warn = Callable[[str], None]


@dataclass(frozen=True)
class Translation:
    """One output of one input line: text, score (after the length penalty), log_prob, finished (False: cut
    at the maximum length), alignment ((source, target) subword index pairs, with decode.alignment) and
    protected (decode.protect: None without spans, else whether every span came back exactly once).
    tokens: how many subword tokens the search wrote (a forced prefix and target-language token included, EOS
    not; 0 for a line without tokens)."""

    text: str
    score: float
    log_prob: float
    finished: bool = True
    alignment: tuple[tuple[int, int], ...] | None = None
    protected: bool | None = None
    tokens: int = 0

    def format_alignment(self) -> str:
        return " ".join(f"{i}-{j}" for i, j in self.alignment or ())


@dataclass(frozen=True)
class TranslationResult:
    """The result for one input line: its n-best `hypotheses` (best first; one unless
    decode.nbest > 1) and whether the source was `truncated` to the model's maximum length.
    `prefix_truncated`: its prefix (`--prefix`) was cut likewise. `text`, `score`, ... are the
    best hypothesis'."""

    hypotheses: tuple[Translation, ...]
    truncated: bool = False
    prefix_truncated: bool = False  # its forced prefix was cut to the model's maximum length

    text = property(lambda self: self.hypotheses[0].text)
    score = property(lambda self: self.hypotheses[0].score)
    log_prob = property(lambda self: self.hypotheses[0].log_prob)
    finished = property(lambda self: self.hypotheses[0].finished)
    alignment = property(lambda self: self.hypotheses[0].alignment)
    protected = property(lambda self: self.hypotheses[0].protected)


EMPTY = Translation("", 0.0, 0.0, True)


def _stderr_warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- text -> ids

def encode_sources(engine, lines: Sequence[str], src_lang: str | None = None) -> tuple[list[list[int]], list[bool]]:
    """Subword ids of each line (no EOS; an imported M2M100/NLLB model's token of `src_lang` first),
    truncated to max_positions - 1, and which were truncated."""
    encoded = engine.tokenizer.encode_src(list(lines), src_lang)
    limit = engine.max_positions - 1
    return [ids[:limit] for ids in encoded], [len(ids) > limit for ids in encoded]


def _prefix_ids(engine, prefixes: Sequence[str] | None, lang: list[int], n: int):
    """(forced target ids per line or None, which user prefixes were cut): the language token (if any)
    then the prefix's ids, at most max_positions - 2 in all (room for one more token)."""
    if prefixes is None and not lang:
        return None, [False] * n
    limit = engine.max_positions - 2
    encoded = engine.tokenizer.encode_tgt(list(prefixes)) if prefixes is not None else [[] for _ in range(n)]
    return [(lang + ids)[:limit] for ids in encoded], [len(lang) + len(ids) > limit for ids in encoded]


def _keep_prefix_text(text: str, prefix: str, ids: list[int], tokenizer) -> str:
    """The output text with its forced prefix as the user wrote it: characters the vocabulary lacks
    (unknown pieces, decoded as ' ⁇ ') come back as they were."""
    if tokenizer.specials.unk not in ids:
        return text
    decoded = tokenizer.decode_tgt([ids])[0]
    return prefix + text[len(decoded):] if text.startswith(decoded) else text


def truncation_warning(n: int, max_positions: int, what: str = "input line", room: int = 1) -> str:
    return (f"warning: {n} {what}{'s' if n != 1 else ''} longer than {max_positions - room} tokens "
            f"(model.max_positions - {room}) {'were' if n != 1 else 'was'} truncated")


def check_protect(tokenizer) -> None:
    """UserError unless the model knows the placeholder tokens (trained with data.protect: true)."""
    if not protect.known_by(tokenizer):
        raise UserError("--protect needs a model trained with data.protect: true (its SentencePiece model has no "
                        "placeholder tokens <ph_0> ... <ph_15>)")


def _mask_protected(engine, lines, prefixes, decode: DecodeConfig):
    """(masked lines, masked prefixes, spans per line): protected spans replaced by placeholders."""
    if not decode.protect:
        return lines, prefixes, [[] for _ in lines]
    check_protect(engine.tokenizer)
    masked = [protect.mask(line, decode.protect_pattern) for line in lines]
    spans = [s for _, s in masked]
    if prefixes is not None:
        prefixes = [protect.mask_like(p, s, decode.protect_pattern) for p, s in zip(prefixes, spans)]
    return [m for m, _ in masked], prefixes, spans


def _translation(text: str, h, spans: list[str], alignment) -> Translation:
    """A hypothesis' Translation: protected spans restored, one line."""
    exact = None
    if spans:
        restored = protect.restore(text, spans)
        text, exact = restored.text, restored.exact
    return Translation(textio.one_line(text), float(h.score), float(h.log_prob), h.finished,
                       tuple(alignment) if alignment is not None else None, exact, len(h.tokens))


def _without_tokens(src_ids, prefixes, spans, nbest: int) -> list[tuple[Translation, ...]]:
    """Per line its results so far: a line without tokens gives "" (or its prefix), nbest times; the
    others are filled by the search."""
    hyps: list[tuple[Translation, ...]] = [(EMPTY,) * nbest for _ in src_ids]
    for i, ids in enumerate(src_ids):
        if not ids and prefixes is not None and prefixes[i]:
            hyps[i] = (Translation(textio.one_line(protect.restore(prefixes[i], spans[i]).text), 0.0, 0.0),) * nbest
    return hyps


# --------------------------------------------------------------------------- the core

def translate_chunk(engine, lines: Sequence[str], decode: DecodeConfig, on_batch: Progress | None = None, *,
                    first_line: int = 0, prefixes: Sequence[str] | None = None,
                    line_numbers: Sequence[int] | None = None,
                    cancel: Callable[[], bool] | None = None, glossary=None,
                    on_line: Callable[[int, TranslationResult], None] | None = None) -> list[TranslationResult]:
    """One TranslationResult per line, in order (module docstring). first_line: the input line number of
    lines[0] (sampling keys), or line_numbers: each line's own. prefixes: per line a target prefix the
    output must start with (may be empty). cancel: checked at every decoding step; True raises
    nmt.errors.Cancelled. glossary: a `nmt.text.glossary.Glossary` whose terms the outputs must hold.
    on_line(i, result): line i's result (the one returned) as soon as it is final, once per line, in any
    order: from the thread that searched it as its sentence leaves the search (PyTorch, without
    alignments; with a glossary's `missing`, a line with terms whose free output is kept: after the free
    search), else from the calling thread as its batch is taken, in batch order."""
    keys = list(line_numbers) if line_numbers is not None else [first_line + i for i in range(len(lines))]
    lines, prefixes, spans = _mask_protected(engine, list(lines), prefixes, decode)
    src_ids, truncated = encode_sources(engine, lines, decode.src_lang)
    lang = target_prefix(engine.tokenizer, decode.tgt_lang)  # [] or [the language token]
    prefix_ids, prefix_cut = _prefix_ids(engine, prefixes, lang, len(lines))
    todo = [i for i, ids in enumerate(src_ids) if ids]  # lines without tokens give "" (or their prefix)
    hyps = _without_tokens(src_ids, prefixes, spans, decode.nbest)

    from nmt.search.options import SearchInputs, SearchOptions  # (torch: loaded with the model)

    options = SearchOptions.from_decode(decode, engine.tokenizer)  # once for the whole call
    terms = LineTerms.of(engine, lines, glossary, keys, decode, options, prefix_ids, spans)
    if on_batch is not None and len(todo) < len(lines):
        on_batch(len(lines) - len(todo))
    given = [False] * len(lines)  # (on_line) the lines handed over

    def finish(i: int, nbest: list, texts: list[str], alignments: list) -> None:
        """Line i's result from its n-best hypotheses and their texts; handed to on_line."""
        keep = (lambda t: _keep_prefix_text(t, prefixes[i], prefix_ids[i][len(lang):], engine.tokenizer)) \
            if prefixes is not None and prefixes[i] else (lambda t: t)
        hyps[i] = tuple(_translation(keep(text), h, spans[i], a) for h, text, a in zip(nbest, texts, alignments))
        if on_line is not None and not given[i]:
            given[i] = True
            on_line(i, TranslationResult(hyps[i], truncated[i], prefix_cut[i]))

    for i in range(len(lines) if on_line is not None else 0):
        if not src_ids[i]:
            given[i] = True
            on_line(i, TranslationResult(hyps[i], truncated[i], prefix_cut[i]))

    def inputs(rows: list[int]) -> SearchInputs:
        return SearchInputs(prefixes=[prefix_ids[i] for i in rows] if prefix_ids is not None else None,
                            keys=[keys[i] for i in rows])

    def search(batch: list[int]) -> tuple[list[list], list | None]:
        """(n-best hypotheses per sentence, their alignments in the same flat order or None)."""
        rows = [todo[j] for j in batch]
        final = None
        if on_line is not None and not decode.alignment:  # each line as its sentence leaves the search
            final = lambda b, nbest: finish(rows[b], nbest, engine.tokenizer.decode_tgt([h.tokens for h in nbest]),  # noqa: E731
                                            [None] * len(nbest))
        if terms is None:
            nbests = engine.search_batch([src_ids[i] for i in rows], options, inputs(rows), cancel=cancel,
                                         on_final=final)
        else:
            nbests, _ = terms.search(engine, rows, src_ids, inputs, cancel, final)
        if not decode.alignment:
            return nbests, None
        pairs = [(src_ids[i], h.tokens) for i, nbest in zip(rows, nbests) for h in nbest]
        aligned = engine.align_batch([x for x, _ in pairs], [y for _, y in pairs])
        return nbests, [[(i, j - len(lang)) for i, j in a if j >= len(lang)] for a in aligned]  # (language token out)

    for batch, (nbests, alignments) in run_engine(engine, search, [len(src_ids[i]) + 1 for i in todo], decode,
                                                  on_batch):
        rest = [(todo[j], nbest) for j, nbest in zip(batch, nbests) if not given[todo[j]]]
        flat = [h for _, nbest in rest for h in nbest]
        texts = iter(engine.tokenizer.decode_tgt([h.tokens for h in flat]))
        aligned = iter(alignments or [None] * len(flat))  # (alignments: on_line waits for its batch)
        for i, nbest in rest:
            finish(i, nbest, [next(texts) for _ in nbest], [next(aligned) for _ in nbest])
    return [TranslationResult(h, t, p) for h, t, p in zip(hyps, truncated, prefix_cut)]


def translate_nbest(engine, lines: Sequence[str], decode: DecodeConfig | None = None, *,
                    warn: Warn | None = None, prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
    """Per input line `decode.nbest` Translations, best first (decode: default the engine's). Empty lines
    give copies of EMPTY; over-long lines are truncated and counted in one warning to `warn` (default:
    stderr). prefixes: see translate_chunk."""
    decode = decode or engine.decode
    results = translate_chunk(engine, lines, decode, prefixes=prefixes)
    n_truncated = sum(r.truncated for r in results)
    if n_truncated:
        (warn or _stderr_warn)(truncation_warning(n_truncated, engine.max_positions))
    return [list(r.hypotheses) for r in results]


def translate_lines(engine, lines: Sequence[str], decode: DecodeConfig | None = None, **kwargs) -> list[str]:
    """One translation per input line, in order (the best hypothesis; see translate_nbest)."""
    decode = decode_config(decode or engine.decode, {"nbest": 1})
    return [nbest[0].text for nbest in translate_nbest(engine, lines, decode, **kwargs)]

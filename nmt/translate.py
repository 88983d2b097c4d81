"""The one text pipeline: translation for `nmt translate`, `nmt evaluate`, validation during
training and `nmt.Translator`, for both engines (nmt/engine.py). (`nmt score` shares its
encoding limits and batching, nmt/batching.py, but not its search.)

`translate_chunk(engine, lines, decode)` masks protected spans, encodes the lines,
sorts them by source length into token-budget batches (`decode.batch_tokens` padded
source positions, at most `decode.max_batch_size` sentences; nmt/batching.py), runs
`engine.search_batch` on them (several batches at once with `decode.workers`),
detokenizes, restores protected spans and the input order. Guarantees:

- one result per input line, in the input's order;
- a line that encodes to no tokens (empty, blank) gives "" without reaching the model;
- a line longer than the model accepts is truncated to `max_positions - 1` tokens (room
  for the source EOS), never dropped; its result says so (`TranslationResult.truncated`);
- each sentence is searched independently of its batch companions, so results do not
  depend on batching or workers (sampling with the CTranslate2 engine excepted: nmt/ct2.py);
- every output text is one line (`textio.one_line`);
- with a glossary (nmt/glossary.py; the PyTorch engine), every output of a line holds the target
  term of every entry whose source term matches in the line, and a line no entry matches is searched
  exactly as without the glossary. A line with a term is searched with its terms as constraints
  (nmt/constraints.py), and with `decode.glossary_annotate` (off by default) for a model trained with
  data.terms with its matches annotated in the source (`nmt.terms.annotate`; its length limit stays
  that of the line as written). With `decode.glossary_constrain: missing` (default `always`) every
  line is first searched as without the glossary, and keeps those outputs when every one of them
  already holds every term of the line (whole words, as `nmt evaluate --glossary` counts term use);
  only the other lines get the constrained search, with `decode.glossary_beam_size` and
  `decode.glossary_length_penalty` where set (else the line's own beam size and penalty; `nmt tune
  --glossary` chooses them; with `always` the lines without a term are then searched in batches of their
  own: the same search, its scores equal up to float rounding). With decode.protect, terms are matched in the masked line (protected
  spans are copied as they are).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from nmt import protect, textio
from nmt.batching import Progress, run_engine
from nmt.config import DecodeConfig, decode_config
from nmt.errors import UserError
from nmt.languages import target_prefix

Warn = Callable[[str], None]


@dataclass(frozen=True)
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
    alignment: tuple[tuple[int, int], ...] | None = None
    protected: bool | None = None

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
                       tuple(alignment) if alignment is not None else None, exact)


class _LineTerms:
    """The glossary terms of a call's lines: per line the target terms its output must hold (`targets`),
    their token ids (`seqs`) and whether each ends inside a word (`ends`); `batch(rows)` is the search's
    `Terms` for a batch of those lines, None when none of them has a term (the plain search); `held`
    says whether a text holds every target term of its line, as `nmt evaluate --glossary` counts term use."""

    def __init__(self, seqs: list[list[list[int]]], ends: list[list[bool]], joins: list[bool],
                 targets: list[list[str]], ignore_case: bool = False):
        self.seqs, self.ends, self.joins = seqs, ends, joins
        self.targets, self.ignore_case = targets, ignore_case

    def held(self, i: int, text: str) -> bool:
        from nmt.glossary import appearing

        return all(appearing(self.targets[i], text, self.ignore_case))

    def batch(self, rows: Sequence[int]):
        if not any(self.seqs[i] for i in rows):
            return None
        from nmt.search_options import Terms

        return Terms([self.seqs[i] for i in rows], [self.ends[i] for i in rows], self.joins)


def check_glossary(engine, decode: DecodeConfig | None = None) -> None:
    """UserError unless glossary terms can be guaranteed: an engine with constrained search (the PyTorch
    one) and, with `decode`, a search that takes constraints (greedy or beam, not sampling)."""
    if not engine.guarantees_terms:
        raise UserError(f"a glossary needs constrained search, which the {engine.name} engine does not have: "
                        "translate with the checkpoint (PyTorch engine)")
    if decode is not None and decode.sampling != "none":
        raise UserError("a glossary is not guaranteed with sampling: use greedy or beam search")
    if decode is not None:
        glossary_search(decode)  # (its UserError)


def _glossary_terms(engine, lines: list[str], glossary, keys: list[int], decode: DecodeConfig):
    """(lines, annotated where they match for a model trained with data.terms; their `_LineTerms`, None
    when no entry matches). UserError for an engine without constrained search, sampling with terms, a
    term the model cannot write (naming the line). Each distinct target term is encoded once."""
    if glossary is None:
        return lines, None
    check_glossary(engine)
    from nmt import terms
    from nmt.glossary import joining_tokens, term_tokens

    annotate = decode.glossary_annotate and terms.known_by(engine.tokenizer)
    encoded: dict[str, tuple[list[int], bool]] = {}  # target term -> (its ids, whether it ends inside a word)
    out, seqs, ends, targets = [], [], [], []
    for line, key in zip(lines, keys):
        matches = glossary.match(line)
        ids: list[list[int]] = []
        end: list[bool] = []
        targets.append(list(dict.fromkeys(m.entry.target for m in matches)))
        for target in targets[-1]:
            if target not in encoded:
                try:
                    (term_ids,), (term_end,) = term_tokens([target], engine.tokenizer)
                except UserError as e:
                    raise UserError(f"line {key + 1}: {e}") from None
                encoded[target] = term_ids, term_end
            if encoded[target][0] not in ids:  # two targets with the same ids count once
                ids.append(encoded[target][0])
                end.append(encoded[target][1])
        out.append(terms.annotate(line, matches) if matches and annotate else line)
        seqs.append(ids)
        ends.append(end)
    if not any(seqs):
        return out, None
    check_glossary(engine, decode)
    return out, _LineTerms(seqs, ends, joining_tokens(engine.tokenizer), targets, glossary.ignore_case)


def _encode_annotated(engine, lines: list[str], annotated: list[str], src_ids, truncated, src_lang: str | None):
    """(ids, truncated) of the annotated lines: `encode_sources` of the lines the annotation changed,
    the others' as they are."""
    changed = [i for i, (a, line) in enumerate(zip(annotated, lines)) if a != line]
    if not changed:
        return src_ids, truncated
    ids, cut = list(src_ids), list(truncated)
    for i, x, c in zip(changed, *encode_sources(engine, [annotated[i] for i in changed], src_lang)):
        ids[i], cut[i] = x, c
    return ids, cut


def glossary_sources(engine, lines: list[str], glossary, decode: DecodeConfig, src_ids, truncated, spans):
    """(the ids each line's constrained search reads: annotated where decode.glossary_annotate applies,
    else `src_ids`; the lines' `_LineTerms`, None without a glossary or a match) for `nmt tune --glossary`,
    as `translate_chunk` makes them (lines: already masked with decode.protect, their protected `spans`)."""
    annotated, terms = _glossary_terms(engine, lines, glossary, list(range(len(lines))), decode)
    if terms is None:
        return src_ids, None
    lang = target_prefix(engine.tokenizer, decode.tgt_lang)
    _check_room(engine, terms.seqs, [lang] * len(lines), spans, list(range(len(lines))))
    return _encode_annotated(engine, lines, annotated, src_ids, truncated, decode.src_lang)[0], terms


def _check_room(engine, seqs, prefix_ids, spans, keys) -> None:
    """UserError naming the first line whose terms (with its prefix, placeholders and an EOS) do not fit
    in the model's positions."""
    from nmt.search_options import room_needed

    cap = engine.max_positions - 1
    for i, ids in enumerate(seqs):
        need = room_needed(len(prefix_ids[i]) if prefix_ids is not None else 0, ids, len(spans[i]))
        if need > cap:
            raise UserError(f"line {keys[i] + 1}: its glossary terms need {need} output tokens, more than the "
                            f"model's {cap}")


def _without_tokens(src_ids, prefixes, spans, nbest: int) -> list[tuple[Translation, ...]]:
    """Per line its results so far: a line without tokens gives "" (or its prefix), nbest times; the
    others are filled by the search."""
    hyps: list[tuple[Translation, ...]] = [(EMPTY,) * nbest for _ in src_ids]
    for i, ids in enumerate(src_ids):
        if not ids and prefixes is not None and prefixes[i]:
            hyps[i] = (Translation(textio.one_line(protect.restore(prefixes[i], spans[i]).text), 0.0, 0.0),) * nbest
    return hyps


# --------------------------------------------------------------------------- the core

def _search_lines(engine, options, term_options, rows: list[int], src_ids, term_ids, prefix_ids, keys,
                  terms: _LineTerms | None, constrain: str, cancel) -> tuple[list[list], list[bool]]:
    """(the n-best hypotheses of lines `rows`, whether each was searched with its terms as constraints,
    from `term_ids`, its source annotated for a data.terms model, and `term_options`; else from `src_ids`
    and `options`). `constrain` (decode.glossary_constrain): "always" searches lines with terms with
    constraints at once; "missing" searches every line without them first, then again with them the
    lines whose outputs do not all hold their terms (module docstring)."""
    from nmt.search_options import SearchInputs

    def search(part: list[int], constrained: bool) -> list[list]:
        inputs = SearchInputs(prefixes=[prefix_ids[i] for i in part] if prefix_ids is not None else None,
                              keys=[keys[i] for i in part], constraints=terms.batch(part) if constrained else None,
                              source_lengths=[len(src_ids[i]) + 1 for i in part] if constrained else None)
        return engine.search_batch([(term_ids if constrained else src_ids)[i] for i in part],
                                   term_options if constrained else options, inputs, cancel=cancel)

    if terms is None or not any(terms.seqs[i] for i in rows):
        return search(rows, False), [False] * len(rows)
    with_terms = [k for k, i in enumerate(rows) if terms.seqs[i]]
    if constrain == "always" and term_options is options:  # one search: a line without terms is searched as without
        return search(rows, True), [bool(terms.seqs[i]) for i in rows]
    if constrain == "always":  # (a penalty of their own: the lines with terms apart)
        nbests = [[]] * len(rows)
        without = [k for k, i in enumerate(rows) if not terms.seqs[i]]
        for part, constrained in ((without, False), (with_terms, True)):
            for k, nbest in zip(part, search([rows[k] for k in part], constrained) if part else []):
                nbests[k] = nbest
        return nbests, [bool(terms.seqs[i]) for i in rows]
    nbests = search(rows, False)
    texts = iter(engine.tokenizer.decode_tgt([h.tokens for k in with_terms for h in nbests[k]]))
    again = [k for k in with_terms if not all([terms.held(rows[k], next(texts)) for _ in nbests[k]])]
    if again:
        for k, nbest in zip(again, search([rows[k] for k in again], True)):
            nbests[k] = nbest
    again_set = set(again)
    return nbests, [k in again_set for k in range(len(rows))]


def glossary_search(decode: DecodeConfig) -> tuple[int, float]:
    """(beam size, length penalty alpha) of the constrained search of lines with glossary terms:
    decode.glossary_beam_size (at least nbest) and decode.glossary_length_penalty (where a penalty applies:
    beam search, a penalty type), else the search's own. UserError where `patience` would stop those lines
    before nbest hypotheses."""
    from nmt.schema import max_finished

    beam = max(decode.glossary_beam_size, decode.nbest) if decode.glossary_beam_size is not None else decode.beam_size
    alpha = decode.length_penalty
    if decode.glossary_length_penalty is not None and beam > 1 and decode.length_penalty_type != "none":
        alpha = decode.glossary_length_penalty
    most = max_finished(beam, decode.patience)
    if beam != decode.beam_size and beam > 1 and decode.patience > 0 and most < decode.nbest:
        raise UserError(f"decode.glossary_beam_size {beam} with patience {decode.patience:g} stops a line with "
                        f"terms after round(beam * patience) = {most} finished hypotheses, fewer than nbest "
                        f"{decode.nbest}: raise glossary_beam_size or patience")
    return beam, alpha


def _term_options(options, decode: DecodeConfig):
    """The search options of lines with glossary terms (`glossary_search`): `options` itself where the
    glossary keys do not change the search."""
    beam, alpha = glossary_search(decode)
    if (beam, alpha) == (options.beam_size, options.length_penalty):
        return options
    return dataclasses.replace(options, beam_size=beam, length_penalty=alpha)


def translate_chunk(engine, lines: Sequence[str], decode: DecodeConfig, on_batch: Progress | None = None, *,
                    first_line: int = 0, prefixes: Sequence[str] | None = None,
                    line_numbers: Sequence[int] | None = None,
                    cancel: Callable[[], bool] | None = None, glossary=None) -> list[TranslationResult]:
    """One TranslationResult per line, in order (module docstring).

    first_line: the input line number of lines[0] (sampling keys). line_numbers: each line's own
    number instead (lines gathered from several inputs, e.g. the requests `nmt serve` translates
    together); first_line is then not used. prefixes: per line a target prefix text the output
    must start with (may be empty). cancel: checked at every decoding step; True stops the call
    (nmt.errors.Cancelled). glossary: a `nmt.glossary.Glossary` whose terms the outputs must hold.
    """
    keys = list(line_numbers) if line_numbers is not None else [first_line + i for i in range(len(lines))]
    lines, prefixes, spans = _mask_protected(engine, list(lines), prefixes, decode)
    annotated, terms = _glossary_terms(engine, lines, glossary, keys, decode)
    src_ids, truncated = encode_sources(engine, lines, decode.src_lang)
    term_ids, term_cut = _encode_annotated(engine, lines, annotated, src_ids, truncated, decode.src_lang)
    lang = target_prefix(engine.tokenizer, decode.tgt_lang)  # [] or [the language token]
    prefix_ids, prefix_cut = _prefix_ids(engine, prefixes, lang, len(lines))
    if terms is not None:
        _check_room(engine, terms.seqs, prefix_ids, spans, keys)
    todo = [i for i, ids in enumerate(src_ids) if ids]  # lines without tokens give "" (or their prefix)
    hyps = _without_tokens(src_ids, prefixes, spans, decode.nbest)
    if on_batch is not None and len(todo) < len(lines):
        on_batch(len(lines) - len(todo))

    from nmt.search_options import SearchOptions  # (torch: loaded with the model)

    options = SearchOptions.from_decode(decode, engine.tokenizer)  # once for the whole call
    term_options = _term_options(options, decode) if terms is not None else options

    def search(batch: list[int]) -> tuple[list[list], list | None, list[bool]]:
        """(n-best hypotheses per sentence, their alignments in the same flat order or None, whether
        each sentence was searched with its terms as constraints)."""
        rows = [todo[j] for j in batch]
        nbests, constrained = _search_lines(engine, options, term_options, rows, src_ids, term_ids, prefix_ids, keys, terms,
                                            decode.glossary_constrain, cancel)
        if not decode.alignment:
            return nbests, None, constrained
        pairs = [((term_ids if c else src_ids)[i], h.tokens) for i, c, nbest in zip(rows, constrained, nbests)
                 for h in nbest]
        aligned = engine.align_batch([x for x, _ in pairs], [y for _, y in pairs])
        return nbests, [[(i, j - len(lang)) for i, j in a if j >= len(lang)] for a in aligned], constrained  # (language token out)

    for batch, (nbests, alignments, constrained) in run_engine(engine, search, [len(src_ids[i]) + 1 for i in todo],
                                                               decode, on_batch):
        for j, c in zip(batch, constrained):
            if c:  # the result says whether the source it was translated from was truncated
                truncated[todo[j]] = term_cut[todo[j]]
        flat = [h for nbest in nbests for h in nbest]
        texts = iter(engine.tokenizer.decode_tgt([h.tokens for h in flat]))
        aligned = iter(alignments or [None] * len(flat))
        for j, nbest in zip(batch, nbests):
            i = todo[j]
            keep = (lambda t, i=i: _keep_prefix_text(t, prefixes[i], prefix_ids[i][len(lang):], engine.tokenizer)) \
                if prefixes is not None and prefixes[i] else (lambda t: t)
            hyps[i] = tuple(_translation(keep(next(texts)), h, spans[i], next(aligned)) for h in nbest)
    return [TranslationResult(h, t, p) for h, t, p in zip(hyps, truncated, prefix_cut)]


def translate_nbest(engine, lines: Sequence[str], decode: DecodeConfig | None = None, *,
                    warn: Warn | None = None, prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
    """Per input line `decode.nbest` Translations, best first (greedy when beam_size == 1).

    decode: default the engine's. Empty lines give `decode.nbest` copies of EMPTY. Over-long
    lines are truncated and counted in one warning passed to `warn` (default: stderr).
    prefixes: see translate_chunk.
    """
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

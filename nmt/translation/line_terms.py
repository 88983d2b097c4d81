"""Lines with glossary terms: what each line's output must hold, and how those lines are searched.
nmt/translation/translate.py builds a call's `LineTerms` once (`LineTerms.of`) and lets it search each batch.

- A line's terms: the target term of every matched glossary entry (nmt/text/glossary.py), as token
  ids; checked when found: the model can write each, and its output limit has room for them all.
- decode.glossary.constrain `always`: a line with a term is searched with its terms as constraints
  (nmt/search/constraints.py). `missing`: every line is searched as without the glossary first, and
  only the lines whose outputs miss a term are searched again with constraints.
- The constrained search takes decode.glossary.beam_size and length_penalty where set (`term_settings`).
With decode.protect, terms are matched in the masked line.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from nmt.config import DecodeConfig
from nmt.errors import UserError
from nmt.text.glossary import appearing, joining_tokens, term_tokens
from nmt.text.protect import restore
from nmt.schema import max_finished


def check(engine, decode: DecodeConfig | None = None) -> None:
    """UserError unless glossary terms can be guaranteed: an engine with constrained search (the PyTorch
    one) and, with `decode`, a search that takes constraints (greedy or beam, not sampling)."""
    if "terms" not in engine.supports:
        raise UserError(f"a glossary needs constrained search, which the {engine.name} engine does not have: "
                        "translate with the checkpoint (PyTorch engine)")
    if decode is not None and decode.sampling.method != "none":
        raise UserError("a glossary is not guaranteed with sampling: use greedy or beam search")
    if decode is not None:
        term_settings(decode)  # (its UserError)


def term_settings(decode: DecodeConfig) -> tuple[int, float]:
    """(beam size, length penalty alpha) of the constrained search: decode.glossary.beam_size (at least
    nbest) and decode.glossary.length_penalty (where a penalty applies: beam search, a penalty type), else
    the search's own. UserError where `patience` would stop those lines before nbest hypotheses."""
    beam = max(decode.glossary.beam_size, decode.nbest) if decode.glossary.beam_size is not None else decode.beam_size
    alpha = decode.length_penalty
    if decode.glossary.length_penalty is not None and beam > 1 and decode.length_penalty_type != "none":
        alpha = decode.glossary.length_penalty
    most = max_finished(beam, decode.patience)
    if beam != decode.beam_size and beam > 1 and decode.patience > 0 and most < decode.nbest:
        raise UserError(f"glossary_beam_size {beam} with patience {decode.patience:g} stops a line with "
                        f"terms after round(beam * patience) = {most} finished hypotheses, fewer than nbest "
                        f"{decode.nbest}: raise glossary_beam_size or patience")
    return beam, alpha


class LineTerms:
    """The glossary terms of a call's lines (module docstring): per line the target terms its outputs must
    hold (`targets`), their token ids (`seqs`) and whether each ends inside a word (`ends`); `options`
    and `term_options`, the free and the constrained search's settings."""

    def __init__(self, seqs: list[list[list[int]]], ends: list[list[bool]], joins: list[bool],
                 targets: list[list[str]], ignore_case: bool, constrain: str, options, term_options,
                 spans: Sequence[list[str]] = ()):
        self.seqs, self.ends, self.joins = seqs, ends, joins
        self.spans = spans  # per line its protected spans (decode.protect), put back before `held` looks
        self.targets, self.ignore_case, self.constrain = targets, ignore_case, constrain
        self.options, self.term_options = options, term_options

    @classmethod
    def of(cls, engine, lines: Sequence[str], glossary, keys: Sequence[int], decode: DecodeConfig, options,
           prefix_ids: Sequence[list[int]] | None, spans: Sequence[list[str]]) -> LineTerms | None:
        """The terms of `lines` (masked with decode.protect, their protected `spans`; keys: their line
        numbers, for errors), None without a glossary or where no entry matches. options: the call's
        SearchOptions. UserError for an engine without constrained search, sampling with terms, a term the
        model cannot write or lines without room for their terms (naming the line)."""
        if glossary is None:
            return None
        check(engine)
        encoded: dict[str, tuple[list[int], bool]] = {}  # target term -> (its ids, whether it ends inside a word)
        seqs, ends, targets = [], [], []
        for line, key in zip(lines, keys):
            targets.append(list(dict.fromkeys(m.entry.target for m in glossary.match(line))))
            ids: list[list[int]] = []
            end: list[bool] = []
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
            seqs.append(ids)
            ends.append(end)
        if not any(seqs):
            return None
        check(engine, decode)
        _check_room(engine, seqs, prefix_ids, spans, keys)
        beam, alpha = term_settings(decode)
        same = (beam, alpha) == (options.beam_size, options.length_penalty)
        term_options = options if same else dataclasses.replace(options, beam_size=beam, length_penalty=alpha)
        return cls(seqs, ends, joining_tokens(engine.tokenizer), targets, glossary.ignore_case,
                   decode.glossary.constrain, options, term_options, spans)

    def held(self, i: int, text: str) -> bool:
        """Whether `text` (a decoded output of line i, its placeholders not yet replaced) holds every target term
        of line i, as `nmt evaluate --glossary` counts term use in the output."""
        if i < len(self.spans) and self.spans[i]:
            text = restore(text, self.spans[i]).text  # ("<ph_0>" is no `>`)
        return all(appearing(self.targets[i], text, self.ignore_case))

    def batch(self, rows: Sequence[int]):
        """The search's `Terms` of lines `rows`, None when none of them has a term."""
        if not any(self.seqs[i] for i in rows):
            return None
        from nmt.search.options import Terms

        return Terms([self.seqs[i] for i in rows], [self.ends[i] for i in rows], self.joins)

    def search(self, engine, rows: list[int], src_ids, inputs: Callable[[list[int]], object],
               cancel, on_final: Callable[[int, list], None] | None = None) -> tuple[list[list], list[bool]]:
        """(the n-best hypotheses of lines `rows`, whether each was searched with its terms as
        constraints) (module docstring). inputs(lines): their SearchInputs without terms. on_final(k,
        nbest): rows[k]'s hypotheses as soon as they are final (the search's `Final`; with `missing`, a line
        with terms whose free output is kept: after the free search)."""

        def search(part: list[int], constrained: bool, final: bool = True) -> list[list]:
            """The search of lines `part`; final: its results are final (handed to on_final as they are)."""
            given = inputs(part)
            if constrained:
                given = dataclasses.replace(given, constraints=self.batch(part))
            index = {j: rows.index(i) for j, i in enumerate(part)} if on_final is not None else {}
            ready = None
            if on_final is not None:
                ready = (lambda j, nbest: on_final(index[j], nbest)) if final else \
                    (lambda j, nbest: None if self.seqs[part[j]] else on_final(index[j], nbest))
            return engine.search_batch([src_ids[i] for i in part], self.term_options if constrained else self.options,
                                       given, cancel=cancel, on_final=ready)

        with_terms = [k for k, i in enumerate(rows) if self.seqs[i]]
        if not with_terms:
            return search(rows, False), [False] * len(rows)
        if self.constrain == "always" and self.term_options is self.options:  # a line without terms: as without
            return search(rows, True), [bool(self.seqs[i]) for i in rows]
        nbests: list[list] = [[]] * len(rows)
        if self.constrain == "always":  # (settings of their own: the lines with terms apart)
            without = [k for k, i in enumerate(rows) if not self.seqs[i]]
            for part, constrained in ((without, False), (with_terms, True)):
                for k, nbest in zip(part, search([rows[k] for k in part], constrained) if part else []):
                    nbests[k] = nbest
            return nbests, [bool(self.seqs[i]) for i in rows]
        nbests = search(rows, False, final=False)  # (a line with terms may be searched again)
        texts = iter(engine.tokenizer.decode_tgt([h.tokens for k in with_terms for h in nbests[k]]))
        again = [k for k in with_terms if not all([self.held(rows[k], next(texts)) for _ in nbests[k]])]
        for k in sorted(set(with_terms) - set(again)) if on_final is not None else ():
            on_final(k, nbests[k])
        for k, nbest in zip(again, search([rows[k] for k in again], True) if again else []):
            nbests[k] = nbest
        again_set = set(again)
        return nbests, [k in again_set for k in range(len(rows))]


def _check_room(engine, seqs, prefix_ids, spans, keys) -> None:
    """UserError naming the first line whose terms (with its prefix, placeholders and an EOS) do not fit
    in the model's positions."""
    from nmt.search.options import room_needed

    cap = engine.max_positions - 1
    for i, ids in enumerate(seqs):
        need = room_needed(len(prefix_ids[i]) if prefix_ids is not None else 0, ids, len(spans[i]))
        if need > cap:
            raise UserError(f"line {keys[i] + 1}: its glossary terms need {need} output tokens, more than the "
                            f"model's {cap}")

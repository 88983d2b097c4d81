"""Choosing a model's decode settings on a dev set, within a time budget (`nmt tune`, `train.tune_decode`).

What is searched: the beam size (greedy, 5), n-gram blocking (off, 3, 4, 6), and for beam search the
length penalty (gnmt and average, alpha 0.5 ... 2.0 in steps of 0.1, and none). Outputs that loop (a
word 3-gram 3+ times: nmt/evaluation/degeneration.py) may be at most `max_loops` of the lines; when
no setting is within it, nothing is chosen (`TuneResult.within_limit`). A multilingual model is tuned
in one target language; the settings serve every language (the decode section is one).

How: beam search's live beams do not depend on the length penalty, so one search that keeps every
finished hypothesis (`SearchOptions(keep_all=True)`) gives the output under every penalty at once.
Each (beam size, n-gram) pair, an "arm", is decoded once per line, and the arms are raced by
successive halving (Jamieson and Talwalkar, 2016): all arms decode the first 100 lines of a fixed
shuffle of the dev set, the better half the lines up to 200, and so on, until one arm has the whole
dev set or the next round would overrun the time budget (the first round always runs). The chosen
setting is the best one on the most lines its arm decoded.

With a glossary, once the setting is chosen, the lines searched with their terms
(decode.glossary.constrain) get their own beam size (the setting's, or twice it) and length penalty
(`tune_glossary`), by the same one-search trick.

Scores are sacreBLEU's corpus BLEU or chrF, summed from per-line statistics. The result goes into
the `decode` section of a copy of the checkpoint (`-o`) or of the checkpoint itself (`--in-place`,
atomically), with a `tuned` record (settings, metric, lines, the table); nothing else changes.
`train.tune_decode` runs it on best.pt; its `stop` ends the race between two batches (`Stopped`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from nmt import textio

from nmt.text import protect
from nmt.config import DecodeConfig, SamplingConfig, decode_config, to_dict
from nmt.evaluation.degeneration import loops
from nmt.errors import UserError

if TYPE_CHECKING:  # (torch loads with the model)
    from nmt.search.options import SearchOptions

BEAMS = (1, 5)
NGRAMS = (0, 3, 4, 6)
PENALTIES = tuple((kind, a / 10) for kind in ("gnmt", "average") for a in range(5, 21)) + (("none", 0.0),)
FIRST_ROUND_LINES = 100
MAX_LOOPS = 0.02
MAX_TIME = 600.0  # seconds: `nmt tune`'s default budget


class Stopped(Exception):
    """`tune`'s `stop()` turned true (train.tune_decode got a signal): the race ended, nothing was chosen."""


@dataclass(frozen=True)
class Setting:
    """One point of the search space: the decode keys it sets."""

    beam_size: int
    no_repeat_ngram: int
    length_penalty_type: str = "none"
    length_penalty: float = 0.0

    def keys(self) -> dict:
        keys = {"beam_size": self.beam_size, "no_repeat_ngram": self.no_repeat_ngram}
        if self.beam_size > 1:
            keys.update(length_penalty_type=self.length_penalty_type, length_penalty=self.length_penalty)
        return keys

    def label(self) -> str:
        if self.beam_size == 1:
            return f"greedy, no-repeat {self.no_repeat_ngram}"
        pen = "none" if self.length_penalty_type == "none" else f"{self.length_penalty_type} {self.length_penalty:.1f}"
        return f"beam {self.beam_size}, {pen}, no-repeat {self.no_repeat_ngram}"


@dataclass(frozen=True)
class Row:
    """One line of the table: a setting scored on the first `lines` lines of the shuffled dev set."""

    round: int
    lines: int
    setting: Setting
    score: float
    bp: float | None
    ratio: float | None
    loops: float

    def as_dict(self) -> dict:
        return {"round": self.round, "lines": self.lines, **self.setting.keys(), "score": self.score, "bp": self.bp,
                "ratio": self.ratio, "loops": self.loops}


# --------------------------------------------------------------------------- scoring

class Scorer:
    """Corpus scores of any choice of one hypothesis text per line, from cached per-line statistics."""

    def __init__(self, refs: Sequence[str], metric: str):
        from sacrebleu.metrics import BLEU, CHRF

        self.refs, self.name = list(refs), metric
        self.metric = BLEU() if metric == "bleu" else CHRF()
        self._stats: dict[tuple[int, str], list] = {}
        self._loops: dict[str, bool] = {}
        self._split = BLEU().tokenizer

    def _fill(self, pairs: list[tuple[int, str]]) -> None:
        todo = [p for p in dict.fromkeys(pairs) if p not in self._stats]
        if todo:
            stats = self.metric._extract_corpus_statistics([h for _, h in todo], [[self.refs[i] for i, _ in todo]])
            self._stats.update(zip(todo, stats))
        for _, h in todo:
            if h not in self._loops:
                self._loops[h] = loops(self._split(h.rstrip()).split())

    def score(self, lines: Sequence[int], texts: Sequence[str]) -> tuple[float, float | None, float | None, float]:
        """(metric, BP, length ratio, share of looping lines) of texts[k] as the output of line lines[k]."""
        pairs = list(zip(lines, texts))
        self._fill(pairs)
        total = [sum(col) for col in zip(*(self._stats[p] for p in pairs))]
        result = self.metric._compute_score_from_stats(total)
        bp = float(result.bp) if self.name == "bleu" else None
        ratio = float(result.ratio) if self.name == "bleu" else None
        return float(result.score), bp, ratio, sum(self._loops[t] for t in texts) / max(len(texts), 1)


# --------------------------------------------------------------------------- decoding

class Decoder:
    """Decodes dev lines with a TorchEngine: greedy outputs, or every finished beam hypothesis."""

    def __init__(self, engine, src_lines: Sequence[str], decode: DecodeConfig,
                 stop: Callable[[], bool] = lambda: False, glossary=None):
        from nmt.text.languages import target_prefix
        from nmt.search.options import SearchOptions
        from nmt.translation.line_terms import LineTerms
        from nmt.translation.translate import check_protect, encode_sources

        self.engine, self.decode, self.stop = engine, decode, stop
        lines, self.spans = list(src_lines), [[] for _ in src_lines]
        if decode.protect:
            check_protect(engine.tokenizer)
            masked = [protect.mask(x, decode.protect_pattern) for x in lines]
            lines, self.spans = [m for m, _ in masked], [s for _, s in masked]
        self.src_ids, _ = encode_sources(engine, lines, decode.src_lang)
        self.lang = target_prefix(engine.tokenizer, decode.tgt_lang)
        self.options = SearchOptions.from_decode(decode, engine.tokenizer)
        # with a glossary: each line's terms, as nmt translate finds them (nmt/translation/line_terms.py)
        self.terms = LineTerms.of(engine, lines, glossary, range(len(lines)), decode, self.options,
                                  [list(self.lang)] * len(lines) if self.lang else None, self.spans)
        self._texts: dict[tuple, str] = {}

    def arm_options(self, arm: tuple[int, int]) -> SearchOptions:
        """The search of arm (beam size, n-gram): greedy, or beam search keeping every finished hypothesis
        (`keep_all`, the exact stop: the live beams do not depend on the penalty, so every penalty can be
        applied afterwards, `pick`); min_len, the length limit and patience are the decode settings'."""
        beam, ngram = arm
        if beam == 1:
            return dataclasses.replace(self.options, beam_size=1, nbest=1, no_repeat_ngram=ngram)
        return dataclasses.replace(self.options, beam_size=beam, nbest=1, no_repeat_ngram=ngram, keep_all=True,
                                   stopping="exact", length_penalty=1.0, length_penalty_type="gnmt")

    def run(self, arm: tuple[int, int], lines: list[int], constrained: bool = False) -> dict[int, list[tuple]]:
        """{line: [(tokens, log_prob, length, finished), ...]} for arm (beam size, n-gram) on these lines;
        `constrained`: lines with glossary terms, searched with them as constraints (a beam arm).
        Raises `Stopped` between two batches once `stop()` is true."""
        from nmt.translation.batching import run_engine
        from nmt.search.options import SearchInputs

        src_ids = self.src_ids
        todo = [i for i in lines if src_ids[i]]
        out: dict[int, list[tuple]] = {i: [((), 0.0, 1, True)] for i in lines if not src_ids[i]}
        options = self.arm_options(arm)

        def search(batch: list[int]) -> list[list]:
            rows = [todo[j] for j in batch]
            inputs = SearchInputs(prefixes=[list(self.lang)] * len(rows) if self.lang else None,
                                  constraints=self.terms.batch(rows) if constrained else None)
            # the engine's precision, entered in this thread
            return self.engine.search([src_ids[i] for i in rows], options, inputs)

        for batch, nbests in run_engine(self.engine, search, [len(src_ids[i]) + 1 for i in todo], self.decode):
            if self.stop():
                raise Stopped
            for j, hyps in zip(batch, nbests):
                out[todo[j]] = [(tuple(h.tokens), h.log_prob, len(h.tokens) + h.finished, h.finished) for h in hyps]
        return out

    def texts(self, line: int, hyps: Sequence[tuple]) -> list[str]:
        """Detokenized outputs (protected spans restored), cached."""
        todo = [h[0] for h in hyps if (line, h[0]) not in self._texts]
        if todo:
            for tokens, text in zip(todo, self.engine.tokenizer.decode_tgt([list(t) for t in todo])):
                if self.spans[line]:
                    text = protect.restore(text, self.spans[line]).text
                self._texts[(line, tokens)] = textio.one_line(text)
        return [self._texts[(line, h[0])] for h in hyps]


def pick(hyps: Sequence[tuple], setting: Setting, terms: bool = False) -> tuple:
    """The hypothesis beam search returns under `setting`'s length penalty (greedy: the one there is);
    `terms`: a constrained search's, whose hypotheses that ended with EOS come first (nmt/search/beam.py)."""
    from nmt.search.options import length_penalty_factor

    if setting.beam_size == 1:
        return hyps[0]
    return max(hyps, key=lambda h: (terms and h[3], h[1] / length_penalty_factor(h[2], setting.length_penalty,
                                                                                setting.length_penalty_type)))


# --------------------------------------------------------------------------- the race

@dataclass
class TuneResult:
    best: Setting
    row: Row
    table: list[Row]
    lines: int
    seconds: float
    baseline: Row | None = None  # the checkpoint's own settings, where the search space holds them
    max_loops: float = MAX_LOOPS
    tgt_lang: str | None = None  # the language the dev set was decoded into (a multilingual model)
    glossary: list[Row] | None = None  # with a glossary: every (glossary beam, penalty) scored (`tune_glossary`)
    glossary_row: Row | None = None  # the best (its setting's beam and alpha; None: greedy, no penalty, no term line)

    def keys(self) -> dict:
        """The decode keys to write: the setting's, and where the glossary's were tuned glossary_beam_size and
        glossary_length_penalty (None where the setting's own won: they follow it)."""
        if self.glossary_row is None:
            return self.best.keys()
        g, own = self.glossary_row.setting, self.best
        return {**own.keys(), "glossary_beam_size": g.beam_size if g.beam_size != own.beam_size else None,
                "glossary_length_penalty": g.length_penalty if g.length_penalty != own.length_penalty else None}

    @property
    def within_limit(self) -> bool:
        """Whether the best setting's outputs loop on at most `max_loops` of the lines (else none did, and
        `best` is only the one that looped least)."""
        return self.row.loops <= self.max_loops

    def over_limit(self) -> str:
        """What `within_limit` false means, in words (for a one-line message)."""
        return (f"no setting kept looping outputs within {100 * self.max_loops:g}% of the lines: the fewest, with "
                f"{self.best.label()}, looped on {100 * self.row.loops:.1f}% of the {self.lines} dev lines")


class Race:
    """Successive halving over the arms (module docstring)."""

    def __init__(self, decoder: Decoder, scorer: Scorer, n_lines: int, max_time: float, max_loops: float,
                 log: Callable[[str], None], seed: int = 1):
        self.decoder, self.scorer, self.max_time, self.max_loops, self.log = decoder, scorer, max_time, max_loops, log
        self.order = list(range(n_lines))
        random.Random(seed).shuffle(self.order)
        self.outputs: dict[tuple[int, int], dict[int, list[tuple]]] = {}
        self.rate: dict[tuple[int, int], float] = {}  # seconds per line
        self.table: list[Row] = []

    def settings(self, arm: tuple[int, int]) -> list[Setting]:
        beam, ngram = arm
        if beam == 1:
            return [Setting(1, ngram)]
        return [Setting(beam, ngram, kind, alpha) for kind, alpha in PENALTIES]

    def evaluate(self, arm: tuple[int, int], size: int, round_: int) -> list[Row]:
        lines = self.order[:size]
        out = self.outputs[arm]
        rows = []
        for s in self.settings(arm):
            texts = [self.decoder.texts(i, [pick(out[i], s)])[0] for i in lines]
            score, bp, ratio, loop = self.scorer.score(lines, texts)
            rows.append(Row(round_, size, s, score, bp, ratio, loop))
        return rows

    def best(self, rows: Sequence[Row]) -> Row:
        """The highest score among rows within the loop limit (else the fewest loops)."""
        ok = [r for r in rows if r.loops <= self.max_loops]
        return max(ok, key=lambda r: r.score) if ok else min(rows, key=lambda r: (r.loops, -r.score))

    def run(self, arms: Sequence[tuple[int, int]]) -> tuple[Row, list[Row]]:
        """(the chosen row, every row of the winner's last round)."""
        t0, n = time.perf_counter(), len(self.order)
        arms, size, round_ = list(arms), min(FIRST_ROUND_LINES, n), 1
        last: dict[tuple[int, int], list[Row]] = {}
        while True:
            if round_ > 1:
                need = sum(self.rate[a] * (size - len(self.outputs[a])) for a in arms)
                if time.perf_counter() - t0 + need > self.max_time:
                    self.log(f"tune: stopping before round {round_} ({size} lines): about {need:.0f} s more would "
                             f"pass the {self.max_time:g} s budget")
                    break
            for arm in arms:
                done = self.outputs.setdefault(arm, {})
                new = [i for i in self.order[:size] if i not in done]
                t = time.perf_counter()
                done.update(self.decoder.run(arm, new))
                self.rate[arm] = (time.perf_counter() - t) / max(len(new), 1)
            scored = {arm: self.evaluate(arm, size, round_) for arm in arms}
            last = scored
            for arm in arms:
                row = self.best(scored[arm])
                self.table.append(row)
                self.log(_format_row(row))
            ranked = sorted(arms, key=lambda a: _rank_key(self.best(scored[a]), self.max_loops))
            if size >= n and len(arms) == 1:
                break
            arms = ranked[: max(1, math.ceil(len(arms) / 2))]
            size, round_ = min(2 * size, n), round_ + 1
        winner = min(last, key=lambda a: _rank_key(self.best(last[a]), self.max_loops))
        return self.best(last[winner]), last[winner]


def tune_glossary(race: Race, best: Row, constrain: str, log: Callable[[str], None]) -> list[Row]:
    """Every glossary_beam_size (the setting's beam size and twice it) and glossary_length_penalty (alpha of
    the setting's penalty type) scored on the chosen setting's dev lines with the glossary applied as
    `nmt translate` applies it (`constrain`), one constrained search per beam size; the other lines keep
    the setting's output. [] when there is nothing to tune."""
    setting, decoder = best.setting, race.decoder
    if setting.beam_size == 1 or setting.length_penalty_type == "none" or decoder.terms is None:
        return []
    arm, lines = (setting.beam_size, setting.no_repeat_ngram), race.order[:best.lines]
    picked = {i: pick(race.outputs[arm][i], setting) for i in lines}
    free = {i: decoder.texts(i, [picked[i]])[0] for i in lines}
    todo = [i for i in lines if decoder.terms.seqs[i]]
    if constrain == "missing":  # (held as translate checks it: the decoded tokens, protected spans masked)
        raw = decoder.engine.tokenizer.decode_tgt([list(picked[i][0]) for i in todo])
        todo = [i for i, text in zip(todo, raw) if not decoder.terms.held(i, text)]
    if not todo:
        return []
    rows = []
    for beam in (setting.beam_size, 2 * setting.beam_size):
        forced = decoder.run((beam, setting.no_repeat_ngram), todo, constrained=True)
        for kind, alpha in PENALTIES:
            if kind == setting.length_penalty_type:
                s = dataclasses.replace(setting, beam_size=beam, length_penalty=alpha)
                texts = [decoder.texts(i, [pick(forced[i], s, terms=True)])[0] if i in forced else free[i]
                         for i in lines]
                rows.append(Row(best.round, best.lines, s, *race.scorer.score(lines, texts)))
                log("glossary " + _format_row(rows[-1]))
    return rows


def _rank_key(row: Row, max_loops: float) -> tuple:
    """Sort key, best first: rows within the loop limit by score, then the others by loops."""
    return (0, -row.score) if row.loops <= max_loops else (1, row.loops, -row.score)


def _format_row(row: Row) -> str:
    bp = f"  BP {row.bp:.3f}  ratio {row.ratio:.3f}" if row.bp is not None else ""
    return (f"round {row.round}  {row.lines:>5} lines  {row.setting.label():<36}  score {row.score:6.2f}{bp}  "
            f"loops {100 * row.loops:4.1f}%")


# --------------------------------------------------------------------------- entry points

def tune(engine, src_lines: Sequence[str], ref_lines: Sequence[str], *, metric: str = "bleu", max_time: float = 600.0,
         max_loops: float = MAX_LOOPS, beams: Sequence[int] = BEAMS, ngrams: Sequence[int] = NGRAMS,
         log: Callable[[str], None] = print, stop: Callable[[], bool] = lambda: False,
         tgt_lang: str | None = None, src_lang: str | None = None, glossary=None) -> TuneResult:
    """Choose decode settings for `engine` (a TorchEngine) on these dev lines (module docstring). tgt_lang,
    src_lang: the dev set's languages where the model needs them (default: the engine's settings).
    glossary: with it, also `tune_glossary`. `stop()` is asked between batches and at the end: true
    raises `Stopped`. Check `within_limit` before using the result."""
    if metric not in ("bleu", "chrf"):
        raise UserError(f"unknown tuning metric {metric!r} (choose bleu or chrf)")
    if len(src_lines) != len(ref_lines):
        raise UserError(f"line counts differ: {len(src_lines)} source lines but {len(ref_lines)} references")
    if not src_lines:
        raise UserError("nothing to tune on: the dev set is empty")
    t0 = time.perf_counter()
    decode = dataclasses.replace(engine.decode, nbest=1, sampling=SamplingConfig(), alignment=False,
                                 tgt_lang=tgt_lang if tgt_lang is not None else engine.decode.tgt_lang,
                                 src_lang=src_lang if src_lang is not None else engine.decode.src_lang)
    race = Race(Decoder(engine, src_lines, decode, stop, glossary), Scorer(ref_lines, metric), len(src_lines),
                max_time, max_loops, log)
    arms = [(b, n) for b in beams for n in ngrams]
    best, final = race.run(arms)
    gloss = tune_glossary(race, best, decode.glossary.constrain, log) if glossary is not None else None
    if stop():  # (arrived while the last round was scored)
        raise Stopped
    own = Setting(decode.beam_size, decode.no_repeat_ngram, decode.length_penalty_type, decode.length_penalty)
    baseline = next((r for r in final if r.setting.keys() == own.keys()), None)
    return TuneResult(best.setting, best, race.table + final, best.lines, time.perf_counter() - t0, baseline,
                      max_loops, decode.tgt_lang, gloss, race.best(gloss) if gloss else None)


def apply_to_checkpoint(path: str, output: str, result: TuneResult, metric: str, src: str,
                        keys: dict | None = None) -> None:
    """Write `result`'s settings (`keys`: these instead) into the decode section of the checkpoint at `path`,
    saved to `output` (atomically; `output` may be `path`). Everything else is written back as it was read,
    but glossary_beam_size and glossary_length_penalty where `keys` does not set them and the setting
    changed (they were chosen for another one): they go back to null."""
    from nmt.model import checkpoint as ckpt

    state = ckpt.load_record(path, mmap=False)
    keys = dict(result.keys() if keys is None else keys)
    old = decode_config(state.config.get("decode", {}), {})
    write = dict(keys)
    if any(k in keys and keys[k] != getattr(old, k) for k in ("beam_size", "length_penalty_type", "length_penalty")):
        write = {"glossary_beam_size": None, "glossary_length_penalty": None, **keys}
    config = {**state.config, "decode": to_dict(decode_config({**to_dict(old), **write}))}  # (None values too)
    tuned = {"settings": keys, "metric": metric, "score": result.row.score, "dev": src,
             "lines": result.lines, "seconds": round(result.seconds, 1), "tgt_lang": result.tgt_lang,
             "table": [r.as_dict() for r in result.table],
             **({"glossary": [r.as_dict() for r in result.glossary]} if result.glossary is not None else {})}
    ckpt.save_checkpoint(dataclasses.replace(state, config=config, tuned=tuned), output)


def _at_own(result: TuneResult) -> str:
    """"; with the setting's own beam and penalty: SCORE" (the glossary rows hold it)."""
    own = next((r for r in result.glossary or [] if r.setting == result.best), None)
    return f"; with the setting's own: {own.score:.2f}" if own is not None else ""


def format_result(result: TuneResult, metric: str) -> str:
    """The table of the winner's last round (every penalty) and the choice."""
    name = "BLEU" if metric == "bleu" else "chrF2"
    lines = [f"tune: explored (best setting of each arm per round, then every penalty of the chosen arm on its "
             f"{result.lines} lines); {name}:"]
    lines += [_format_row(r) for r in result.table]
    own = f"; the checkpoint's settings: {result.baseline.score:.2f}" if result.baseline is not None else ""
    chose = f"tune: chose {result.best.label()} ({name} {result.row.score:.2f} on {result.lines} dev lines{own})"
    if result.glossary is not None:
        lines += ["glossary " + _format_row(r) for r in result.glossary]
        g = result.glossary_row
        chose += (f"; with the glossary, beam {g.setting.beam_size} and length penalty {g.setting.length_penalty:.1f}"
                  f" ({name} {g.score:.2f}"
                  f"{_at_own(result)})" if g is not None else "; with the glossary: nothing to tune (greedy, no "
                  "length penalty, or no dev line the constrained search takes)")
    lines.append(f"{chose} in {result.seconds:.0f} s")
    return "\n".join(lines)

"""`nmt.Translator`: the public Python API (CTranslate2's `Translator` is the model).

    from nmt import Translator

    translator = Translator("runs/quickstart/checkpoints/best.pt")   # or a CTranslate2 directory
    for result in translator.translate(["Hola mundo."], beam_size=5, nbest=2):
        print(result.text, result.score, [h.text for h in result.hypotheses])
    scores = translator.score(["Hola mundo."], ["Hello world."])      # forced decoding

One object, one call: the model, its engine, device and threads are fixed at construction;
`translate` takes per-call decode options (validated as `nmt translate`'s flags) and returns one
frozen `TranslationResult` per line, the same outputs as `nmt translate` (which goes through this
class, as `nmt evaluate`, `nmt score` and `nmt serve` do). Calls are thread-safe. PyTorch calls with one
decode worker made at once from several threads join their decoding steps (nmt/search/joining.py: the
sentences of a new call join the running searches between two steps, a short call's steps go first), so a
short call made while a long one runs is not held up until the long call ends (what `nmt serve` builds
on). The other calls compute one at a time in the process and share the machine step by step (`Turns`):
a CPU call with more than one decode worker (the default `workers` on a CPU with 2+ threads; pass
`workers=1` to join) keeps the turn to its end, since it changes torch's thread setting while it runs; a
CUDA-graphed call (PyTorch on CUDA) takes turns at its steps; a CTranslate2 call hands the turn on between
its batches only. Lines that arrive together are still faster in one call (one batch).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Set as AbstractSet
from numbers import Integral
from typing import Any, Callable, Sequence

from nmt import textio
from nmt.translation.batching import Progress, splits_threads
from nmt.config import DecodeConfig, decode_config
from nmt.translation.engine import check_decode, load_engine
from nmt.errors import UserError
from nmt.text.languages import check_source_language, contrast_tokens, target_prefix
from nmt.translation.line_terms import check as check_glossary
from nmt.translation.translate import TranslationResult, check_protect, encode_sources, translate_chunk


HEAD_START = 1.0  # `Turns`: a new call's time starts this many seconds below the virtual time (its head start)
POLL = 0.05  # `Turns`: seconds between two looks at a waiting call's `cancel`


class _Call:
    """A call's place in `Turns`: `event` set while it holds the turn; `used`, its claim (the lower the
    stronger): the seconds it held the turn, counted from where it started."""

    def __init__(self, used: float):
        self.event = threading.Event()
        self.used = used
        self.since = 0.0  # when it last took the turn, or counted its time


class Turns:
    """The turn to compute, shared by the calls of a process: one call holds it at a time, and at every
    decoding step (`turn()`'s hook) it goes to the waiting call that has used the least compute time, if that
    is less than the holder's. A call's time starts HEAD_START below the process' virtual time, which advances
    with the time computed, shared among the calls that want the turn (fair queuing), and never lags the
    least of their times: a short call made while a long one runs goes first and ends after about its own
    time, calls that have run longer share the machine evenly, and a stream of short calls cannot starve a
    long one. A call's threads share its turn. A waiting call whose `cancel()` turns true leaves the line
    within POLL seconds. `clock`: seconds."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._lock = threading.Lock()
        self._clock = clock
        self._holder: _Call | None = None  # the call computing now
        self._waiting: list[_Call] = []  # calls waiting for the turn
        self._virtual = 0.0  # advances with the time computed, shared among the calls that want the turn

    @contextlib.contextmanager
    def turn(self, cancel: Callable[[], bool] | None = None):
        """Around a call: waits for the turn, yields the hook its decoding steps call (True: `cancel()` said
        so, while it waited or now), passes the turn on at the end. nmt.errors.Cancelled when `cancel()` turns
        true before the call got the turn at all."""
        from nmt.errors import Cancelled

        me = _Call(0.0)
        try:
            with self._lock:  # (inside the try: an interrupt here leaves no dead call in line or holding the turn)
                me.used = max(0.0, self._virtual - HEAD_START)
                if self._holder is None:
                    self._give(me, self._clock())
                else:
                    self._waiting.append(me)
            if not self._wait(me, cancel):
                raise Cancelled()
            yield lambda: self._step(me, cancel)
        finally:
            with self._lock:
                if me in self._waiting:
                    self._waiting.remove(me)
                if self._holder is me:
                    me.event.clear()
                    self._holder = None
                    if self._waiting:
                        self._give(min(self._waiting, key=lambda c: c.used), self._clock())

    def _give(self, call: _Call, now: float) -> None:
        if call in self._waiting:
            self._waiting.remove(call)
        self._holder, call.since = call, now
        self._virtual = max(self._virtual, min(c.used for c in (call, *self._waiting)))
        call.event.set()

    def _wait(self, me: _Call, cancel: Callable[[], bool] | None) -> bool:
        """Wait until `me` holds the turn (True), or until `cancel()` says so while it waits (False: it left
        the line)."""
        while not me.event.wait(POLL if cancel is not None else None):
            if cancel():
                with self._lock:
                    if self._holder is not me:
                        if me in self._waiting:
                            self._waiting.remove(me)
                        return False
        return True

    def _step(self, me: _Call, cancel: Callable[[], bool] | None) -> bool:
        """A decoding step of call `me` is about to run: a waiting call that used less goes first. -> whether
        `cancel()` says to stop (called once, then while it waits)."""
        if cancel is not None and cancel():
            return True
        with self._lock:
            if self._holder is me:
                now = self._clock()
                spent = now - me.since
                me.used += spent
                me.since = now
                # virtual time advances by the time spent, shared among the calls that want the turn (fair
                # queuing), and never lags the least of their times: new calls cannot hold it back for ever
                self._virtual = max(self._virtual + spent / (1 + len(self._waiting)),
                                    min(c.used for c in (me, *self._waiting)))
                if self._waiting:
                    nxt = min(self._waiting, key=lambda c: c.used)
                    if nxt.used < me.used:
                        me.event.clear()
                        self._waiting.append(me)
                        self._give(nxt, now)
        # (at once while it holds the turn; another thread of the call may have given it away)
        return not self._wait(me, cancel)


_CALLS = Turns()  # the turn of every call in the process (module docstring)


class Translator:
    """A translation model ready to use: a checkpoint file (PyTorch) or a directory written by `nmt export`
    (CTranslate2), chosen by what `path` is unless `engine` says otherwise. device: "auto", "cpu", "cuda",
    "cuda:N". Keyword decode options replace the model's `decode` defaults for every call, checked before
    the model loads (ConfigError names every problem); `precision` (and CTranslate2's `workers`) are fixed here."""

    def __init__(self, path: str, *, engine: str = "auto", device: str = "auto", **decode_options: Any):
        given = decode_config(None, decode_options, check_rules=False)  # a bad option fails before any work
        workers = given.workers if decode_options.get("workers") is not None else None
        precision = given.precision if decode_options.get("precision") is not None else None
        self._engine = load_engine(path, engine, device, workers=workers, precision=precision)
        self.decode = self._checked(decode_config(self._engine.decode, decode_options))

    @property
    def engine(self) -> str:
        """"torch" or "ctranslate2"."""
        return self._engine.name

    @property
    def knows_placeholders(self) -> bool:
        """Whether the model was trained with data.protect (its vocabulary has the placeholders)."""
        from nmt.text import protect

        return protect.known_by(self._engine.tokenizer)

    def check_glossary(self, settings: DecodeConfig | None = None, glossary: Any = None) -> None:
        """UserError unless `translate(glossary=...)` can guarantee terms: this engine has constrained
        search (PyTorch; not CTranslate2), with `settings` they search greedily or by beam (not sampling),
        and the model can write every target term of `glossary` (a `nmt.text.glossary.Glossary`) exactly as
        given (`nmt.text.glossary.check_targets`: every entry, matched or not; once per glossary)."""
        check_glossary(self._engine, settings)
        if glossary is not None:
            from nmt.text.glossary import check_targets

            check_targets(glossary, self._engine.tokenizer, self._engine.max_positions)

    @property
    def max_positions(self) -> int:
        """The longest sequence (in subword tokens) the model accepts."""
        return self._engine.max_positions

    def decode_settings(self, **decode_options: Any) -> DecodeConfig:
        """This translator's decode settings with `decode_options` applied and validated."""
        return self._checked(decode_config(self.decode, decode_options)) if decode_options else self.decode

    def _checked(self, decode: DecodeConfig) -> DecodeConfig:
        self._engine.check_precision(decode.precision)
        if decode.protect:
            check_protect(self._engine.tokenizer)
        if decode.tgt_lang is not None:
            target_prefix(self._engine.tokenizer, decode.tgt_lang)  # an unknown (or needless) language fails now
        check_source_language(self._engine.tokenizer, decode.src_lang)
        contrast_tokens(self._engine.tokenizer, decode.contrast.lang, decode.tgt_lang, decode.contrast.weight)
        check_decode(self._engine, decode)  # settings an engine refuses (nmt/translation/ct2.py)
        return decode

    def check_language(self, settings: DecodeConfig | None = None, **decode_options: Any) -> None:
        """UserError unless the calls with these options (or `settings`, as `translate` takes them) have
        a target language to translate into (a multilingual model needs `tgt_lang` unless it has a
        default; nmt/text/languages.py) and a source language it knows (`src_lang`, where sources start with
        a language token)."""
        decode = self._given(settings, decode_options)
        target_prefix(self._engine.tokenizer, decode.tgt_lang)
        check_source_language(self._engine.tokenizer, decode.src_lang)
        contrast_tokens(self._engine.tokenizer, decode.contrast.lang, decode.tgt_lang, decode.contrast.weight)

    def translate(self, lines: Sequence[str], *, prefixes: Sequence[str] | None = None, first_line: int = 0,
                  line_numbers: Sequence[int] | None = None, on_batch: Progress | None = None,
                  cancel: Callable[[], bool] | None = None, settings: DecodeConfig | None = None,
                  glossary: Any = None, glossary_ignore_case: bool | None = None,
                  on_line: Callable[[int, TranslationResult], None] | None = None,
                  **decode_options: Any) -> list[TranslationResult]:
        """One result per line, in order (`result.text`, `.score`, `.hypotheses` for the n-best list,
        `.truncated`). `lines` (and `prefixes`) are ordered iterables of str: another type is a TypeError, a
        line break or lone surrogate in an item a ValueError, each naming the argument.
        prefixes: per line a target prefix the output must start with (may be ""). first_line: the input
        line number of lines[0], or line_numbers: each line's own (sampling: a line's samples depend only on
        the seed and its number). on_batch(n): called as n more lines are done. cancel(): checked at every
        decoding step; True stops the call with `nmt.errors.Cancelled`. settings: what `decode_settings`
        returned, instead of decode_options. glossary: `[(source term, target term), ...]` or a `Glossary`:
        every output holds the target term of each entry whose source term is in its line (PyTorch engine;
        glossary_ignore_case for a list); every target term is checked first (`check_glossary`).
        on_line(i, result): lines[i]'s result as soon as it is final (its sentence done: before the call
        returns, in any order, from a decoding thread: with several decode workers or parallel steps, from several
        at once), once per line; the list returned holds the same."""
        lines = _texts(lines, "lines")
        glossary = _glossary(glossary, glossary_ignore_case)
        if glossary is not None:
            self.check_glossary(glossary=glossary)  # every entry, before any work
        prefixes = _texts(prefixes, "prefixes") if prefixes is not None else None
        line_numbers = _line_numbers(line_numbers) if line_numbers is not None else None
        decode = self._given(settings, decode_options)
        for name, given in (("prefixes", prefixes), ("line numbers", line_numbers)):
            if given is not None and len(given) != len(lines):
                raise UserError(f"{len(given)} {name} for {len(lines)} lines")
        with self._sharing(decode, cancel) as (engine, at_step):
            return translate_chunk(engine, lines, decode, on_batch, first_line=first_line, prefixes=prefixes,
                                   line_numbers=line_numbers, cancel=at_step, glossary=glossary, on_line=on_line)

    @contextlib.contextmanager
    def _sharing(self, decode: DecodeConfig, cancel: Callable[[], bool] | None):
        """Around a call with settings `decode`: (the engine it searches with, the hook its decoding steps call)
        as it shares the machine with calls from other threads (module docstring): the joined engine, whose
        steps join theirs; else this engine with its turn (`Turns`), handed on at every step where the call
        `shares_steps`, else kept to its end."""
        shares = self.shares_steps(decode)
        joined = self._engine.joined() if shares else None
        if joined is not None:
            yield joined, cancel
            return
        with _CALLS.turn(cancel) as step:
            yield self._engine, (step if shares else cancel)

    def shares_steps(self, settings: DecodeConfig | None = None) -> bool:
        """Whether calls with these settings (what `decode_settings` returned; default this Translator's) share
        the machine step by step with calls from other threads (module docstring: joined steps or turns). False
        for a CPU call with more than one decode worker: it splits torch's threads among them (`splits_threads`),
        a process-wide setting, so it keeps the turn from its start to its end."""
        return not splits_threads(self._engine, settings if settings is not None else self.decode)

    def parallel_steps(self, steps: int) -> bool:
        """Let up to `steps` joined decoding steps of this Translator's calls run at once, each in its own call's
        thread (nmt.search.joining's `StepPool`; `nmt serve`, whose threads compute on one of torch's CPU threads
        each); a long call is then searched in up to `steps` parts at once, each in a thread of its own and of
        more than half a joined step's rows. False, and nothing changes, where its calls cannot join on CPU
        (CTranslate2, a GPU)."""
        device = getattr(self._engine, "torch_device", None)
        if device is None or device.type != "cpu" or self._engine.joined() is None:
            return False
        self._engine.steps.parallel = steps
        return True

    def step_counts(self) -> dict[str, int] | None:
        """The decoding steps this Translator's joined calls ran (module docstring; None: CTranslate2): `steps`
        forward passes, `joined` those that served more than one search, `rows` the rows they decoded, and
        `running_rows` the rows of the searches running now."""
        pool = getattr(self._engine, "steps", None)
        return None if pool is None else {"steps": pool.steps, "joined": pool.joined, "rows": pool.rows,
                                          "running_rows": pool.running_rows}

    def source_tokens(self, lines: Sequence[str], settings: DecodeConfig | None = None) -> list[int]:
        """Per line the tokens the model reads for it (its subwords, cut to max_positions - 1, and EOS): its
        share of a batch (`nmt serve --max-batch-tokens`). settings: as for `translate` (the source language)."""
        decode = self._given(settings, {})
        return [len(ids) + 1 for ids in encode_sources(self._engine, _texts(lines, "lines"), decode.src_lang)[0]]

    def score(self, sources: Sequence[str], targets: Sequence[str], *, on_batch: Progress | None = None,
              **decode_options: Any) -> list:
        """The model's log-probability of each target given its source (`nmt score`): one
        `nmt.translation.score.PairScore` per pair, in order. Only `nmt score`'s decode options matter (batching,
        tgt_lang, src_lang, protect, protect_pattern). `sources` and `targets` are checked as `lines` are."""
        from nmt.translation.score import score_pairs

        sources, targets = _texts(sources, "sources"), _texts(targets, "targets")
        decode = self.decode_settings(**decode_options)
        with _CALLS.turn():
            return score_pairs(self._engine, sources, targets, decode, on_batch)


    def _given(self, settings: DecodeConfig | None, decode_options: dict) -> DecodeConfig:
        """The settings of a call: `settings` (validated by `decode_settings` already), else decode_options
        applied and validated."""
        if settings is None:
            return self.decode_settings(**decode_options)
        if not isinstance(settings, DecodeConfig) or decode_options:
            raise TypeError("settings must be a DecodeConfig from decode_settings(), given without decode options")
        return settings


def _items(value: Any, name: str, what: str) -> list:
    """`value` as a list: a one-line TypeError naming the argument for one str or bytes (its characters would
    be taken for lines), a mapping or a set (keys, in no set order), or anything not iterable."""
    if isinstance(value, (str, bytes, Mapping, AbstractSet)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list of {what}, one per line, not a {type(value).__name__}"
                        + (" (for one line: [text])" if isinstance(value, str) and what == "strings" else ""))
    return list(value)


def _texts(value: Any, name: str) -> list[str]:
    """`value` (any ordered iterable of str) as a list; a one-line TypeError naming the argument when it is
    not one (`_items`) or holds something else than str, a ValueError naming the item for a line break
    ("\\n", "\\r": one line per item, as the server refuses it) or a lone surrogate (not Unicode text)."""
    texts = _items(value, name, "strings")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a string, not {type(text).__name__}")
        if "\n" in text or "\r" in text:
            raise ValueError(f"{name}[{i}] contains a line break (one line per item)")
        bad = textio.lone_surrogate(text)
        if bad:
            raise ValueError(f"{name}[{i}] is not Unicode text: {bad}")
    return texts


def _line_numbers(value: Any) -> list[int]:
    """`line_numbers` as a list of int; a one-line TypeError naming the argument or its item otherwise."""
    given = _items(value, "line_numbers", "ints")
    for i, n in enumerate(given):
        if not isinstance(n, Integral) or isinstance(n, bool):
            raise TypeError(f"line_numbers[{i}] must be an int, not {type(n).__name__}")
    return [int(n) for n in given]


def _glossary(glossary: Any, ignore_case: bool | None):
    """A compiled `Glossary` from the API's forms (None stays None): a Glossary as it is (`ignore_case`
    None or its own), else a list of [source, target] pairs (`check_entries`: one-line UserError naming
    the bad item) compiled with `ignore_case` (None: False)."""
    from nmt.text.glossary import Glossary, check_entries

    if ignore_case is not None and not isinstance(ignore_case, bool):
        raise TypeError(f"glossary_ignore_case must be True or False, got {ignore_case!r:.40}")
    if glossary is None or isinstance(glossary, Glossary):
        if isinstance(glossary, Glossary) and ignore_case not in (None, glossary.ignore_case):
            raise UserError("glossary_ignore_case: the Glossary was compiled with ignore_case="
                            f"{glossary.ignore_case}")
        return glossary
    return Glossary(check_entries(glossary), bool(ignore_case))

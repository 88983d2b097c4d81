"""SentencePiece tokenization: train or load, encode, decode, serialize.

Every model used by nmt has the same fixed special ids (checked on load):
PAD_ID = 0, UNK_ID = 1, BOS_ID = 2, EOS_ID = 3 (`Tokenizer.specials`, nmt/layout.py).
SentencePiece adds none of them while encoding; nmt/layout.py adds EOS to sources
and BOS/EOS to targets.

A run directory holds `spm.model` (joint) or `spm.src.model` + `spm.tgt.model`,
and `spm.json`: the settings they were made with (`tokenizer_settings`: the
`data.tokenizer` section without `threads`, the seed, the source tags and the
fingerprints of the training corpora or of the loaded model files).
`build_tokenizer` (a run without a checkpoint) reuses those files only when
the settings are equal, else it loads the configured `.model` files or trains
new models on the training corpora (and says why in one log line).

Training is deterministic and streams the text: a first pass counts the
non-empty sentences, `sample_indices` picks a seeded sample of at most
`max_sentences` of them (the same draw as picking from an in-memory list), and
a second pass feeds just those sentences to SentencePiece; its own generator
is seeded as well. Source tags (`data.train[i].src_tag`, e.g. `<BT>`) become
user-defined symbols `▁<BT>` (with SentencePiece's word-start mark, so that
"<BT> hola" encodes to the tag's id first): always exactly one token. A model trained with
`data.terms > 0` gets the term annotation markers `<term>` and `</term>` (nmt/text/terms.py) the same
way, `▁<term>` and `▁</term>`, in both models (as the placeholders of `data.protect`).

A multilingual model (training corpora with several target languages) gets one symbol
per target language, `__de__`, `__pt_BR__` (`language_symbol`), in the target model, and
`Tokenizer.languages` maps each code to its id (nmt/text/languages.py). They are SentencePiece
*control* symbols: like `<s>` and `</s>`, they have an id but are never matched in input
text, so a text that contains `__de__` encodes as ordinary pieces and cannot produce a
language token (a user-defined symbol would be cut out of any text that contains it);
nmt puts the token in by id (training targets, the forced first target token).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from nmt import textio
from nmt.config import Config, TokenizerConfig, to_dict
from nmt.errors import UserError
from nmt.layout import BOS_ID, EOS_ID, NMT_SPECIALS, PAD_ID, UNK_ID
from nmt.text.protect import PLACEHOLDERS
from nmt.text.terms import TERM_SYMBOLS
from nmt.text.tokens import WORD_START, load_sentencepiece

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer", "build_tokenizer", "check_tags", "language_symbol",
           "read_model_file", "tag_symbol", "train_sentencepiece", "train_tags", "tokenizer_settings", "with_languages"]
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))  # dropped by decode (UNK is kept)
JOINT_FILE, SRC_FILE, TGT_FILE, SETTINGS_FILE = "spm.model", "spm.src.model", "spm.tgt.model", "spm.json"
IMPORTED_FILE = "hf_tokenizer.json"  # marks an imported tokenizer's files (nmt/text/hf_tokenizer.py), which `load` prefers


def _processor(proto: bytes, name: str) -> spm.SentencePieceProcessor:
    """A processor from a serialized model; UserError naming `name` if invalid or without nmt's special ids."""
    sp = load_sentencepiece(proto, name)
    found = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise UserError(
            f"{name}: SentencePiece special ids are pad={found[0]} unk={found[1]} bos={found[2]} "
            f"eos={found[3]}, but nmt needs pad=0 unk=1 bos=2 eos=3 "
            "(retrain with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)")
    return sp


def read_model_file(path: str) -> bytes:
    """The bytes of a `.model` file, checked to be a model with nmt's special ids."""
    if not os.path.isfile(path):
        raise UserError(f"SentencePiece model not found: {path}")
    with open(path, "rb") as f:
        proto = f.read()
    _processor(proto, path)
    return proto


class Tokenizer:
    """One joint or two (source, target) SentencePiece models: nmt.text.tokens.TokenizerLike of kind "spm".

    Encoding returns subword ids without specials; decoding drops PAD/BOS/EOS and the language tokens.
    `threads` is the number of threads SentencePiece uses for batch encoding.
    """

    kind = "spm"
    specials = NMT_SPECIALS  # the ids of every SentencePiece model nmt uses (checked on load)
    free_language_token = False  # a multilingual model trained here learns its language token (nmt/text/languages.py)
    source_languages = False  # no source-language token (nmt/text/languages.py)

    def __init__(self, src_proto: bytes, tgt_proto: bytes | None = None, *, threads: int = 1,
                 languages: dict[str, int] | None = None, default_tgt_lang: str | None = None):
        """languages: a multilingual model's target languages, {code: id of its language token in the
        target vocabulary} (nmt/text/languages.py); default_tgt_lang: the one used when none is asked for."""
        self.languages, self.default_tgt_lang = dict(languages or {}), default_tgt_lang
        self._drop = SPECIAL_IDS | frozenset(self.languages.values())
        self.joint = tgt_proto is None
        self._src_proto, self._tgt_proto = src_proto, tgt_proto
        self._src = _processor(src_proto, "source SentencePiece model" if tgt_proto else "SentencePiece model")
        self._tgt = self._src if tgt_proto is None else _processor(tgt_proto, "target SentencePiece model")
        self.threads = threads

    @property
    def src_vocab_size(self) -> int:
        return self._src.vocab_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self._tgt.vocab_size()

    def encode_src(self, lines: list[str], src_lang: str | None = None) -> list[list[int]]:
        """Source sentences -> subword ids (no BOS/EOS). nmt's models carry no source language: src_lang
        changes nothing."""
        return self._src.encode(list(lines), out_type=int, num_threads=self.threads)

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        """Target sentences -> subword ids (no BOS/EOS)."""
        return self._tgt.encode(list(lines), out_type=int, num_threads=self.threads)

    def decode_tgt(self, ids: Iterable[Iterable[int]]) -> list[str]:
        """Target ids (lists, arrays or 1-D tensors) -> text; PAD, BOS, EOS and language tokens are ignored."""
        clean = [[int(i) for i in seq if int(i) not in self._drop] for seq in ids]
        return self._tgt.decode(clean) if clean else []

    def is_target_symbol(self, text: str) -> bool:
        """True when `text` alone encodes to one known piece of the source and the target models (a
        SentencePiece user-defined symbol, such as a placeholder; with a `word` model, the piece of
        the whitespace-separated word)."""
        def one_piece(sp: spm.SentencePieceProcessor) -> bool:
            pieces = [p for p in sp.encode(text, out_type=str) if p != WORD_START]
            return len(pieces) == 1 and pieces[0] in (text, WORD_START + text) and sp.piece_to_id(pieces[0]) != UNK_ID
        return one_piece(self._src) and one_piece(self._tgt)

    def target_piece_id(self, piece: str) -> int | None:
        """The id of `piece` in the target model, or None when the model has no such piece."""
        i = self._tgt.piece_to_id(piece)
        return None if i == UNK_ID and piece != self._tgt.id_to_piece(UNK_ID) else i

    def src_pieces(self, line: str) -> list[str]:
        """Source subword pieces of one line (for inspection and logs)."""
        return self._src.encode(line, out_type=str)

    def vocab_pieces(self) -> tuple[list[str], list[str]]:
        """(source, target) piece of every id, in id order (the CTranslate2 export's vocabularies)."""
        return ([self._src.id_to_piece(i) for i in range(self._src.get_piece_size())],
                [self._tgt.id_to_piece(i) for i in range(self._tgt.get_piece_size())])

    def to_bytes(self) -> dict:
        """Serialized models for a checkpoint: {'joint', 'src', 'tgt'} (tgt None when joint), and
        'languages' / 'default_tgt_lang' for a multilingual model."""
        out = {"joint": self.joint, "src": self._src_proto, "tgt": self._tgt_proto}
        if self.languages:
            out.update(languages=dict(self.languages), default_tgt_lang=self.default_tgt_lang)
        return out

    @classmethod
    def from_bytes(cls, d: dict, *, threads: int = 1) -> "Tokenizer":
        """The tokenizer of a checkpoint's entry (`to_bytes` of either family), the one reader of its kind:
        nmt's SentencePiece models (an entry without one), or the imported adapter it names."""
        languages, default = d.get("languages"), d.get("default_tgt_lang")
        if "kind" not in d or d["kind"] == cls.kind:
            return cls(d["src"], None if d["joint"] else d["tgt"], threads=threads, languages=languages,
                       default_tgt_lang=default)
        from nmt.text.hf_tokenizer import KINDS

        if d["kind"] not in KINDS:
            raise UserError(f"unknown tokenizer kind {d['kind']!r} in the checkpoint (known: spm, {', '.join(KINDS)})")
        return KINDS[d["kind"]](d["files"], d["settings"], threads=threads, languages=languages, default_tgt_lang=default)

    def save(self, run_dir: str, settings: dict | None = None) -> None:
        """Write spm.model (joint) or spm.src.model + spm.tgt.model into run_dir, then `settings` as spm.json.

        Each file is written atomically (`textio.write_file`). spm.json, an imported tokenizer's
        hf_tokenizer.json and the other layout's model files are removed first and spm.json is
        written last, so a model is never described by older settings.
        """
        os.makedirs(run_dir, exist_ok=True)
        files = [(JOINT_FILE, self._src_proto)] if self.joint else \
            [(SRC_FILE, self._src_proto), (TGT_FILE, self._tgt_proto)]
        stale = [SETTINGS_FILE, IMPORTED_FILE] + sorted({JOINT_FILE, SRC_FILE, TGT_FILE} - {name for name, _ in files})
        for name in stale:  # first: the settings, and the other layout's models (load prefers spm.model)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(run_dir, name))
        for name, data in files + ([(SETTINGS_FILE, json.dumps(settings, indent=1).encode())] if settings else []):
            textio.write_file(os.path.join(run_dir, name), data)

    @classmethod
    def load(cls, run_dir: str, *, threads: int = 1) -> "Tokenizer | None":
        """The tokenizer saved in run_dir (nmt's SentencePiece models, or an imported tokenizer's files
        with hf_tokenizer.json), or None if it holds none."""
        from nmt.text import hf_tokenizer

        imported = hf_tokenizer.read_saved(run_dir)
        if imported is not None:
            return cls.from_bytes(imported, threads=threads)
        joint, src, tgt = (os.path.join(run_dir, n) for n in (JOINT_FILE, SRC_FILE, TGT_FILE))
        if os.path.isfile(joint):
            return cls(read_model_file(joint), threads=threads)
        if os.path.isfile(src) and os.path.isfile(tgt):
            return cls(read_model_file(src), read_model_file(tgt), threads=threads)
        return None




def tag_symbol(tag: str) -> str:
    """The user-defined SentencePiece symbol of a source tag: "<BT>" -> "▁<BT>"."""
    return WORD_START + tag


def language_symbol(code: str) -> str:
    """The target-language token of a multilingual model: "de" -> "__de__" (a control symbol: module docstring)."""
    return f"__{code}__"


def with_languages(tokenizer: Tokenizer, codes: Sequence[str], model: str) -> Tokenizer:
    """`tokenizer` with `Tokenizer.languages` = {code: id of `language_symbol(code)`} (no default language);
    UserError naming `model` when its target model lacks a symbol."""
    ids = {code: tokenizer.target_piece_id(language_symbol(code)) for code in codes}
    missing = [language_symbol(c) for c, i in ids.items() if i is None]
    if missing:
        raise UserError(f"the target SentencePiece model {model} has no language token {', '.join(missing)} for the "
                        f"target languages of data.train; train it with control_symbols={','.join(missing)} or let "
                        "nmt train the tokenizer")
    return Tokenizer.from_bytes({**tokenizer.to_bytes(), "languages": ids, "default_tgt_lang": None},
                                threads=tokenizer.threads)


def check_tags(tokenizer: Tokenizer, tags: Sequence[str], model: str) -> None:
    """UserError unless every tag encodes to exactly one known source token (`model` names the model)."""
    for tag in tags:
        ids = tokenizer.encode_src([tag])[0]
        if len(ids) != 1 or ids[0] == tokenizer.specials.unk:
            pieces = ", ".join(repr(p) for p in tokenizer.src_pieces(tag))
            raise UserError(f"src_tag {tag} is not one token of the source SentencePiece model {model} "
                            f"(it encodes to {pieces}); train that model with user_defined_symbols={tag_symbol(tag)} "
                            "or let nmt train the tokenizer")


# --------------------------------------------------------------------------- training

def sample_indices(n: int, max_sentences: int, seed: int) -> np.ndarray | None:
    """Sorted positions [m] int64 of a seeded sample of max_sentences among n sentences; None = all."""
    if n <= max_sentences:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, max_sentences, replace=False))


def iter_sample(lines: Iterable[str], keep: np.ndarray | None) -> Iterator[str]:
    """The non-empty lines whose position among the non-empty lines is in `keep` (sorted; None = all)."""
    nonempty = (x for x in lines if x)
    if keep is None:
        yield from nonempty
        return
    wanted = iter(keep.tolist())
    target = next(wanted, None)
    for i, line in enumerate(nonempty):
        if target is None:
            return  # past the last chosen line: stop reading
        if i == target:
            yield line
            target = next(wanted, None)


def train_sentencepiece(lines: Sequence[str] | Callable[[], Iterable[str]], tok: TokenizerConfig, *, seed: int,
                        what: str, log: Callable[[str], None] = print, symbols: Sequence[str] = (),
                        count: int | None = None, control: Sequence[str] = (),
                        advice: str = "change data.tokenizer.vocab_size / character_coverage") -> bytes:
    """Train one model on a seeded sample of `lines`; returns the serialized model.

    `lines` is a list, or a function that returns a fresh iterator over the
    text each time it is called (streaming: one pass to count the non-empty
    lines unless `count` gives their number, one to feed the sample, another
    if training is retried). The sample is the same either way. `symbols` are
    user-defined symbols (source tags), `control` control symbols (language tokens). `what` names the model in messages
    ("joint", "source", "target"). If the corpus is too small for
    `tok.vocab_size`, retrains with a soft vocabulary limit (a smaller
    vocabulary) and logs it. `advice` ends the one-line error when training fails.
    """
    stream = (lambda: iter(lines)) if not callable(lines) else lines
    n = count if count is not None else sum(1 for x in stream() if x)
    keep = sample_indices(n, tok.max_sentences, seed)
    size = n if keep is None else len(keep)
    if not size:
        raise UserError(f"cannot train the {what} SentencePiece model: the training corpus has no text")
    options = dict(
        vocab_size=tok.vocab_size, model_type=tok.model_type,
        character_coverage=tok.character_coverage, num_threads=tok.threads,
        input_sentence_size=tok.max_sentences, shuffle_input_sentence=True,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        minloglevel=2,  # errors only: no training chatter on stderr
    )
    if symbols:
        options["user_defined_symbols"] = list(symbols)
    if control:
        options["control_symbols"] = list(control)

    def run(**extra) -> bytes:
        spm.set_random_generator_seed(seed)
        out = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter_sample(stream(), keep), model_writer=out,
                                       **options, **extra)
        return out.getvalue()

    try:
        try:
            proto = run()
        except RuntimeError as e:
            if "Vocabulary size too high" not in str(e):
                raise
            proto = run(hard_vocab_limit=False)
            got = spm.SentencePieceProcessor(model_proto=proto).vocab_size()
            log(f"tokenizer: vocab_size {tok.vocab_size} is too large for this corpus; "
                f"the {what} model has {got} pieces")
    except RuntimeError as e:
        reason = str(e).split("] ")[-1].strip().replace("\n", " ")
        raise UserError(f"SentencePiece could not train the {what} model on {size} sentences: "
                        f"{reason} ({advice})") from None
    return proto


# --------------------------------------------------------------------------- the run's tokenizer

def train_tags(cfg: Config) -> list[str]:
    """The distinct source tags of the training corpora, in order."""
    return list(dict.fromkeys(c.src_tag for c in cfg.data.train_corpora if c.src_tag))


def tokenizer_settings(cfg: Config) -> dict:
    """What a run's tokenizer depends on (saved as spm.json): reuse it only when this is equal."""
    from nmt.text.sources import file_fingerprint, source_fingerprint  # local: the tokenizer alone needs no data code

    tok, d = cfg.data.tokenizer, cfg.data
    section = {k: v for k, v in to_dict(tok).items() if k not in ("threads", "add_pieces")}  # (add_pieces: nmt/training/grow/)
    if tok.model or tok.src_model:
        sources = [file_fingerprint(p) for p in (tok.model, tok.src_model, tok.tgt_model) if p]
    else:
        sources = [source_fingerprint(c, *d.langs(c)) for c in d.train_corpora]
    languages = {"languages": list(d.target_languages)} if d.multilingual else {}  # (absent: bilingual, as before)
    terms = {"terms": True} if d.terms > 0 else {}  # (absent: without term markers, as before)
    return {"tokenizer": section, "seed": cfg.seed, "tags": train_tags(cfg), "sources": sources,
            "protect": cfg.data.protect, **languages, **terms}


def _stale_reason(run_dir: str, settings: dict) -> str | None:
    """Why the model saved in run_dir cannot be reused (None: it can)."""
    try:
        with open(os.path.join(run_dir, SETTINGS_FILE), encoding="utf-8") as f:
            saved = json.load(f)
    except FileNotFoundError:
        return f"it has no settings file {SETTINGS_FILE}"
    except (OSError, ValueError):
        return f"its settings file {SETTINGS_FILE} is unreadable"
    if saved == settings:
        return None
    if not isinstance(saved, dict):
        saved = {}
    names = {"seed": "seed", "tags": "data.train src_tag", "sources": "the training corpora or model files",
             "protect": "data.protect", "languages": "the target languages of data.train", "terms": "data.terms"}
    diff = [f"data.tokenizer.{k}" for k in settings["tokenizer"]
            if saved.get("tokenizer", {}).get(k) != settings["tokenizer"][k]]
    diff += [names[k] for k in names if saved.get(k) != settings.get(k)]
    return "it was made with other settings (" + (", ".join(diff) or "format") + ")"


def _count_nonempty(cfg: Config) -> list[tuple[int, int]]:
    """Per training corpus: (non-empty source lines, non-empty target lines); checks alignment."""
    from nmt.text.sources import iter_pairs

    d = cfg.data
    counts = []
    for c in d.train_corpora:
        n_src = n_tgt = 0
        for src, tgt in iter_pairs(c, *d.langs(c)):
            n_src += sum(1 for x in src if x)
            n_tgt += sum(1 for x in tgt if x)
        counts.append((n_src, n_tgt))
    return counts


def _train(cfg: Config, log: Callable[[str], None]) -> Tokenizer:
    """Train the run's model(s) on the training corpora, streaming (tags are not part of the text)."""
    from nmt.text.sources import iter_side

    d, tok = cfg.data, cfg.data.tokenizer
    counts = _count_nonempty(cfg)
    languages = [language_symbol(code) for code in d.target_languages] if d.multilingual else []

    def side(s: str) -> Callable[[], Iterator[str]]:
        return lambda: itertools.chain.from_iterable(iter_side(c, s, *d.langs(c)) for c in d.train_corpora)
    placeholders = list(PLACEHOLDERS) if d.protect else []  # plain symbols: a span may touch a word
    placeholders += [tag_symbol(t) for t in TERM_SYMBOLS] if d.terms > 0 else []  # after a space, as tags
    symbols = [tag_symbol(t) for t in train_tags(cfg)] + placeholders
    n_src, n_tgt = sum(a for a, _ in counts), sum(b for _, b in counts)
    train = lambda lines, what, sym, n, control=(): train_sentencepiece(lines, tok, seed=cfg.seed, what=what, log=log,
                                                                        symbols=sym, count=n, control=control)
    if tok.joint:  # the stream is all source lines, then all target lines
        both = lambda: itertools.chain(side("src")(), side("tgt")())
        return Tokenizer(train(both, "joint", symbols, n_src + n_tgt, languages), threads=tok.threads)
    return Tokenizer(train(side("src"), "source", symbols, n_src),
                     train(side("tgt"), "target", placeholders, n_tgt, languages), threads=tok.threads)


def build_tokenizer(cfg: Config, run_dir: str, log: Callable[[str], None] = print) -> Tokenizer:
    """The tokenizer of a run without a checkpoint: reuse run_dir's models when made with the same
    settings (`tokenizer_settings`), else load the configured files or train, and save into run_dir."""
    tok = cfg.data.tokenizer
    settings = tokenizer_settings(cfg)
    found = Tokenizer.load(run_dir, threads=tok.threads)
    if found is not None:
        why = _stale_reason(run_dir, settings)
        if why is None:
            log(f"tokenizer: loaded from {run_dir} (vocab src {found.src_vocab_size}, tgt {found.tgt_vocab_size})")
            return _languages(cfg, found, run_dir)
        log(f"tokenizer: not reusing the model in {run_dir}: {why}; making a new one")
    if tok.model or tok.src_model:
        if tok.joint:
            result = Tokenizer(read_model_file(tok.model), threads=tok.threads)
        else:
            result = Tokenizer(read_model_file(tok.src_model), read_model_file(tok.tgt_model), threads=tok.threads)
        check_tags(result, train_tags(cfg), tok.model or tok.src_model)
        if cfg.data.protect and not all(result.is_target_symbol(p) for p in PLACEHOLDERS):
            raise UserError(f"data.protect needs the placeholder tokens {PLACEHOLDERS[0]} ... {PLACEHOLDERS[-1]} as "
                            f"user-defined symbols of {tok.model or tok.src_model} (train it with them, or let nmt "
                            "train the tokenizer)")
        if cfg.data.terms > 0 and not all(result.is_target_symbol(t) for t in TERM_SYMBOLS):
            raise UserError(f"data.terms needs the term markers {' and '.join(TERM_SYMBOLS)} as user-defined symbols "
                            f"{', '.join(tag_symbol(t) for t in TERM_SYMBOLS)} of {tok.model or tok.src_model} and its "
                            "target model (train it with them, or let nmt train the tokenizer)")
        log(f"tokenizer: loaded {tok.model or (tok.src_model + ', ' + tok.tgt_model)}")
    else:
        result = _train(cfg, log)
        log(f"tokenizer: trained {tok.model_type} ({'joint' if tok.joint else 'separate'}), "
            f"vocab src {result.src_vocab_size}, tgt {result.tgt_vocab_size}")
    result = _languages(cfg, result, tok.model or tok.tgt_model or "trained by nmt")
    result.save(run_dir, settings)
    return result


def _languages(cfg: Config, tokenizer: Tokenizer, model: str) -> Tokenizer:
    """A multilingual model's tokenizer with its target languages (`with_languages`); else unchanged."""
    return with_languages(tokenizer, cfg.data.target_languages, model) if cfg.data.multilingual else tokenizer

"""The tokenizers of Hugging Face MarianMT, M2M100 and NLLB models, without transformers.

Each adapter reads the tokenizer files of a model directory with sentencepiece and json only and
gives the ids transformers 5's own tokenizer gives (tests/test_hf_import.py compares them), behind
the interface `nmt.text.tokens.TokenizerLike` that nmt's own `nmt.text.tokenizer.Tokenizer` implements too
(encode_src, encode_tgt, decode_tgt, specials, languages, default_tgt_lang, vocabulary sizes,
to_bytes / save, vocab_pieces, ...); `read_saved` reads back what `save` wrote. Which ids
mean what (transformers' `tokenization_marian.py`, `tokenization_m2m_100.py`, `tokenization_nllb.py`):

- `marian` (OPUS-MT): source.spm and target.spm cut the text into pieces, vocab.json (one
  vocabulary for both sides; target_vocab.json with `separate_vocabs`) maps a piece to its id,
  `<unk>` for pieces it lacks. eos `</s>` = 0, unk 1, pad = the last id = the decoder start. A
  source may begin with a target-language token `>>xx<<` (multilingual OPUS models): kept as one
  token. Outputs are decoded with the source model when the vocabulary is shared (as transformers).
- `m2m100`: sentencepiece.bpe.model + vocab.json (fairseq dictionary: `<s>` 0, `<pad>` 1, `</s>` 2,
  `<unk>` 3, then pieces); language tokens `__xx__` follow at len(vocab.json) + their index in the
  model's code list, then `num_madeup_words` unused ids. The source is `__src__ pieces </s>`.
- `nllb`: sentencepiece.bpe.model alone; a piece's id is its SentencePiece id + 1 (fairseq's
  offset; SentencePiece's `<unk>` 0 -> 3), language tokens (`eng_Latn`, ...) follow at
  sp_size + 1 + their index (or the ids tokenizer.json gives them), then `<mask>`. Source
  `src_Lang pieces </s>` (transformers 5's default, non-legacy layout). Pieces nmt/training/grow/ appended
  to the SentencePiece model come after every other id (`added_pieces`: read back from tokenizer.json).

The target language of M2M100/NLLB is nmt/text/languages.py's mechanism: `languages` maps every code to
its token, forced as the first target token (Hugging Face's `forced_bos_token_id`); the decoder
starts from `</s>`. An empty line encodes to no ids (no language token), so it stays empty.
Decoding drops what transformers' `decode(skip_special_tokens=True)` drops (`<unk>` too) and, always,
the language tokens.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable

import sentencepiece as spm

from nmt import textio
from nmt.errors import UserError
from nmt.text.languages import check_source_language
from nmt.layout import Specials
from nmt.text.tokens import WORD_START, load_sentencepiece

SETTINGS_FILE = "hf_tokenizer.json"  # written by `save`: the kind and settings of the files beside it (= tokenizer.IMPORTED_FILE)
M2M100_CODES = {
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi "
               "hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc "
               "or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"),
    "wmt21": "en ha is ja cs ru zh de",
}
NLLB_CODES = (
    "ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn amh_Ethi apc_Arab arb_Arab ars_Arab "
    "ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn azb_Arab azj_Latn bak_Cyrl bam_Latn ban_Latn bel_Cyrl "
    "bem_Latn ben_Beng bho_Deva bjn_Arab bjn_Latn bod_Tibt bos_Latn bug_Latn bul_Cyrl cat_Latn ceb_Latn ces_Latn "
    "cjk_Latn ckb_Arab crh_Latn cym_Latn dan_Latn deu_Latn dik_Latn dyu_Latn dzo_Tibt ell_Grek eng_Latn epo_Latn "
    "est_Latn eus_Latn ewe_Latn fao_Latn pes_Arab fij_Latn fin_Latn fon_Latn fra_Latn fur_Latn fuv_Latn gla_Latn "
    "gle_Latn glg_Latn grn_Latn guj_Gujr hat_Latn hau_Latn heb_Hebr hin_Deva hne_Deva hrv_Latn hun_Latn hye_Armn "
    "ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn jav_Latn jpn_Jpan kab_Latn kac_Latn kam_Latn kan_Knda kas_Arab "
    "kas_Deva kat_Geor knc_Arab knc_Latn kaz_Cyrl kbp_Latn kea_Latn khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn "
    "kon_Latn kor_Hang kmr_Latn lao_Laoo lvs_Latn lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn "
    "lua_Latn lug_Latn luo_Latn lus_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn mkd_Cyrl plt_Latn mlt_Latn "
    "mni_Beng khk_Cyrl mos_Latn mri_Latn zsm_Latn mya_Mymr nld_Latn nno_Latn nob_Latn npi_Deva nso_Latn nus_Latn "
    "nya_Latn oci_Latn gaz_Latn ory_Orya pag_Latn pan_Guru pap_Latn pol_Latn por_Latn prs_Arab pbt_Arab quy_Latn "
    "ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng scn_Latn shn_Mymr sin_Sinh slk_Latn slv_Latn smo_Latn "
    "sna_Latn snd_Arab som_Latn sot_Latn spa_Latn als_Latn srd_Latn srp_Cyrl ssw_Latn sun_Latn swe_Latn swh_Latn "
    "szl_Latn tam_Taml tat_Cyrl tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi taq_Latn taq_Tfng tpi_Latn tsn_Latn "
    "tso_Latn tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab ukr_Cyrl umb_Latn urd_Arab uzn_Latn vec_Latn "
    "vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn yue_Hant zho_Hans zho_Hant zul_Latn")
NLLB_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")
FILES = {"marian": ("source.spm", "target.spm", "vocab.json"), "m2m100": ("sentencepiece.bpe.model", "vocab.json"),
         "nllb": ("sentencepiece.bpe.model",)}


def _json(data: bytes, name: str):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise UserError(f"cannot read {name}: {str(e).splitlines()[0]}") from None


class HFTokenizer:
    """What the three adapters share (each is an nmt.text.tokens.TokenizerLike and declares its `kind`).
    files: {file name: bytes} as in the model directory; settings: the special ids, vocabulary sizes
    and per-kind options (a JSON-able dict)."""

    kind = ""  # "marian", "m2m100", "nllb": set by each adapter
    free_language_token = False
    source_languages = False  # Marian: no source-language token (M2M100/NLLB: True)

    def __init__(self, files: dict[str, bytes], settings: dict, *, threads: int = 1,
                 languages: dict[str, int] | None = None, default_tgt_lang: str | None = None):
        self.files, self.settings, self.threads = dict(files), dict(settings), threads
        self.languages, self.default_tgt_lang = dict(languages or {}), default_tgt_lang
        s = settings["specials"]
        self.specials = Specials(pad=s["pad"], unk=s["unk"], start=s["start"], eos=s["eos"])
        self.src_vocab_size, self.tgt_vocab_size = settings["src_vocab_size"], settings["tgt_vocab_size"]
        self.joint = True
        self._drop = frozenset(settings["drop"]) | frozenset(self.languages.values())

    def to_bytes(self) -> dict:
        """For a checkpoint (`nmt.text.tokenizer.Tokenizer.from_bytes` reads it back)."""
        return {"kind": self.kind, "files": dict(self.files), "settings": dict(self.settings),
                "languages": dict(self.languages), "default_tgt_lang": self.default_tgt_lang}

    def save(self, directory: str, settings: dict | None = None) -> None:
        """The tokenizer files (names as in the Hugging Face directory) and hf_tokenizer.json, each
        written atomically (`textio.write_file`); hf_tokenizer.json last. (`settings`: unused,
        accepted for nmt.text.tokenizer.Tokenizer's signature.)"""
        os.makedirs(directory, exist_ok=True)
        meta = {k: v for k, v in self.to_bytes().items() if k != "files"}
        meta["files"] = sorted(self.files)
        for name, data in [*self.files.items(), (SETTINGS_FILE, json.dumps(meta, indent=1).encode())]:
            textio.write_file(os.path.join(directory, name), data)

    def vocab_pieces(self) -> tuple[list[str], list[str]]:
        """(source, target) piece of every id of the model's vocabularies, in id order (unused ids get
        distinct `<unused_N>` names): the CTranslate2 export's vocabularies."""
        src, tgt = self._pieces()
        fill = lambda table, n: [table.get(i, f"<unused_{i}>") for i in range(n)]
        return fill(src, self.src_vocab_size), fill(tgt, self.tgt_vocab_size)

    def decode_tgt(self, ids: Iterable[Iterable[int]]) -> list[str]:
        """Target ids -> text, dropping what transformers' decode(skip_special_tokens=True) drops
        (eos, pad, unk, bos) and the language tokens."""
        return [self._decode([int(i) for i in seq if int(i) not in self._drop]) for seq in ids]

    def is_target_symbol(self, text: str) -> bool:
        """True when `text` alone is one known piece of the source and target vocabularies."""
        return all(self._one_piece(text, side) for side in ("src", "tgt"))

    def _one_piece(self, text: str, side: str) -> bool:
        ids = self.encode_src([text])[0] if side == "src" else self.encode_tgt([text])[0]
        ids = [i for i in ids if i not in self.languages.values()]
        return len(ids) == 1 and ids[0] != self.specials.unk


class MarianTokenizer(HFTokenizer):
    kind = "marian"

    def __init__(self, files: dict[str, bytes], settings: dict, **kw):
        super().__init__(files, settings, **kw)
        self.joint = "target_vocab.json" not in files
        self._src = load_sentencepiece(files["source.spm"], "source.spm")
        self._tgt = load_sentencepiece(files["target.spm"], "target.spm")
        self._src_vocab = _json(files["vocab.json"], "vocab.json")
        self._tgt_vocab = self._src_vocab if self.joint else _json(files["target_vocab.json"], "target_vocab.json")
        self._tgt_pieces = {i: p for p, i in self._tgt_vocab.items()}

    def _ids(self, pieces: list[str], vocab: dict[str, int]) -> list[int]:
        unk = self.specials.unk
        return [vocab.get(p, unk) for p in pieces]

    def encode_src(self, lines: list[str], src_lang: str | None = None) -> list[list[int]]:
        """A leading `>>xx<<` is one token (transformers' `remove_language_code`, on both sides); then
        the pieces of source.spm (target.spm for targets). src_lang: unused (no source-language token)."""
        codes, texts = zip(*(_split_code(x) for x in lines)) if lines else ((), ())
        pieces = self._src.encode(list(texts), out_type=str, num_threads=self.threads)
        return [self._ids(c + p, self._src_vocab) for c, p in zip(codes, pieces)]

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        codes, texts = zip(*(_split_code(x) for x in lines)) if lines else ((), ())
        pieces = self._tgt.encode(list(texts), out_type=str, num_threads=self.threads)
        return [self._ids(c + p, self._tgt_vocab) for c, p in zip(codes, pieces)]

    def src_pieces(self, line: str) -> list[str]:
        code, text = _split_code(line)
        return code + self._src.encode(text, out_type=str)

    def _decode(self, ids: list[int]) -> str:
        sp = self._src if self.joint else self._tgt  # as transformers: the source model when the vocabulary is shared
        n = sp.get_piece_size()
        pieces = [self._tgt_pieces[i] if i in self._tgt_pieces else sp.id_to_piece(i) for i in ids
                  if i in self._tgt_pieces or i < n]  # transformers falls back to the SentencePiece id
        return sp.decode_pieces(pieces).replace(WORD_START, " ").strip()

    def _pieces(self) -> tuple[dict[int, str], dict[int, str]]:
        return {i: p for p, i in self._src_vocab.items()}, dict(self._tgt_pieces)


def _split_code(line: str) -> tuple[list[str], str]:
    """(['>>xx<<'], rest) for a line that starts with a language code, else ([], line)."""
    if line.startswith(">>") and (end := line.find("<<")) != -1:
        return [line[: end + 2]], line[end + 2:]
    return [], line


class _MultilingualTokenizer(HFTokenizer):
    """What M2M100 and NLLB share: one sentencepiece.bpe.model for both sides, the source language token
    first. Subclasses map SentencePiece's output to the model's ids (`_encode`) and back (`_decode`)."""

    free_language_token = True  # the forced language token counts log-prob 0 in searches (nmt/text/languages.py)
    source_languages = True  # the source-language token first (nmt/text/languages.py)

    def __init__(self, files: dict[str, bytes], settings: dict, **kw):
        super().__init__(files, settings, **kw)
        self._sp = load_sentencepiece(files["sentencepiece.bpe.model"], "sentencepiece.bpe.model")
        self._src_lang = self.languages[settings["src_lang"]]

    @property
    def default_src_lang(self) -> str:
        """The source language used when none is asked for (the model's data.src_lang)."""
        return self.settings["src_lang"]

    def with_source_language(self, code: str) -> "_MultilingualTokenizer":
        """This tokenizer with `code` (one of `languages`) as its default source language."""
        return type(self)(self.files, {**self.settings, "src_lang": code}, threads=self.threads,
                          languages=self.languages, default_tgt_lang=self.default_tgt_lang)

    def encode_src(self, lines: list[str], src_lang: str | None = None) -> list[list[int]]:
        """The token of `src_lang` (None: the model's default, its data.src_lang) + pieces (nmt adds
        `</s>`); an empty line stays empty. One-line UserError for a language the model lacks."""
        check_source_language(self, src_lang)
        token = self._src_lang if src_lang is None else self.languages[src_lang]
        return [[token] + ids if ids else ids for ids in self._encode(lines)]

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        return self._encode(lines)

    def src_pieces(self, line: str) -> list[str]:
        return self._sp.encode(line, out_type=str)


class M2M100Tokenizer(_MultilingualTokenizer):
    kind = "m2m100"

    def __init__(self, files: dict[str, bytes], settings: dict, **kw):
        super().__init__(files, settings, **kw)
        self._vocab = _json(files["vocab.json"], "vocab.json")
        self._pieces_of = {i: p for p, i in self._vocab.items()}

    @property
    def fixed_codes(self) -> set[str]:
        """The language codes transformers' M2M100Tokenizer knows (a fixed list; not the ones nmt added)."""
        return set(M2M100_CODES[self.settings["language_codes"]].split())

    def _encode(self, lines: list[str]) -> list[list[int]]:
        unk = self.specials.unk
        return [[self._vocab.get(p, unk) for p in ps]
                for ps in self._sp.encode(list(lines), out_type=str, num_threads=self.threads)]

    def _decode(self, ids: list[int]) -> str:
        """As transformers: an id outside vocab.json (an unused "madeup" id) is written `<unk>`."""
        out, pieces = "", []
        for i in ids:
            if i in self._pieces_of:
                pieces.append(self._pieces_of[i])
            else:
                out, pieces = out + self._sp.decode(pieces) + "<unk>", []
        return (out + self._sp.decode(pieces)).strip()

    def _pieces(self) -> tuple[dict[int, str], dict[int, str]]:
        table = dict(self._pieces_of)
        table.update({i: f"__{code}__" for code, i in self.languages.items()})
        return table, table


class NllbTokenizer(_MultilingualTokenizer):
    kind = "nllb"

    def __init__(self, files: dict[str, bytes], settings: dict, **kw):
        super().__init__(files, settings, **kw)
        added = settings.get("added_pieces") or {"sp_size": self._sp.get_piece_size(), "first_id": 0}
        self._n, self._shift = added["sp_size"], added["first_id"] - added["sp_size"]  # pieces nmt/training/grow/ appended

    def _id(self, i: int) -> int:
        """The model id of SentencePiece id i: fairseq's offset, or after every old id for an appended piece."""
        return (i + 1 if i else self.specials.unk) if i < self._n else i + self._shift

    def _encode(self, lines: list[str]) -> list[list[int]]:
        n, shift, unk = self._n, self._shift, self.specials.unk  # (`_id`, inlined)
        return [[(i + 1 if i else unk) if i < n else i + shift for i in ids]  # fairseq's offset; SentencePiece's <unk> is 0
                for ids in self._sp.encode(list(lines), out_type=int, num_threads=self.threads)]

    def _decode(self, ids: list[int]) -> str:
        """As transformers' Metaspace decoder: `▁` -> space, minus the first piece's leading space."""
        sp_ids = [i - 1 if 4 <= i <= self._n else i - self._shift for i in ids]
        pieces = [self._sp.id_to_piece(j) for i, j in zip(ids, sp_ids)
                  if 4 <= i <= self._n or self._n <= j < self._sp.get_piece_size()]
        text = "".join(pieces).replace(WORD_START, " ")
        return text[1:] if pieces and pieces[0].startswith(WORD_START) else text

    def _pieces(self) -> tuple[dict[int, str], dict[int, str]]:
        table = {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"}
        table.update({self._id(i): self._sp.id_to_piece(i) for i in range(3, self._sp.get_piece_size())})
        table.update({i: code for code, i in self.languages.items()})
        table[self.settings["mask"]] = "<mask>"
        return table, table


KINDS = {cls.kind: cls for cls in (MarianTokenizer, M2M100Tokenizer, NllbTokenizer)}


def read_saved(directory: str) -> dict | None:
    """The checkpoint entry (`HFTokenizer.to_bytes`) of what `save` wrote into `directory`, or None if it holds none."""
    path = os.path.join(directory, SETTINGS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        meta = _json(f.read(), path)
    files = {}
    for name in meta["files"]:
        with open(os.path.join(directory, name), "rb") as f:
            files[name] = f.read()
    return {**meta, "files": files}


# --------------------------------------------------------------------------- reading a model directory

def read_json(model_dir: str, name: str) -> dict:
    """A JSON object file of the directory, {} when absent; UserError when unreadable."""
    path = os.path.join(model_dir, name)
    if not os.path.isfile(path):
        return {}
    value = textio.read_json(path)
    if not isinstance(value, dict):
        raise UserError(f"cannot read {path}: not a JSON object")
    return value


def tokenizer_kind(model_dir: str, config: dict, tok_config: dict) -> str:
    """marian | m2m100 | nllb, from tokenizer_class (tokenizer_config.json or config.json), else the files."""
    name = tok_config.get("tokenizer_class") or config.get("tokenizer_class") or ""
    if config["model_type"] == "marian":
        wanted = ("MarianTokenizer", "")
        kind = "marian"
    else:
        wanted = ("M2M100Tokenizer", "NllbTokenizer", "NllbTokenizerFast", "")
        kind = "nllb" if name.startswith("Nllb") or (not name and not os.path.isfile(
            os.path.join(model_dir, "vocab.json"))) else "m2m100"
    if name not in wanted:
        raise UserError(f"{model_dir}: tokenizer_class {name} is not supported for a {config['model_type']} model "
                        f"(supported: {', '.join(w for w in wanted if w)})")
    return kind


def _read_files(model_dir: str, kind: str, names: Iterable[str]) -> dict[str, bytes]:
    files = {}
    for name in names:
        path = os.path.join(model_dir, name)
        if not os.path.isfile(path):
            raise UserError(f"{model_dir} has no tokenizer file {name} (a {kind} tokenizer needs "
                            f"{', '.join(FILES[kind])})")
        with open(path, "rb") as f:
            files[name] = f.read()
    return files


def read_tokenizer(model_dir: str, config: dict, *, src_lang: str | None = None,
                   tgt_lang: str | None = None) -> HFTokenizer:
    """The adapter for the tokenizer files of a Hugging Face model directory (`config`: its
    config.json). src_lang / tgt_lang: the languages of a multilingual model (M2M100/NLLB; default:
    tokenizer_config.json's `src_lang` / `tgt_lang`); tgt_lang becomes the default target language.
    One-line UserError for a missing or inconsistent file, or a language the model does not know."""
    tok_config = read_json(model_dir, "tokenizer_config.json")
    kind = tokenizer_kind(model_dir, config, tok_config)
    if kind == "marian":
        separate = bool(tok_config.get("separate_vocabs"))
        files = _read_files(model_dir, kind, FILES[kind] + (("target_vocab.json",) if separate else ()))
        tokenizer = MarianTokenizer(files, _marian_settings(files, config, model_dir))
        _check_ids(tokenizer, model_dir)
        return tokenizer
    files = _read_files(model_dir, kind, FILES[kind])
    if kind == "nllb" and os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        files.update(_read_files(model_dir, kind, ["tokenizer.json"]))  # kept for `nmt export --format hf`
    if kind == "m2m100":
        settings, languages = _m2m100_settings(files, config, tok_config, model_dir)
    else:
        settings, languages = _nllb_settings(files, config, tok_config, model_dir)
    src = src_lang or tok_config.get("src_lang")
    tgt = tgt_lang or tok_config.get("tgt_lang")
    for flag, code in (("--src-lang", src), ("--tgt-lang", tgt)):
        if code is None and flag == "--tgt-lang":
            continue  # no default target language (the caller may find one)
        if code is None:
            raise UserError(f"{model_dir}: a multilingual {kind} model needs {flag} (tokenizer_config.json names "
                            f"no language; the model knows {len(languages)}, e.g. {', '.join(list(languages)[:5])})")
        if code not in languages:
            raise UserError(f"{flag} {code}: not a language of this model (it knows {len(languages)}: "
                            f"{', '.join(list(languages)[:8])}, ...)")
    cls = M2M100Tokenizer if kind == "m2m100" else NllbTokenizer
    tokenizer = cls(files, {**settings, "src_lang": src}, languages=languages, default_tgt_lang=tgt)
    _check_ids(tokenizer, model_dir)
    return tokenizer


def _specials(config: dict, **tokens: int) -> dict:
    """{pad, unk, start, eos} from the tokenizer's ids, checked against config.json's."""
    start = config.get("decoder_start_token_id", config.get("pad_token_id"))
    for key, ours in (("pad_token_id", tokens["pad"]), ("eos_token_id", tokens["eos"])):
        if config.get(key) != ours:
            raise UserError(f"config.json {key}={config.get(key)!r} but the tokenizer's id is {ours} "
                            "(the tokenizer files belong to another model)")
    return dict(tokens, start=start)


def _marian_settings(files: dict[str, bytes], config: dict, model_dir: str) -> dict:
    src_vocab = _json(files["vocab.json"], "vocab.json")
    tgt_vocab = _json(files["target_vocab.json"], "target_vocab.json") if "target_vocab.json" in files else src_vocab
    for name, vocab in (("vocab.json", src_vocab), ("target_vocab.json", tgt_vocab)):
        missing = [t for t in ("</s>", "<unk>", "<pad>") if t not in vocab]
        if not isinstance(vocab, dict) or missing:
            raise UserError(f"{model_dir}/{name} is not a Marian vocabulary (no {', '.join(missing) or 'mapping'})")
    specials = _specials(config, pad=tgt_vocab["<pad>"], unk=tgt_vocab["<unk>"], eos=tgt_vocab["</s>"])
    V = config["vocab_size"]
    return {"specials": specials, "src_vocab_size": V, "tgt_vocab_size": config.get("decoder_vocab_size") or V,
            "drop": sorted({specials["eos"], specials["unk"], specials["pad"]})}


def _m2m100_settings(files: dict[str, bytes], config: dict, tok_config: dict, model_dir: str) -> tuple[dict, dict]:
    vocab = _json(files["vocab.json"], "vocab.json")
    missing = [t for t in ("<s>", "<pad>", "</s>", "<unk>") if not isinstance(vocab, dict) or t not in vocab]
    if missing:
        raise UserError(f"{model_dir}/vocab.json is not an M2M100 vocabulary (no {', '.join(missing)})")
    codes = M2M100_CODES.get(tok_config.get("language_codes", "m2m100"))
    if codes is None:
        raise UserError(f"{model_dir}/tokenizer_config.json: language_codes {tok_config['language_codes']!r} is not "
                        f"supported (supported: {', '.join(M2M100_CODES)})")
    languages = {code: len(vocab) + i for i, code in enumerate(codes.split())}
    for i, token in (tok_config.get("added_tokens_decoder") or {}).items():  # codes added by nmt/training/grow/
        code = re.fullmatch(r"__(.+)__", str(token.get("content", "")) if isinstance(token, dict) else "")
        if code and code.group(1) not in languages and str(i).isdigit():
            languages[code.group(1)] = int(i)
    specials = _specials(config, pad=vocab["<pad>"], unk=vocab["<unk>"], eos=vocab["</s>"])
    V = config["vocab_size"]
    drop = sorted({vocab["<s>"], specials["pad"], specials["eos"], specials["unk"]})
    return {"specials": specials, "src_vocab_size": V, "tgt_vocab_size": V, "drop": drop,
            "language_codes": tok_config.get("language_codes", "m2m100"),
            "num_madeup_words": tok_config.get("num_madeup_words", 8)}, languages


def _nllb_settings(files: dict[str, bytes], config: dict, tok_config: dict, model_dir: str) -> tuple[dict, dict]:
    if tok_config.get("legacy_behaviour"):
        raise UserError(f"{model_dir}/tokenizer_config.json sets legacy_behaviour: the legacy NLLB layout (language "
                        "code after </s>) is not supported; nmt uses transformers 5's default, [lang] pieces </s>")
    sp = load_sentencepiece(files["sentencepiece.bpe.model"], f"{model_dir}/sentencepiece.bpe.model")
    if sp.unk_id() != 0:
        raise UserError(f"{model_dir}/sentencepiece.bpe.model: <unk> has id {sp.unk_id()}, NLLB's fairseq offset needs 0")
    n = sp.get_piece_size()
    tokenizer_json = read_json(model_dir, "tokenizer.json")
    added = {t.get("content"): t.get("id") for t in tokenizer_json.get("added_tokens", [])}
    if any(NLLB_CODE.fullmatch(str(t)) for t in added):  # the ids the hub's tokenizer.json gives
        languages = {t: i for t, i in added.items() if NLLB_CODE.fullmatch(str(t))}
    else:
        listed = tok_config.get("additional_special_tokens") or tok_config.get("extra_special_tokens") or []
        codes = [t for t in listed if isinstance(t, str) and NLLB_CODE.fullmatch(t)] or NLLB_CODES.split()
        languages = {code: n + 1 + i for i, code in enumerate(codes)}
    mask = added.get("<mask>", n + 1 + len(languages))
    specials = _specials(config, pad=1, unk=3, eos=2)
    V = config["vocab_size"]
    settings = {"specials": specials, "src_vocab_size": V, "tgt_vocab_size": V, "drop": [0, 1, 2, 3, mask], "mask": mask}
    return {**settings, **_appended_pieces(sp, tokenizer_json, model_dir)}, languages


def _appended_pieces(sp: spm.SentencePieceProcessor, tokenizer_json: dict, model_dir: str) -> dict:
    """{"added_pieces": ...} when tokenizer.json numbers the last SentencePiece pieces after every other id
    (pieces nmt/training/grow/ appended to an NLLB vocabulary), else {}."""
    vocab = (tokenizer_json.get("model") or {}).get("vocab") or {}
    n = sp.get_piece_size()
    first = next((i for i in range(3, n) if vocab.get(sp.id_to_piece(i), i + 1) != i + 1), n)
    if first == n:
        return {}
    start = vocab[sp.id_to_piece(first)]
    if any(vocab.get(sp.id_to_piece(i)) != start + i - first for i in range(first, n)):
        raise UserError(f"{model_dir}/tokenizer.json numbers the pieces of sentencepiece.bpe.model in an order nmt does "
                        "not support (SentencePiece id + 1, then appended pieces after every other id)")
    return {"added_pieces": {"sp_size": first, "first_id": start}}


def _check_ids(tokenizer: HFTokenizer, model_dir: str) -> None:
    """Every id the tokenizer can produce lies inside the model's embeddings."""
    src, tgt = tokenizer._pieces()
    for side, table, V in (("source", src, tokenizer.src_vocab_size), ("target", tgt, tokenizer.tgt_vocab_size)):
        top = max(table)
        if top >= V or min(table) < 0:
            raise UserError(f"{model_dir}: the tokenizer's {side} ids reach {top} but the model has {V} embeddings "
                            "(the tokenizer files belong to another model)")

"""Hugging Face models in nmt: tokenizer adapters, `nmt import`, search and scores against
transformers' generate() and forward pass, fine-tuning, `nmt export --format hf`.

The reference is transformers 5 itself (a test-only dependency): tiny models built with its own
classes and tokenizer files written as the hub's are (tests/hf_fixtures.py).
"""

from __future__ import annotations

import os
import random

import pytest

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 is a test-only dependency: pip install -e '.[dev]'")
pytest.importorskip("safetensors", reason="transformers checkpoints are safetensors files: pip install safetensors")

import hf_fixtures as fx  # noqa: E402

from nmt.errors import UserError  # noqa: E402
from nmt.hf_tokenizer import read_tokenizer  # noqa: E402
from nmt.tokenizer import Tokenizer  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")]

EXTRA = ["espacios   múltiples  dentro", "números 1234 y 5.678,90 — símbolos #@% & «comillas»",
         "漢字 y emoji 🙂 desconocidos", "Ñandú ÁÉÍÓÚ ü", "a", ">>fr<< Y dijo Dios", ">>xx<< código desconocido"]


def texts(lang: str) -> list[str]:
    """Real-ish lines: test-split verses (never seen by the toy SentencePiece models) and odd ones.
    Stripped, as nmt reads every line (nmt/textio.py): transformers' NLLB tokenizer (the tokenizers
    pipeline) gives a trailing space a `▁` token that SentencePiece does not."""
    return fx.corpus_lines("test", lang, 40) + EXTRA


# --------------------------------------------------------------------------- tokenizers

@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    """{family: (directory, config.json-like dict)} with tokenizer files only."""
    out = {}
    d = str(tmp_path_factory.mktemp("marian-tok"))
    V = fx.marian_tokenizer(d)
    out["marian"] = (d, dict(model_type="marian", vocab_size=V, pad_token_id=V - 1, decoder_start_token_id=V - 1,
                             eos_token_id=0))
    for kind, build in (("m2m100", fx.m2m100_tokenizer), ("nllb", fx.nllb_tokenizer)):
        d = str(tmp_path_factory.mktemp(f"{kind}-tok"))
        V = build(d)
        out[kind] = (d, dict(model_type="m2m_100", vocab_size=V, pad_token_id=1, eos_token_id=2, bos_token_id=0,
                             decoder_start_token_id=2))
    return out


def ours_and_theirs(tokenizer_dirs, kind: str):
    d, config = tokenizer_dirs[kind]
    ours = read_tokenizer(d, config)
    theirs = transformers.AutoTokenizer.from_pretrained(d)
    return ours, theirs


def test_marian_ids_equal_transformers(tokenizer_dirs):
    ours, theirs = ours_and_theirs(tokenizer_dirs, "marian")
    assert type(theirs).__name__ == "MarianTokenizer"
    src, tgt = texts("es"), texts("en")
    eos = ours.specials.eos
    assert theirs(src)["input_ids"] == [ids + [eos] for ids in ours.encode_src(src)]
    assert theirs(text_target=tgt)["input_ids"] == [ids + [eos] for ids in ours.encode_tgt(tgt)]
    unk = ours.specials.unk
    assert sum(ids.count(unk) for ids in ours.encode_src(src)) > 10  # pieces missing from vocab.json map to <unk>
    assert ours.encode_src([">>fr<< hola"])[0][0] == theirs.convert_tokens_to_ids(">>fr<<")
    assert (ours.specials.pad, ours.specials.start, ours.specials.eos, unk) == (len(theirs) - 1, len(theirs) - 1, 0, 1)
    assert ours.languages == {} and ours.joint


@pytest.mark.parametrize("kind", ["m2m100", "nllb"])
def test_multilingual_ids_equal_transformers(tokenizer_dirs, kind):
    ours, theirs = ours_and_theirs(tokenizer_dirs, kind)
    assert type(theirs).__name__ == ("M2M100Tokenizer" if kind == "m2m100" else "NllbTokenizer")
    src_code, tgt_code = ("es", "en") if kind == "m2m100" else ("spa_Latn", "eng_Latn")
    src, tgt = texts("es"), texts("en")
    theirs.src_lang, theirs.tgt_lang = src_code, tgt_code
    got = theirs(src, text_target=tgt)
    eos = ours.specials.eos
    assert got["input_ids"] == [ids + [eos] for ids in ours.encode_src(src)]  # [__es__] pieces </s>
    lang = ours.languages[tgt_code]
    assert got["labels"] == [[lang] + ids + [eos] for ids in ours.encode_tgt(tgt)]  # [__en__] pieces </s>
    assert ours.default_tgt_lang == tgt_code
    codes = fx.m2m100_codes() if kind == "m2m100" else list(ours.languages)
    assert len(ours.languages) == (100 if kind == "m2m100" else 202)
    assert all(ours.languages[c] == theirs.convert_tokens_to_ids(theirs_token(kind, c)) for c in codes)
    assert ours.encode_src([""]) == [[]]  # an empty line stays empty (transformers: [lang, </s>])
    assert (ours.specials.pad, ours.specials.start, ours.specials.eos, ours.specials.unk) == (1, 2, 2, 3)


def theirs_token(kind: str, code: str) -> str:
    return f"__{code}__" if kind == "m2m100" else code


@pytest.mark.parametrize("kind", ["marian", "m2m100", "nllb"])
def test_detokenization_equals_transformers(tokenizer_dirs, kind):
    ours, theirs = ours_and_theirs(tokenizer_dirs, kind)
    if kind != "marian":
        theirs.tgt_lang = "en" if kind == "m2m100" else "eng_Latn"
    tgt = texts("en")
    labels = theirs(text_target=tgt)["input_ids"]  # with the language token and </s>
    assert ours.decode_tgt(labels) == theirs.batch_decode(labels, skip_special_tokens=True)
    rng = random.Random(3)
    last = max(i for i in ours._pieces()[1]) + 1  # random ids over the tokenizer's vocabulary, specials included
    seqs = [[rng.randrange(last) for _ in range(rng.randrange(1, 25))] for _ in range(200)]
    assert ours.decode_tgt(seqs) == theirs.batch_decode(seqs, skip_special_tokens=True)


@pytest.mark.parametrize("kind", ["marian", "m2m100", "nllb"])
def test_adapters_travel_in_checkpoints_and_directories(tokenizer_dirs, kind, tmp_path):
    ours, _ = ours_and_theirs(tokenizer_dirs, kind)
    again = Tokenizer.from_bytes(ours.to_bytes(), threads=2)
    lines = texts("es")
    assert type(again) is type(ours) and again.threads == 2
    assert again.encode_src(lines) == ours.encode_src(lines) and again.specials == ours.specials
    assert again.languages == ours.languages and again.default_tgt_lang == ours.default_tgt_lang
    ours.save(str(tmp_path))
    loaded = Tokenizer.load(str(tmp_path))
    assert loaded.to_bytes() == ours.to_bytes()
    src, tgt = ours.vocab_pieces()
    assert len(src) == ours.src_vocab_size and len(tgt) == ours.tgt_vocab_size and len(set(tgt)) == len(tgt)
    assert tgt[ours.specials.eos] == "</s>" and tgt[ours.specials.unk] == "<unk>"


def test_tokenizer_errors_are_one_line(tokenizer_dirs, tmp_path):
    import shutil

    d, config = tokenizer_dirs["marian"]
    broken = str(tmp_path / "m")
    shutil.copytree(d, broken)
    os.remove(os.path.join(broken, "target.spm"))
    with pytest.raises(UserError, match="no tokenizer file target.spm"):
        read_tokenizer(broken, config)
    with pytest.raises(UserError, match="pad_token_id=5 but the tokenizer's id"):
        read_tokenizer(d, {**config, "pad_token_id": 5})
    with pytest.raises(UserError, match="ids reach .* but the model has 10 embeddings"):
        read_tokenizer(d, {**config, "vocab_size": 10, "pad_token_id": config["pad_token_id"]})
    d, config = tokenizer_dirs["m2m100"]
    with pytest.raises(UserError, match="--tgt-lang xx: not a language of this model"):
        read_tokenizer(d, config, tgt_lang="xx")

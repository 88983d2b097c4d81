"""Target languages of a multilingual model (nmt/text/languages.py): the language token forced as the
first target token, dropped from outputs, scored by `nmt score`, kept through checkpoints and a
CTranslate2 export; one-line errors for a missing, unknown or needless --tgt-lang."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nmt import Translator
from nmt.config import config_from_dict
from nmt.errors import UserError
from nmt.text.languages import target_prefix
from nmt.layout import source_tensors
from nmt.search import SearchInputs, SearchOptions, greedy_search
from nmt.text.tokenizer import EOS_ID, Tokenizer
from nmt.translation.torch_engine import TorchEngine

from helpers import LANGS, make_pairs, make_tiny_checkpoint, multilingual_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    return multilingual_checkpoint(str(tmp_path_factory.mktemp("ml") / "ml.pt"))


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return [p[0] for p in make_pairs(8, 3)]


def test_the_language_token_is_forced_first_and_never_shown(ckpt, lines):
    engine = TorchEngine.load(ckpt, "cpu", fast=False)
    tok = engine.tokenizer
    for code in LANGS:
        got = Translator(ckpt, tgt_lang=code).translate(lines)
        src, mask = source_tensors(tok.encode_src(lines))
        ref = [h for (h,) in greedy_search(engine.model, src, mask, SearchOptions(max_len_a=0.5, max_len_b=4),
                                           SearchInputs(prefixes=[[tok.languages[code]]] * len(lines)))]
        assert all(h.tokens[0] == tok.languages[code] for h in ref)  # forced although the model avoids it
        assert [r.text for r in got] == tok.decode_tgt([h.tokens[1:] for h in ref])
        assert not any("__" in r.text for r in got)
    assert [r.text for r in Translator(ckpt).translate(lines, tgt_lang="fr")] == \
        [r.text for r in Translator(ckpt, tgt_lang="fr").translate(lines)]


@pytest.mark.slow
def test_missing_unknown_and_needless_languages_are_one_line_errors(ckpt, lines, tmp_path):
    with pytest.raises(UserError, match=r"translates into 2 languages: choose one with --tgt-lang \(de, fr\)"):
        Translator(ckpt).translate(lines)
    with pytest.raises(UserError, match="choose one with --tgt-lang"):
        Translator(ckpt).check_language()
    with pytest.raises(UserError, match="unknown target language 'xx' for this model \\(it knows: de, fr\\)"):
        Translator(ckpt, tgt_lang="de").translate(lines, tgt_lang="xx")
    bilingual = make_tiny_checkpoint(str(tmp_path / "bi.pt"))
    with pytest.raises(UserError, match="translates into one language only"):
        Translator(bilingual, tgt_lang="de")
    assert target_prefix(TorchEngine.load(bilingual).tokenizer, None) == []
    r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", ckpt, "-q"], input="el gato\n",
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--tgt-lang" in r.stderr
    r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", ckpt, "-q", "--tgt-lang", "fr"],
                       input="el gato\n\n", capture_output=True, text=True)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2


def test_a_default_language_is_used_when_none_is_asked_for(tmp_path, lines):
    path = multilingual_checkpoint(str(tmp_path / "d.pt"), default="fr")
    assert [r.text for r in Translator(path).translate(lines)] == \
        [r.text for r in Translator(path, tgt_lang="fr").translate(lines)]


def test_score_counts_the_language_token_like_hugging_face_labels(ckpt):
    engine = TorchEngine.load(ckpt, "cpu", fast=False)
    tok = engine.tokenizer
    pairs = make_pairs(4, 5)
    got = Translator(ckpt, tgt_lang="de").score([p[0] for p in pairs], [p[1] for p in pairs])
    for s, (x, y) in zip(got, pairs):
        labels = [tok.languages["de"]] + tok.encode_tgt([y])[0] + [EOS_ID]
        src, mask = source_tensors(tok.encode_src([x]))
        with torch.no_grad():
            logits = engine.model(src, mask, torch.tensor([[tok.specials.start] + labels[:-1]]))[0]
        want = float(F.log_softmax(logits.double(), -1).gather(1, torch.tensor(labels)[:, None]).sum())
        assert s.n_tokens == len(labels) and s.log_prob == pytest.approx(want, abs=1e-4)


@pytest.mark.slow
def test_languages_survive_the_checkpoint_and_a_ctranslate2_export(ckpt, lines, tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install -e '.[ct2]')")
    tok = TorchEngine.load(ckpt).tokenizer
    assert Tokenizer.from_bytes(tok.to_bytes()).languages == tok.languages
    assert "languages" not in Tokenizer(tok.to_bytes()["src"]).to_bytes()  # bilingual checkpoints unchanged
    out = tmp_path / "ct2"
    subprocess.run([sys.executable, "-m", "nmt", "export", "-c", ckpt, "-o", str(out)], check=True, capture_output=True)
    ct2 = Translator(str(out), tgt_lang="de", workers=1)
    assert [r.text for r in ct2.translate(lines)] == [r.text for r in Translator(ckpt, tgt_lang="de").translate(lines)]
    with pytest.raises(UserError, match="choose one with --tgt-lang"):
        Translator(str(out)).translate(lines)


def test_training_targets_start_with_the_language_token(ckpt):
    from nmt.config import replace
    from nmt.data.corpus import encode_chunk
    from nmt.data.batches import language_prefix

    tok = TorchEngine.load(ckpt).tokenizer
    cfg = config_from_dict({"data": {"src_lang": "es", "tgt_lang": "fr", "train": {"src": "a", "tgt": "b"},
                                     "valid": {"src": "a", "tgt": "b"}}}, check_files=False)
    lang = language_prefix(cfg, tok)
    assert lang == (tok.languages["fr"],)
    _, _, tt, tl = encode_chunk(tok, ["el gato", "el sol"], ["the cat", ""], tgt_prefix=lang)
    assert tl.tolist() == [1 + len(tok.encode_tgt(["the cat"])[0]), 0]  # an empty target stays empty (dropped)
    assert int(tt[0]) == tok.languages["fr"] and tt[1:].tolist() == tok.encode_tgt(["the cat"])[0]
    with pytest.raises(UserError, match="unknown target language 'en'"):
        language_prefix(replace(cfg, data=replace(cfg.data, tgt_lang="en")), tok)


def test_one_accessor_for_what_a_model_translates_into(ckpt, tmp_path):
    """Issue 35: "what this model translates into" had five holders (the tokenizer, data.tgt_lang, the export's
    metadata, evaluate's ModelInfo, getattr probes in nmt/text/languages.py). Now nmt.text.languages reads it, one rule for
    all: a loaded model (`target_languages`), its checkpoint's record and its CTranslate2 export
    (`stored_target_languages`) and `nmt evaluate`'s model_info give the same TargetLanguages."""
    from nmt.model.checkpoint import load_for_inference, load_record
    from nmt.commands.evaluate import model_info
    from nmt.text.languages import TargetLanguages, target_languages

    with_default = multilingual_checkpoint(str(tmp_path / "d.pt"), default="fr")
    bilingual = make_tiny_checkpoint(str(tmp_path / "bi.pt"))
    ids = TorchEngine.load(ckpt).tokenizer.languages
    assert sorted(ids) == list(LANGS)
    for path, want in ((ckpt, TargetLanguages(ids, None)), (with_default, TargetLanguages(ids, "fr")),
                       (bilingual, TargetLanguages({}, "en"))):
        _, tokenizer, cfg = load_for_inference(path)
        assert target_languages(tokenizer, cfg) == want
        assert load_record(path).languages == want and model_info(path).languages == want
    assert target_prefix(TorchEngine.load(with_default).tokenizer, None) == [ids["fr"]]  # the default's token
    pytest.importorskip("ctranslate2", reason="the export half needs CTranslate2 (the ct2 extra)")
    from nmt.commands.export import ExportOptions, export_command

    export_command(ExportOptions(with_default, str(tmp_path / "ct2"), quiet=True))
    assert model_info(str(tmp_path / "ct2")).languages == TargetLanguages(ids, "fr")

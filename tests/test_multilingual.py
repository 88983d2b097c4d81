"""Multilingual models (issue 28): per-corpus languages in the config, temperature sampling between
directions, the tokenizer's language symbols, per-corpus language tokens, per-direction validation
(the mean selects), off-target counting, the BLEU tokenizer chosen by the target language, and the
command-line behaviour of a trained multilingual checkpoint.

The synthetic task of tests/helpers.py gets a second target language "xx": English with every word
spelled backwards ("the red dog" -> "eht der god"), so a character n-gram identifier tells it apart."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from nmt import Translator
from nmt.config import ConfigError, config_from_dict, replace
from nmt.data.batches import corpus_shares, epoch_batches, epoch_pairs, load_data, mix_counts
from nmt.evaluation.degeneration import degeneration, format_report
from nmt.errors import UserError
from nmt.commands.evaluate import EvaluateOptions, evaluate_command
from nmt.evaluation.metrics import language_tokenize
from nmt.text.langid import LanguageIdentifier, off_target
from nmt.text.tokenizer import Tokenizer, build_tokenizer, language_symbol

from helpers import backwards, make_pairs, multilingual_dict, tiny_config_dict

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- config

def _data(tmp_path, **data) -> dict:
    return {"data": {"src_lang": "en", "tgt_lang": "de", "train": {"src": "a", "tgt": "b"},
                     "valid": {"src": "a", "tgt": "b"}, **data}, "output_dir": str(tmp_path)}


def test_per_corpus_languages_default_to_the_data_section(tmp_path):
    cfg = config_from_dict(_data(tmp_path, train=[{"src": "a", "tgt": "b"}, {"src": "c", "tgt": "d", "src_lang": "fr"}]),
                           check_files=False)
    d = cfg.data
    assert [d.langs(c) for c in d.train_corpora] == [("en", "de"), ("fr", "de")]
    assert d.target_languages == ("de",) and not d.multilingual  # many sources, one target: no language token
    assert d.valid_corpora == (d.valid,) and d.valid_key(0) == "data.valid" and d.sampling_temperature == 1.0
    cfg = config_from_dict(_data(tmp_path, train=[{"src": "a", "tgt": "b"}, {"src": "b", "tgt": "a", "src_lang": "de",
                                                                          "tgt_lang": "en"}],
                                 valid=[{"src": "a", "tgt": "b"}, {"src": "b", "tgt": "a", "src_lang": "de",
                                                                   "tgt_lang": "en"}]), check_files=False)
    assert cfg.data.target_languages == ("de", "en") and cfg.data.multilingual
    assert [cfg.data.langs(c) for c in cfg.data.valid_corpora] == [("en", "de"), ("de", "en")]


@pytest.mark.parametrize("data, message", [
    ({"valid": [{"src": "a", "tgt": "b", "tgt_lang": "fr"}]},
     "'data.valid[0].tgt_lang' is 'fr', which is not a target language of data.train (de)"),
    ({"valid": []}, "'data.valid' is an empty list"),
    ({"valid": [{"src": "a", "tgt": "b"}, {"src": "a", "tgt": "b", "weight": 2}]}, "'data.valid[1].weight' is set"),
    ({"valid": [{"src": "a", "tgt": "b", "src_tag": "<BT>"}]}, "'data.valid[0].src_tag' is set"),
    ({"train": [{"src": "a", "tgt": "b"}, {"src": "a", "tgt": "b", "tgt_lang": "f r"}]},
     "invalid value for 'data.train[1].tgt_lang': 'f r' (a target language of a multilingual model becomes a token"),
    ({"sampling_temperature": 0}, "invalid value for 'data.sampling_temperature': 0.0 (must be > 0)"),
    ({"train": {"src": "a", "tgt": "b", "tgt_langg": "fr"}}, "did you mean 'data.train.tgt_lang'"),
])
def test_language_config_errors(tmp_path, data, message):
    with pytest.raises(ConfigError) as e:
        config_from_dict(_data(tmp_path, **data), check_files=False)
    assert any(message in err for err in e.value.errors), e.value.errors


# --------------------------------------------------------------------------- temperature sampling

EN_DE, EN_FR, EN_ES = ("en", "de"), ("en", "fr"), ("en", "es")


def test_temperature_one_is_proportional_to_size_and_draws_every_pair_once():
    parts = [900, 300, 50]
    assert mix_counts(parts, [1, 1, 1], [EN_DE, EN_FR, EN_ES], 1.0) == parts
    assert epoch_pairs(parts, [1, 1, 1], 1, 1, [EN_DE, EN_FR, EN_ES], 1.0) is None  # every pair once


@pytest.mark.parametrize("temperature, parts, roots", [(5.0, [100000, 3125, 32], [10, 5, 2]),
                                                       (3.0, [8000, 1000, 125], [20, 10, 5])])
def test_higher_temperatures_flatten_toward_small_directions(temperature, parts, roots):
    """share_d = N_d^(1/T) / sum: sizes with exact roots, so the reference is plain arithmetic."""
    total = sum(parts)
    want = [round(r / sum(roots) * total) for r in roots]
    assert mix_counts(parts, [1, 1, 1], [EN_DE, EN_FR, EN_ES], temperature) == want
    chosen = epoch_pairs(parts, [1, 1, 1], 7, 3, [EN_DE, EN_FR, EN_ES], temperature)
    bounds = np.cumsum([0] + parts)
    got = [int(((chosen >= lo) & (chosen < hi)).sum()) for lo, hi in zip(bounds[:-1], bounds[1:])]
    assert got == want
    assert np.array_equal(chosen, epoch_pairs(parts, [1, 1, 1], 7, 3, [EN_DE, EN_FR, EN_ES], temperature))
    assert not np.array_equal(chosen, epoch_pairs(parts, [1, 1, 1], 7, 4, [EN_DE, EN_FR, EN_ES], temperature))


def test_weights_inside_a_direction_and_between_directions():
    # one direction: the weights alone, exactly the formula of several corpora before directions existed
    for parts, weights in (([300, 100], [1, 1]), ([300, 100, 7], [1, 0.5, 2])):
        total = sum(parts)
        assert mix_counts(parts, weights, [EN_DE] * len(parts), 4.0) == [round(w / sum(weights) * total)
                                                                          for w in weights]
    # two corpora of en-de (weights 1, 1) and one of en-fr: de = 200 + 200 pairs counts once, as one direction
    shares = corpus_shares([200, 200, 100], [1, 1, 1], [EN_DE, EN_DE, EN_FR], 2.0)
    de, fr = 400 ** 0.5, 100 ** 0.5
    assert shares == pytest.approx([de / 2 / (de + fr), de / 2 / (de + fr), fr / (de + fr)])
    # a weight scales its direction; weight 0 leaves a corpus (and its size) out
    assert corpus_shares([100, 100], [2, 1], [EN_DE, EN_FR], 1.0) == pytest.approx([2 / 3, 1 / 3])
    assert corpus_shares([100, 900, 100], [1, 0, 1], [EN_DE, EN_DE, EN_FR], 1.0) == pytest.approx([0.5, 0, 0.5])


def test_the_replay_of_old_directions_gets_at_least_its_share():
    """replay (data.add_languages): corpora without a new language get replay_share together when their
    shares fall below it, in proportion to their shares; at or above it, or with no replay corpus (or
    nothing else), the mix stays."""
    EN_IT = ("en", "it")
    shares = corpus_shares([900, 60, 40], [1, 1, 1], [EN_IT, EN_DE, EN_FR], 1.0, [False, True, True], 0.25)
    assert shares == pytest.approx([0.75, 0.15, 0.10])
    assert corpus_shares([900, 60, 40], [1, 1, 1], [EN_IT, EN_DE, EN_FR], 1.0, [False, True, True], 0.0) == \
        pytest.approx([0.9, 0.06, 0.04])
    assert corpus_shares([600, 400], [1, 1], [EN_IT, EN_DE], 1.0, [False, True], 0.25) == pytest.approx([0.6, 0.4])
    for replay in ([False, False], [True, True]):
        assert corpus_shares([900, 100], [1, 1], [EN_IT, EN_DE], 1.0, replay, 0.25) == pytest.approx([0.9, 0.1])
    assert mix_counts([900, 100], [1, 1], [EN_IT, EN_DE], 1.0, [False, True], 0.25) == [750, 250]


def test_a_fine_tuning_run_that_adds_a_language_replays_the_old_directions_by_default(tmp_path):
    """Issue 59 (14): a small replay corpus next to a large new-language one gets data.replay_share of
    each epoch (0.25 by default) unless the config says 0; the train.log says the replay's share."""
    raw = multilingual_dict(str(tmp_path))
    raw["data"]["train"][0]["max_sentences"] = 100  # es -> en: the old direction, replayed
    raw["data"]["add_languages"] = {"xx": None}  # es -> xx: the new one, 3000 pairs
    raw["train"]["init_from"] = str(tmp_path / "source.pt")  # (not read here)
    cfg = config_from_dict(raw, check_files=False)
    tok = build_tokenizer(replace(cfg, data=replace(cfg.data, add_languages={})), cfg.run_dir, lambda m: None)
    logged: list[str] = []
    corpus = load_data(cfg, tok, cfg.run_dir, logged.append).train
    assert corpus.parts == (100, 3000)
    replayed = {share: sum(int((b < 100).sum()) for b in epoch_batches(corpus, replace(cfg, data=replace(
        cfg.data, replay_share=share)), 1)) for share in (0.25, 0.0)}
    assert replayed == {0.25: round(0.25 * 3100), 0.0: 100}
    assert any("old directions' replay (corpora without xx): 25.0% of the epoch" in line for line in logged)


def test_the_epoch_mix_is_a_pure_function_of_seed_and_epoch(tmp_path):
    """What an exact resume needs: epoch_batches(offset=k) is the tail of the epoch's batches."""
    raw = multilingual_dict(str(tmp_path))
    raw["data"]["sampling_temperature"] = 5.0
    raw["data"]["train"][1]["max_sentences"] = 300  # a small direction, drawn more than once an epoch
    cfg = config_from_dict(raw)
    tok = build_tokenizer(cfg, cfg.run_dir, lambda m: None)
    corpus = load_data(cfg, tok, cfg.run_dir, lambda m: None).train
    assert corpus.parts == (3000, 300)
    full = epoch_batches(corpus, cfg, 2)
    flat = np.concatenate(full)
    assert sorted(np.bincount(flat >= 3000).tolist()) == sorted(mix_counts([3000, 300], [1, 1],
                                                                           [("es", "en"), ("es", "xx")], 5.0))
    again = epoch_batches(corpus, cfg, 2, offset=5)
    assert len(again) == len(full) - 5 and all(np.array_equal(a, b) for a, b in zip(again, full[5:]))


def test_a_multilingual_resume_is_exact(tmp_path):
    from nmt.model import checkpoint as ckpt
    from nmt.train import train
    import torch

    def cfg(name, steps):
        raw = multilingual_dict(str(tmp_path), valid_bleu=False, metric="loss", valid_every=7, log_every=5,
                                warmup_steps=5, max_steps=steps)
        raw["name"] = name
        raw["data"].update(batch_tokens=200, sampling_temperature=3.0)
        raw["data"]["train"][0]["max_sentences"] = 150
        raw["data"]["train"][1]["max_sentences"] = 40
        return config_from_dict(raw)
    train(cfg("straight", 16), quiet=True)
    train(cfg("split", 8), quiet=True)
    train(cfg("split", 16), resume=True, quiet=True)
    a, b = (ckpt.load_checkpoint(os.path.join(str(tmp_path), "runs", n, "checkpoints", "latest.pt"))
            for n in ("straight", "split"))
    assert a["step"] == b["step"] == 16 and a["epoch"] == b["epoch"] > 1
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# --------------------------------------------------------------------------- tokenizer and data

def test_the_tokenizer_gets_one_control_symbol_per_target_language(tmp_path):
    cfg = config_from_dict(multilingual_dict(str(tmp_path)))
    tok = build_tokenizer(cfg, cfg.run_dir, lambda m: None)
    assert sorted(tok.languages) == ["en", "xx"] and tok.default_tgt_lang is None
    for code, i in tok.languages.items():
        assert tok.target_piece_id(language_symbol(code)) == i == tok.target_piece_id(f"__{code}__")
    # never matched in text: a text that spells a language symbol does not produce the token
    ids = tok.encode_tgt(["the dog __en__ __xx__"])[0]
    assert not set(ids) & set(tok.languages.values())
    assert tok.decode_tgt([[tok.languages["xx"]] + tok.encode_tgt(["eht god"])[0]]) == ["eht god"]
    with open(os.path.join(cfg.run_dir, "spm.json"), encoding="utf-8") as f:
        assert json.load(f)["languages"] == ["en", "xx"]
    logs = []
    again = build_tokenizer(cfg, cfg.run_dir, logs.append)  # reused from the run directory, languages restored
    assert "loaded from" in logs[0] and again.languages == tok.languages
    raw = multilingual_dict(str(tmp_path))
    raw["data"]["train"][1]["tgt_lang"] = "yy"
    raw["data"]["valid"][1]["tgt_lang"] = "yy"
    logs = []
    other = build_tokenizer(config_from_dict(raw), cfg.run_dir, logs.append)
    assert "the target languages of data.train" in logs[0] and sorted(other.languages) == ["en", "yy"]


def test_bilingual_and_separate_tokenizers(tmp_path):
    raw = tiny_config_dict(str(tmp_path))
    cfg = config_from_dict(raw)
    tok = build_tokenizer(cfg, cfg.run_dir, lambda m: None)
    assert tok.languages == {}
    with open(os.path.join(cfg.run_dir, "spm.json"), encoding="utf-8") as f:
        assert "languages" not in json.load(f)  # a bilingual run's settings as before
    raw = multilingual_dict(str(tmp_path / "sep"))
    raw["data"]["tokenizer"]["joint"] = False
    raw["model"]["share_embeddings"] = False
    cfg = config_from_dict(raw)
    tok = build_tokenizer(cfg, cfg.run_dir, lambda m: None)
    assert sorted(tok.languages) == ["en", "xx"]
    assert tok.target_piece_id("__en__") is not None and tok._src.piece_to_id("__en__") == 1  # source: unknown


def test_loaded_models_without_the_symbols_are_refused(tmp_path):
    bi = config_from_dict(tiny_config_dict(str(tmp_path / "bi")))
    build_tokenizer(bi, bi.run_dir, lambda m: None)
    raw = multilingual_dict(str(tmp_path / "ml"))
    raw["data"]["tokenizer"]["model"] = os.path.join(bi.run_dir, "spm.model")
    cfg = config_from_dict(raw)
    with pytest.raises(UserError, match="has no language token __en__, __xx__ .*control_symbols=__en__,__xx__"):
        build_tokenizer(cfg, cfg.run_dir, lambda m: None)


def test_each_corpus_targets_start_with_its_own_language_token(tmp_path):
    cfg = config_from_dict(multilingual_dict(str(tmp_path)))
    tok = build_tokenizer(cfg, cfg.run_dir, lambda m: None)
    logs = []
    data = load_data(cfg, tok, cfg.run_dir, logs.append)
    en, xx = tok.languages["en"], tok.languages["xx"]
    for corpus, parts, lang in ((data.train, (0, 3000), en), (data.train, (3000, 6000), xx),
                                (data.valid, (0, 100), en), (data.valid, (100, 200), xx)):
        assert {int(corpus.tgt(i)[0]) for i in range(*parts)} == {lang}
        assert not any(set(corpus.tgt(i)[1:].tolist()) & {en, xx} for i in range(*parts))
    assert [(v.name, v.tgt_lang, v.pairs) for v in data.valid_sets] == [("es-en", "en", range(0, 100)),
                                                                       ("es-xx", "xx", range(100, 200))]
    assert data.valid_lines == data.valid_sets[0].lines
    assert any("data valid es-xx: 100 pairs read" in m for m in logs)
    assert any("2 directions, sampling temperature 1" in m for m in logs)


def test_the_ratio_filter_does_not_count_the_language_token():
    from nmt.data.corpus import filter_pairs

    src, tgt = np.array([1, 1, 2, 0]), np.array([4, 5, 0, 0])  # targets: language token + 3 or 4 tokens
    keep, counts = filter_pairs(src, tgt, 10, 3.0, tgt_prefix=1)
    assert keep.tolist() == [True, False, False, False] and counts["ratio"] == 1 and counts["empty"] == 2
    assert filter_pairs(src, tgt, 10, 3.0)[0].tolist() == [False, False, False, False]
    assert filter_pairs(src, tgt, 3, 3.0, tgt_prefix=1)[1]["too_long"] == 2  # max_len counts every stored token


# --------------------------------------------------------------------------- a trained multilingual model

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from nmt.train import train

    d = str(tmp_path_factory.mktemp("multi"))
    raw = multilingual_dict(d, max_steps=240, valid_every=120, warmup_steps=40)
    # the table the thresholds below were set with: at 240 steps the exact-match counts move by about 6 of 30
    # lines with the seed, for either table (nmt's default or this one)
    raw["model"].update(positions="sinusoidal", position_offset=0)
    cfg = config_from_dict(raw)
    result = train(cfg, quiet=True)
    return cfg, result, os.path.join(cfg.run_dir, "checkpoints", "best.pt")


@pytest.mark.slow
def test_per_direction_validation_and_the_mean_as_metric(trained):
    cfg, result, _ = trained
    v = result["valid"]
    for name in ("es-en", "es-xx"):
        assert v[f"{name}/bleu"] > 50, v  # each direction learned
        assert f"{name}/chrf" in v and f"{name}/loss" in v and v[f"{name}/degenerate_off_target"] <= 0.05
    assert v["bleu"] == pytest.approx((v["es-en/bleu"] + v["es-xx/bleu"]) / 2)
    assert v["chrf"] == pytest.approx((v["es-en/chrf"] + v["es-xx/chrf"]) / 2)
    assert v["ppl"] == pytest.approx(np.exp((v["es-en/nll"] + v["es-xx/nll"]) / 2))
    assert result["best"] == pytest.approx(v["bleu"])  # the last validation is the best on this task
    with open(os.path.join(cfg.run_dir, "train.log"), encoding="utf-8") as f:
        log = f.read()
    assert "valid step 240 es-xx | loss" in log and "valid step 240 es-en degeneration" in log
    assert "off target" in log and f"best bleu {result['best']:.4g}" in log
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(cfg.run_dir, "tensorboard")).Reload()
    assert {"valid/es-en/bleu", "valid/es-xx/chrf", "valid/bleu", "valid/es-xx/degenerate_off_target"} <= \
        set(events.Tags()["scalars"])


@pytest.mark.slow
def test_the_checkpoint_translates_into_each_language_and_counts_off_target(trained, tmp_path):
    cfg, _, best = trained
    src = [p[0] for p in make_pairs(30, 11)]
    refs = {"en": [p[1] for p in make_pairs(30, 11)]}
    refs["xx"] = [backwards(r) for r in refs["en"]]
    for lang in ("en", "xx"):
        hyps = [r.text for r in Translator(best, tgt_lang=lang).translate(src)]
        assert sum(h == r for h, r in zip(hyps, refs[lang])) >= 15
    paths = {}
    for name, lines in (("src", src), ("en", refs["en"]), ("xx", refs["xx"])):
        paths[name] = str(tmp_path / name)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    out = io.StringIO()  # into xx, measured as xx: on target
    evaluate_command(EvaluateOptions(None, paths["xx"], checkpoint=best, src=paths["src"], json_out=True, quiet=True,
                                     overrides={"tgt_lang": "xx"}), stdout=out, stderr=io.StringIO())
    res = json.loads(out.getvalue())
    assert res["tgt_lang"] == "xx" and res["off_target"]["share"] <= 0.05
    assert res["off_target"]["reference_share"] == 0.0 and res["degeneration"]["off_target"]["lang"] == "xx"
    out = io.StringIO()  # English text scored as xx (a model that answers in the wrong language): all off target
    evaluate_command(EvaluateOptions(paths["en"], paths["xx"], json_out=True, overrides={"tgt_lang": "xx"},
                                     langid=best), stdout=out, stderr=io.StringIO())
    res = json.loads(out.getvalue())
    assert res["off_target"]["count"] >= 28 and res["off_target"]["reference_count"] == 0
    assert res["degeneration"]["off_target"]["lines"][:3] == [1, 2, 3]


@pytest.mark.slow
def test_validation_counts_outputs_in_the_wrong_language(trained):
    """The es-xx set decoded by a tokenizer whose xx token is the English one: off target."""
    import torch

    from nmt.model.checkpoint import load_for_inference
    from nmt.data.batches import ValidSet
    from nmt.training.step import setup_precision
    from nmt.training.validation import validate

    cfg, _, best = trained
    model, tok, _ = load_for_inference(best)
    state = torch.load(best, weights_only=True)
    ident = LanguageIdentifier.from_dict(state["langid"])
    assert ident.langs == ["en", "es", "xx"]
    wrong = Tokenizer.from_bytes({**tok.to_bytes(), "languages": {"en": tok.languages["en"],
                                                                  "xx": tok.languages["en"]}})
    tok_cfg = replace(cfg, data=replace(cfg.data, valid=cfg.data.valid[1]))
    data = load_data(tok_cfg, tok, cfg.run_dir, lambda m: None)
    vs = ValidSet("es-xx", "es", "xx", data.valid_lines, range(len(data.valid)))

    cpu = torch.device("cpu")
    right = validate(model, cfg, tok, data.valid, (vs,), cpu, setup_precision("fp32", cpu), _Log(), 0, ident)
    wrong_lang = validate(model, cfg, wrong, data.valid, (vs,), cpu, setup_precision("fp32", cpu), _Log(), 0, ident)
    assert right["degenerate_off_target"] <= 0.05 and wrong_lang["degenerate_off_target"] >= 0.9
    assert wrong_lang["bleu"] < right["bleu"]


class _Log:
    """A RunLogger stand-in: keeps the lines."""

    def __init__(self):
        self.lines = []

    def info(self, msg):
        self.lines.append(msg)

    def text(self, *args):
        pass


@pytest.mark.slow
def test_target_language_errors_of_a_trained_checkpoint(trained):
    _, _, best = trained

    def run(*args):
        return subprocess.run([sys.executable, "-m", "nmt", *args], input="el perro\n", capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    r = run("translate", "-c", best, "-q")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "choose one with --tgt-lang (en, xx)" in r.stderr
    r = run("translate", "-c", best, "-q", "--tgt-lang", "fr")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown target language 'fr'" in r.stderr
    r = run("evaluate", "-c", best, "--src", "/dev/stdin", "--ref", "/dev/stdin", "-q")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--tgt-lang" in r.stderr


# --------------------------------------------------------------------------- BLEU tokenizer by language

def test_the_bleu_tokenizer_follows_the_target_language(monkeypatch):
    import nmt.evaluation.metrics as ev

    monkeypatch.setattr(ev, "_has_mecab", lambda: True)
    for lang in ("ja", "ja_JP", "jpn_Jpan"):
        assert language_tokenize(lang) == ("ja-mecab", None)
    for lang in ("zh", "zh_CN", "zh-TW", "zho_Hans", "cmn"):
        assert language_tokenize(lang) == ("zh", None)
    for lang in ("de", "en", "jam", None):
        assert language_tokenize(lang) == (None, None)
    monkeypatch.setattr(ev, "_has_mecab", lambda: False)
    tok, warning = language_tokenize("ja")
    assert tok == "char" and 'pip install "sacrebleu[ja]"' in warning and "\n" not in warning


def test_evaluate_picks_the_tokenizer_from_tgt_lang_unless_told(tmp_path, monkeypatch):
    import nmt.evaluation.metrics as ev

    hyp, ref = tmp_path / "h", tmp_path / "r"
    hyp.write_text("我喜欢猫。\n", encoding="utf-8")
    ref.write_text("我喜欢狗。\n", encoding="utf-8")

    def run(tokenize=None, **overrides):
        out, err = io.StringIO(), io.StringIO()
        evaluate_command(EvaluateOptions(str(hyp), str(ref), json_out=True, tokenize=tokenize,
                                         overrides=overrides), stdout=out, stderr=err)
        return json.loads(out.getvalue())["bleu"]["signature"], err.getvalue()
    assert "tok:zh" in run(tgt_lang="zh_CN")[0]
    assert "tok:13a" in run()[0] and "tok:13a" in run(tgt_lang="de")[0]
    assert "tok:char" in run("char", tgt_lang="zh_CN")[0]  # --tokenize wins
    monkeypatch.setattr(ev, "_has_mecab", lambda: False)
    signature, err = run(tgt_lang="ja")
    assert "tok:char" in signature and err.count("\n") == 1 and "warning" in err and "MeCab" in err


def test_validation_tokenizer_auto(tmp_path):
    from nmt.training.validation import valid_tokenize

    cfg = config_from_dict(multilingual_dict(str(tmp_path)))
    assert cfg.train.valid_tokenize == "auto"
    assert valid_tokenize(cfg, "zh_CN") == "zh" and valid_tokenize(cfg, "en") == "13a"
    fixed = replace(cfg, train=replace(cfg.train, valid_tokenize="intl"))
    assert valid_tokenize(fixed, "zh_CN") == "intl"


# --------------------------------------------------------------------------- off-target counting

def test_the_degeneration_report_counts_off_target_lines_and_the_references_floor(tmp_path):
    en = [p[1] for p in make_pairs(300, 0)]
    ident = LanguageIdentifier.train({"en": en, "xx": [backwards(x) for x in en]})
    refs = [backwards(x) for x in [p[1] for p in make_pairs(10, 5)]]
    hyps = list(refs)
    hyps[2], hyps[7] = "the red dog sees the big house", "the cat eats"
    report = degeneration(hyps, refs, identifier=ident, lang="xx")
    assert report["off_target"] == {"count": 2, "share": 0.2, "lines": [3, 8], "lang": "xx", "reference_count": 0,
                                    "reference_share": 0.0}
    assert off_target(hyps, "xx", ident) == (2, [3, 8])  # the same function as nmt/text/langid.py's
    assert "off target 20.0% (2; references 0.0%)" in format_report(report)
    assert degeneration(hyps, refs)["off_target"] is None
    assert degeneration(hyps, refs, identifier=ident, lang="de")["off_target"] is None  # unknown language
    assert "off target" not in format_report(degeneration(hyps, refs))


@pytest.mark.slow
def test_a_ctranslate2_export_keeps_the_languages_and_the_identifier(trained, tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install -e '.[ct2]')")
    from nmt.commands.export import ExportOptions, export_command
    from nmt.interop.export_dir import LANGID_FILE

    _, _, best = trained
    out = str(tmp_path / "ct2")
    export_command(ExportOptions(best, out, quiet=True))
    assert os.path.isfile(os.path.join(out, LANGID_FILE))
    src = [p[0] for p in make_pairs(12, 13)]
    for lang in ("en", "xx"):
        want = [r.text for r in Translator(best, tgt_lang=lang, beam_size=2).translate(src)]
        assert [r.text for r in Translator(out, tgt_lang=lang, beam_size=2, workers=1).translate(src)] == want
    paths = {n: str(tmp_path / n) for n in ("src", "ref")}
    for name, lines in (("src", src), ("ref", [backwards(p[1]) for p in make_pairs(12, 13)])):
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    res = io.StringIO()
    evaluate_command(EvaluateOptions(None, paths["ref"], checkpoint=out, src=paths["src"], json_out=True, quiet=True,
                                     overrides={"tgt_lang": "xx", "workers": 1}), stdout=res, stderr=io.StringIO())
    assert json.loads(res.getvalue())["off_target"]["lang"] == "xx"

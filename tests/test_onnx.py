"""nmt/interop/onnx_export.py, onnx_graphs.py, onnx_tokenizer.py: `nmt export --format onnx`.

The references are independent of the exported files: nmt's own SentencePiece models (ids and text, on the
shipped Bible test sets) and nmt's own greedy search (the PyTorch engine). What reads the export is
onnxruntime and the `tokenizers` library driven by a greedy loop written as a user of the directory would
write it (tests/onnx_loop.py): no nmt code runs in it. The browser page is tests/test_onnx_web.py.
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from helpers import make_pairs, make_tiny_checkpoint, tiny_config_dict

REASON = 'the onnx extra is not installed: pip install -e ".[onnx]"'
for _module in ("onnx", "onnxruntime", "onnxscript", "transformers", "tokenizers"):
    pytest.importorskip(_module, reason=REASON)
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402

from onnx_loop import ort_greedy  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
BIBLE = os.path.join(os.path.dirname(__file__), "..", "data", "bible-es-en")


def bible(split: str, lang: str, n: int | None = None) -> list[str]:
    with gzip.open(os.path.join(BIBLE, f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:n] if n else lines


def export(checkpoint: str, out: str, *args: str) -> str:
    from nmt.cli import main

    assert main(["export", "-c", checkpoint, "--format", "onnx", "-o", out, *args]) == 0
    return out


# --------------------------------------------------------------------------- tokenizer.json

@pytest.fixture(scope="module")
def bible_text():
    return bible("train", "es", 3000) + bible("train", "en", 3000)


@pytest.mark.parametrize("model_type,vocab", [("unigram", 2000), ("bpe", 2000), ("char", 200)])
def test_tokenizer_json_gives_sentencepiece_ids_and_text_on_the_test_sets(bible_text, model_type, vocab):
    """Every line of test.es and test.en: the same ids as nmt's tokenizer, and decoding those ids gives nmt's text
    (with placeholders as user-defined symbols, `<unk>` as ` ⁇ `, specials skipped)."""
    from nmt.config import TokenizerConfig
    from nmt.interop.onnx_tokenizer import tokenizer_json
    from nmt.text.protect import PLACEHOLDERS
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

    tok = Tokenizer(train_sentencepiece(bible_text, TokenizerConfig(vocab_size=vocab, model_type=model_type, threads=1),
                                        seed=1, what="joint", log=lambda m: None, symbols=PLACEHOLDERS[:3]))
    data, notes, size = tokenizer_json(tok)
    assert notes == [] and size == tok.src_vocab_size
    hf = HFTokenizer.from_str(data.decode())
    lines = bible("test", "es") + bible("test", "en") + [f"x{PLACEHOLDERS[0]}y  {PLACEHOLDERS[2]} z ", "  ", "¿ ≠ ☃ ?"]
    ours = tok.encode_src(lines)
    theirs = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    assert len(lines) > 2900 and sum(len(x) for x in ours) > 30000
    assert [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b] == []
    assert hf.encode("hola").ids[-1] == 3  # the post-processor: source + </s>
    with_specials = [[2] + ids + [3, 0] for ids in ours]
    assert hf.decode_batch(with_specials, skip_special_tokens=True) == tok.decode_tgt(ours)
    assert any(1 in ids for ids in ours) or model_type != "char"  # (the char model meets unknown characters)


def test_word_models_differ_only_in_runs_of_unknown_words():
    """A word-level model: the same ids on the synthetic task's text, and on a run of unknown words one `<unk>`
    per word where SentencePiece gives one for the run (the export's note)."""
    from nmt.config import TokenizerConfig
    from nmt.interop.onnx_tokenizer import tokenizer_json
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

    text = [s for pair in make_pairs(300, 0) for s in pair]
    tok = Tokenizer(train_sentencepiece(text, TokenizerConfig(vocab_size=64, model_type="word", threads=1), seed=1,
                                        what="joint", log=lambda m: None))
    data, notes, _ = tokenizer_json(tok)
    hf = HFTokenizer.from_str(data.decode())
    lines = [s for pair in make_pairs(200, 9) for s in pair]
    assert [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)] == tok.encode_src(lines)
    assert tok.encode_src(["el gatito azulado ve"])[0].count(1) == 1
    assert hf.encode("el gatito azulado ve", add_special_tokens=False).ids.count(1) == 2
    assert "a run of unknown words" in notes[0]


def test_separate_vocabularies_are_refused_in_one_line(tmp_path, capsys):
    from nmt.cli import main

    ckpt = separate_vocab_checkpoint(str(tmp_path / "sep.pt"))
    assert main(["export", "-c", ckpt, "--format", "onnx", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "separate source and target vocabularies" in err
    assert not os.path.exists(tmp_path / "out")


def separate_vocab_checkpoint(path: str) -> str:
    from nmt.config import TokenizerConfig, config_from_dict
    from nmt.model.checkpoint import record, save_checkpoint
    from nmt.model.transformer import Transformer
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

    pairs = make_pairs(200, 0)
    tc = TokenizerConfig(vocab_size=40, model_type="word", threads=1)
    train = lambda lines, what: train_sentencepiece(lines, tc, seed=1, what=what, log=lambda m: None)
    tok = Tokenizer(train([p[0] for p in pairs], "source"), train([p[1] for p in pairs], "target"))
    raw = tiny_config_dict("/nonexistent")
    raw["model"].update(norm="post", share_embeddings=False, max_positions=48)
    cfg = config_from_dict(raw, check_files=False)
    model = Transformer(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size)
    save_checkpoint(record(model.state_dict(), tok, cfg), path)
    return path


# --------------------------------------------------------------------------- the graphs

@pytest.fixture(scope="module", params=["post", pytest.param("pre", marks=pytest.mark.slow)])  # (exports take a while)
def exported(request, tmp_path_factory):
    """(checkpoint, ONNX directory with int8 graphs) of an untrained tiny model (a word-level tokenizer):
    post-norm -> MarianMT, pre-norm -> M2M100."""
    d = tmp_path_factory.mktemp(f"onnx-{request.param}")
    ckpt = make_tiny_checkpoint(str(d / "tiny.pt"), norm=request.param)
    return ckpt, export(ckpt, str(d / "onnx"), "--quantization", "int8")


def nmt_greedy(checkpoint: str, lines: list[str], max_tokens: int):
    """nmt's greedy search with the length limit the export's generation_config.json gives: ([(ids, finished)],
    the tokenizer)."""
    import dataclasses

    from nmt.search import SearchOptions
    from nmt.translation.torch_engine import TorchEngine

    engine = TorchEngine.load(checkpoint, "cpu")
    decode = dataclasses.replace(engine.decode, beam_size=1, max_len_a=0.0, max_len_b=max_tokens)
    hyps = engine.search_batch(engine.tokenizer.encode_src(lines), SearchOptions.from_decode(decode, engine.tokenizer))
    return [(h[0].tokens, h[0].finished) for h in hyps], engine.tokenizer


def test_onnxruntime_greedy_loop_gives_nmts_greedy_output(exported):
    """40 lines in one padded batch: onnxruntime's tokens equal nmt's, line by line, up to EOS or the limit
    (generation_config.json's max_length), and tokenizer.json's text equals nmt's."""
    ckpt, out = exported
    lines = [p[0] for p in make_pairs(40, 5)]
    ids, finished, texts = ort_greedy(out, lines)
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    ours, tokenizer = nmt_greedy(ckpt, lines, gen["max_length"] - 1)
    assert ids == [tokens for tokens, _ in ours]
    assert finished == [done for _, done in ours]
    assert texts == tokenizer.decode_tgt(ids)
    assert len({tuple(x) for x in ids}) > 10 and sum(finished) < len(lines)  # varied outputs; some reach the limit


def test_the_directory_is_laid_out_as_optimum_and_transformers_js_expect(exported):
    import onnx

    ckpt, out = exported
    assert sorted(os.listdir(os.path.join(out, "onnx"))) == [
        "decoder_model_merged.onnx", "decoder_model_merged_quantized.onnx", "encoder_model.onnx",
        "encoder_model_quantized.onnx"]
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "nmt_export.json",
            "README.md"} <= set(os.listdir(out))
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["model_type"] == ("marian" if "post" in out else "m2m_100")
    merged = onnx.load(os.path.join(out, "onnx", "decoder_model_merged.onnx"), load_external_data=False)
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in merged.graph.input}
    n = config["decoder_layers"]
    assert inputs["use_cache_branch"] == [1] and inputs["input_ids"] == ["batch_size", "decoder_sequence_length"]
    assert inputs["past_key_values.0.encoder.key"][2] == "encoder_sequence_length_out"
    assert set(inputs) == {"input_ids", "encoder_hidden_states", "encoder_attention_mask", "use_cache_branch",
                           *[f"past_key_values.{i}.{s}.{kv}" for i in range(n) for s in ("decoder", "encoder")
                             for kv in ("key", "value")]}
    assert [o.name for o in merged.graph.output] == ["logits", *[f"present.{i}.{s}.{kv}" for i in range(n)
                                                                 for s in ("decoder", "encoder") for kv in ("key", "value")]]
    assert [node.op_type for node in merged.graph.node] == ["If"]
    weights = {t.name for t in merged.graph.initializer}
    assert weights and all(name.startswith("shared.") for name in weights)  # stored once, for both branches
    tok = json.load(open(os.path.join(out, "tokenizer_config.json")))
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and tok["clean_up_tokenization_spaces"] is False
    meta = json.load(open(os.path.join(out, "nmt_export.json")))
    assert meta["format"] == "nmt-onnx" and meta["checkpoint"] == "tiny.pt" and meta["quantization"] == "int8"


def test_int8_graphs_load_and_translate(exported):
    """The `*_quantized.onnx` graphs run the same loop, and their first-step logits follow fp32's (an untrained
    model's greedy outputs are near-ties: a trained model's BLEU is test_a_trained_model_translates_as_nmt_translate_greedy
    and scripts/bench_onnx.py)."""
    ckpt, out = exported
    lines = [p[0] for p in make_pairs(40, 5)]
    ids, _, texts = ort_greedy(out, lines, quantized=True)
    assert all(texts) and len({tuple(x) for x in ids}) > 10
    first = [ort_greedy(out, lines, quantized=q, max_new_tokens=1, logits=True) for q in (False, True)]
    kept = np.isfinite(first[0])  # (the bad words are -inf in both)
    assert np.corrcoef(first[0][kept], first[1][kept])[0, 1] > 0.98


def test_optimum_generates_nmts_greedy_output(exported):
    """optimum's ORTModelForSeq2SeqLM loads the directory and generate() gives nmt's greedy output."""
    try:
        from optimum.onnxruntime import ORTModelForSeq2SeqLM
    except Exception as e:  # optimum-onnx 0.1 requires transformers < 4.58 (nmt runs on transformers 5)
        pytest.skip(reason=f"optimum's onnxruntime models do not import with this transformers: {type(e).__name__}")
    from transformers import AutoTokenizer

    ckpt, out = exported
    lines = [p[0] for p in make_pairs(20, 5)]
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = ORTModelForSeq2SeqLM.from_pretrained(out)
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    texts = tokenizer.batch_decode(model.generate(**batch, num_beams=1, do_sample=False), skip_special_tokens=True)
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    ours, nmt_tokenizer = nmt_greedy(ckpt, lines, gen["max_length"] - 1)
    assert texts == nmt_tokenizer.decode_tgt([tokens for tokens, _ in ours])


# --------------------------------------------------------------------------- bad input

def test_bad_input_is_one_line(exported, tmp_path, capsys, monkeypatch):
    """Each: exit 2, one line on stderr naming the problem, nothing written."""
    from nmt.cli import main

    ckpt, out = exported
    cases = [
        (["-c", ckpt, "--format", "onnx", "-o", out], "already exists (use --force"),
        (["-c", ckpt, "--format", "onnx", "-o", os.path.dirname(ckpt), "--force"], "--checkpoint"),
        (["-c", ckpt, "--format", "onnx", "-o", str(tmp_path / "q"), "--quantization", "int8_float16"],
         "not an ONNX quantization"),
        (["-c", ckpt, "--format", "web", "-o", str(tmp_path / "q"), "--quantization", "float16"],
         "not an ONNX quantization"),
        (["-c", make_tiny_checkpoint(str(tmp_path / "paper.pt"), positions="sinusoidal"), "--format", "onnx",
          "-o", str(tmp_path / "paper")], "cannot represent this model as Hugging Face"),
    ]
    for args, expected in cases:
        assert main(["export", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err
    assert not os.path.exists(tmp_path / "q") and not os.path.exists(tmp_path / "paper")

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    assert main(["export", "-c", ckpt, "--format", "onnx", "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == 'nmt export: error: exporting to ONNX needs onnxscript: pip install -e ".[onnx]"'


def test_the_summary_names_the_graphs_and_the_notes(tmp_path, capsys):
    """`nmt export --format onnx` prints what it wrote and the decode settings without a counterpart."""
    ckpt = make_tiny_checkpoint(str(tmp_path / "t.pt"), norm="post")
    export(ckpt, str(tmp_path / "o"))
    err = capsys.readouterr().err.strip().splitlines()
    assert any("max length 0.5 * source + 4 has no counterpart" in line for line in err)
    assert err[-1].startswith(f"exported {ckpt} to {tmp_path / 'o'} (ONNX: decoder_model_merged.onnx ")
    assert "MiB, encoder_model.onnx " in err[-1]


# --------------------------------------------------------------------------- a trained model

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, ONNX directory) of the synthetic task trained briefly (post-norm, unigram pieces)."""
    from nmt.config import config_from_dict
    from nmt.train import train

    d = tmp_path_factory.mktemp("trained")
    raw = tiny_config_dict(str(d), max_steps=200, valid_every=1000, valid_bleu=False, metric="loss")
    raw["model"]["norm"] = "post"
    raw["data"]["tokenizer"].update(model_type="unigram", vocab_size=60)
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    ckpt = os.path.join(cfg.run_dir, "checkpoints", "latest.pt")
    return ckpt, export(ckpt, str(d / "onnx"), "--quantization", "int8")


@pytest.mark.slow
def test_a_trained_model_translates_as_nmt_translate_greedy(trained):
    """nmt's greedy output (its own length limit) on the 100 test lines = onnxruntime's on every line nmt ends
    before its limit (most of them); the int8 graphs, under half the size, score within 1 BLEU of fp32."""
    import sacrebleu

    from nmt.api import Translator

    ckpt, out = trained
    pairs = make_pairs(100, 2)
    lines, refs = [p[0] for p in pairs], [p[1] for p in pairs]
    ours = Translator(ckpt, device="cpu", beam_size=1).translate(lines)
    _, _, texts = ort_greedy(out, lines)
    ended = [i for i, r in enumerate(ours) if r.finished]
    assert len(ended) >= 75
    assert [texts[i] for i in ended] == [ours[i].text for i in ended]
    _, _, int8 = ort_greedy(out, lines, quantized=True)
    fp32_bleu, int8_bleu = (sacrebleu.corpus_bleu(t, [refs]).score for t in (texts, int8))
    assert fp32_bleu > 10 and abs(fp32_bleu - int8_bleu) < 1.0, (fp32_bleu, int8_bleu)
    for name in ("encoder_model", "decoder_model_merged"):
        fp32, int8 = (os.path.getsize(os.path.join(out, "onnx", f"{name}{s}.onnx")) for s in ("", "_quantized"))
        assert int8 < 0.5 * fp32, (name, fp32, int8)


# --------------------------------------------------------------------------- imported models

@pytest.mark.slow
@pytest.mark.parametrize("family", ["marian", "m2m100", "nllb"])
def test_imported_models_translate_as_nmt_greedy(family, tmp_path):
    """Tiny MarianMT / M2M100 / NLLB models built with transformers' classes and the hub's tokenizer files
    (tests/hf_fixtures.py), imported, exported: onnxruntime's greedy output = nmt's on 30 test lines, and
    tokenizer.json's ids are nmt's on 1000 Spanish lines once the ids past the vocabulary (pieces vocab.json
    lacks, which the encoder reads as <unk>) are read as <unk>."""
    import hf_fixtures as fx

    from nmt.api import Translator
    from nmt.commands.import_model import ImportOptions, import_command
    from nmt.translation.torch_engine import TorchEngine

    d = str(tmp_path / family)
    fx.marian_model(d) if family == "marian" else fx.m2m100_model(d, nllb=family == "nllb")
    ckpt = str(tmp_path / f"{family}.pt")
    assert import_command(ImportOptions(d, ckpt, quiet=True)) == 0
    out = export(ckpt, str(tmp_path / "onnx"))
    lines = fx.corpus_lines("test", "es", 30)
    ids, _, texts = ort_greedy(out, lines)
    limit = json.load(open(os.path.join(out, "generation_config.json")))["max_length"] - 1
    ours = Translator(ckpt, device="cpu", beam_size=1, max_len_a=0.0, max_len_b=limit).translate(lines)
    assert texts == [r.text for r in ours] and len(set(texts)) > 5
    tokenizer = TorchEngine.load(ckpt, "cpu").tokenizer
    test = fx.corpus_lines("test", "es", 1000)  # (the source language: MarianMT's source model is Spanish)
    hf = HFTokenizer.from_file(os.path.join(out, "tokenizer.json"))
    V, unk = tokenizer.src_vocab_size, tokenizer.specials.unk
    theirs = [[i if i < V else unk for i in e.ids] for e in hf.encode_batch(test)]
    assert all(test) and theirs == [x + [tokenizer.specials.eos] for x in tokenizer.encode_src(test)]
    assert family == "nllb" or any(i >= V for e in hf.encode_batch(test) for i in e.ids)  # (the fixtures lack pieces)

"""Adding a language to a pretrained model (issue 38, nmt/training/grow/): `data.add_languages`,
`data.tokenizer.add_pieces`, the grown SentencePiece models, the grown weights, and an nmt multilingual
model that learns a new target language and goes on to `nmt translate --tgt-lang`, `nmt evaluate`,
CTranslate2 and Hugging Face. Imported M2M100/NLLB models: tests/test_grow_hf.py.

The synthetic task of tests/helpers.py (es -> en, es -> xx with every word spelled backwards:
`multilingual_dict`) gets a new target language "yy": English with the vowels written å ë ï ø ü
(characters the old vocabulary lacks) and every word ending in "in".
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from helpers import make_pairs, multilingual_dict, tiny_config_dict
from nmt.training.grow import grow_weights, pieces, tokenizers
from nmt.config import ConfigError, config_from_dict
from nmt.text.tokenizer import train_sentencepiece

pytestmark = pytest.mark.usefixtures("one_thread")

VOWELS = str.maketrans("aeiou", "åëïøü")


def yy(line: str) -> str:
    return " ".join(w.translate(VOWELS) + "in" for w in line.split())


# --------------------------------------------------------------------------- config

def _raw(tmp_path, **data) -> dict:
    return {"data": {"src_lang": "es", "tgt_lang": "en", "train": {"src": "a", "tgt": "b"},
                     "valid": {"src": "a", "tgt": "b"}, **data}, "output_dir": str(tmp_path),
            "train": {"init_from": "x.pt"}}


def test_config_keys(tmp_path):
    cfg = config_from_dict(_raw(tmp_path, add_languages={"it": "es", "pt_BR": None}, tokenizer={"add_pieces": 8}),
                           check_files=False)
    assert cfg.data.add_languages == {"it": "es", "pt_BR": None} and cfg.data.tokenizer.add_pieces == 8
    assert config_from_dict(_raw(tmp_path), check_files=False).data.add_languages == {}


@pytest.mark.parametrize("data, train, message", [
    ({"add_languages": ["it"]}, {}, "invalid value for 'data.add_languages': ['it'] (expected a mapping, e.g. {it: es})"),
    ({"add_languages": {"it": ["es"]}}, {}, "invalid value for 'data.add_languages.it': ['es'] (expected a string)"),
    ({"add_languages": {"i t": None}}, {}, "invalid key in 'data.add_languages': 'i t'"),
    ({"tokenizer": {"add_pieces": 8}}, {}, "'data.tokenizer.add_pieces' is set but 'data.add_languages' is empty"),
    ({"add_languages": {"it": None}}, {"init_from": None}, "'data.add_languages' needs 'train.init_from'"),
    ({"tokenizer": {"add_pieces": -1}, "add_languages": {"it": None}}, {},
     "invalid value for 'data.tokenizer.add_pieces': -1 (must be >= 0)"),
])
def test_config_errors(tmp_path, data, train, message):
    raw = _raw(tmp_path, **data)
    raw["train"].update(train)
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw, check_files=False)
    assert any(m.startswith(message) for m in e.value.errors), e.value.errors


# --------------------------------------------------------------------------- SentencePiece growth

@pytest.fixture(scope="module")
def english_models():
    """{model type: a SentencePiece model trained on the synthetic English targets}."""
    from nmt.config import TokenizerConfig

    lines = [t for _, t in make_pairs(2000, seed=0)]
    return {kind: train_sentencepiece(lines, TokenizerConfig(vocab_size=60, model_type=kind, threads=1), seed=1,
                                      what="test", log=lambda msg: None) for kind in ("unigram", "bpe")}


def _new_pieces(model: bytes, n: int = 30) -> pieces.Grown:
    from nmt.config import TokenizerConfig

    lines = [yy(t) for _, t in make_pairs(2000, seed=3)]
    cfg = config_from_dict({"data": {"src_lang": "es", "tgt_lang": "en", "train": {"src": "a", "tgt": "b"},
                                     "valid": {"src": "a", "tgt": "b"},
                                     "tokenizer": dict(vars(TokenizerConfig(threads=1)))}}, check_files=False)
    found = pieces.candidates(lambda: iter(lines), model, cfg, n, "test", lambda msg: None)
    return pieces.append_pieces(model, found, n)


def test_a_new_text_with_more_characters_than_pieces_names_add_pieces(english_models):
    """The new-language model has 4 x add_pieces + 256 pieces: a text with more distinct characters
    cannot be covered, and the one-line error names the key to change (not data.tokenizer.vocab_size,
    which a fine-tuning run may not change)."""
    from nmt.config import TokenizerConfig
    from nmt.errors import UserError

    chars = [chr(0x4E00 + i) for i in range(400)]  # 400 CJK characters
    lines = ["".join(chars[(7 * i + j) % 400] for j in range(12)) for i in range(400)]
    cfg = config_from_dict({"data": {"src_lang": "es", "tgt_lang": "en", "train": {"src": "a", "tgt": "b"},
                                     "valid": {"src": "a", "tgt": "b"},
                                     "tokenizer": dict(vars(TokenizerConfig(threads=1)))}}, check_files=False)
    with pytest.raises(UserError) as e:
        pieces.candidates(lambda: iter(lines), english_models["unigram"], cfg, 10, "new-language", lambda msg: None)
    message = str(e.value)
    assert "\n" not in message and "raise add_pieces" in message and "296 pieces" in message, message
    assert "vocab_size /" not in message


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_appended_pieces_keep_every_id_and_every_old_segmentation_without_them(english_models, kind):
    """Existing pieces keep their ids, strings and types; an old-language line whose new segmentation
    uses no new piece is segmented exactly as before (the grown model's best path is an old path, so it
    is the old model's); new-language text gets shorter."""
    import sentencepiece as spm

    old_model = english_models[kind]
    grown = _new_pieces(old_model)
    old, new = (spm.SentencePieceProcessor(model_proto=m) for m in (old_model, grown.model))
    n = old.get_piece_size()
    assert 10 <= len(grown.pieces) <= 30 and new.get_piece_size() == n + len(grown.pieces)
    assert [(old.id_to_piece(i), old.is_control(i), old.is_unknown(i)) for i in range(n)] == \
        [(new.id_to_piece(i), new.is_control(i), new.is_unknown(i)) for i in range(n)]
    assert [new.id_to_piece(n + j) for j in range(len(grown.pieces))] == grown.pieces
    english = [t for _, t in make_pairs(300, seed=9)]
    without = [line for line in english if max(new.encode(line)) < n]
    assert len(without) > 100 and new.encode(without) == old.encode(without)
    fresh = [yy(t) for _, t in make_pairs(100, seed=11)]
    assert sum(map(len, new.encode(fresh))) < 0.9 * sum(map(len, old.encode(fresh)))
    assert old.unk_id() in {i for ids in old.encode(fresh) for i in ids}  # å ë ï ø ü were unknown
    assert old.unk_id() not in {i for ids in new.encode(fresh) for i in ids}


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_pieces_old_language_text_would_use_are_left_out(english_models, kind):
    """With old-language lines to keep, every one of them segments exactly as before, and candidates
    they would use are replaced by the next ones (still at most n)."""
    import sentencepiece as spm

    from nmt.config import TokenizerConfig

    keep = [t for _, t in make_pairs(500, seed=5)]
    lines = [yy(t) for _, t in make_pairs(2000, seed=3)]
    cfg = config_from_dict({"data": {"src_lang": "es", "tgt_lang": "en", "train": {"src": "a", "tgt": "b"},
                                     "valid": {"src": "a", "tgt": "b"},
                                     "tokenizer": dict(vars(TokenizerConfig(threads=1)))}}, check_files=False)
    model = english_models[kind]
    found = pieces.candidates(lambda: iter(lines), model, cfg, 30, "test", lambda msg: None)
    free = pieces.append_pieces(model, found, 30)
    kept = pieces.append_pieces(model, found, 30, keep)
    old, new = (spm.SentencePieceProcessor(model_proto=m) for m in (model, kept.model))
    assert new.encode(keep) == old.encode(keep)
    if kind == "bpe":  # ▁s (English's "sees", "sun") is a piece of the new text the toy English model lacks
        assert "▁s" in free.pieces and "▁s" not in kept.pieces and kept.left_out >= 1
    assert free.left_out == 0 and 10 <= len(kept.pieces) <= 30
    assert set(free.pieces) - set(kept.pieces) or kept.left_out == 0


def test_bpe_pieces_are_formed_by_one_merge_and_bring_their_characters(english_models):
    """A BPE piece is added only when one merge forms it, after its new characters: each added piece's
    text alone encodes to that piece."""
    import sentencepiece as spm

    grown = _new_pieces(english_models["bpe"])
    sp = pieces.splitter(grown.model)
    for piece in grown.pieces:
        assert sp.encode(pieces.piece_text(piece), out_type=str) == [piece]
        assert all(c in grown.pieces[:grown.pieces.index(piece) + 1] or spm.SentencePieceProcessor(
            model_proto=english_models["bpe"]).piece_to_id(c) != 0 for c in piece)


def test_grown_rows_are_copies_and_means_of_old_rows():
    embed = torch.randn(6, 4)
    bias = torch.randn(6)
    state = {"src_embed.weight": embed, "tgt_embed.weight": embed, "output_proj.weight": embed,
             "output_proj.bias": bias, "encoder.x": torch.ones(2)}
    rows = tokenizers.Rows(6, [(4,), (1, 2, 5), ()])
    out = grow_weights(state, rows, rows)
    for name in ("src_embed.weight", "tgt_embed.weight", "output_proj.weight"):
        assert torch.equal(out[name][:6], embed) and out[name].shape == (9, 4)
        assert torch.equal(out[name][6], embed[4])
        assert torch.allclose(out[name][7], embed[[1, 2, 5]].mean(0)) and torch.allclose(out[name][8], embed.mean(0))
    assert torch.allclose(out["output_proj.bias"][7], bias[[1, 2, 5]].mean()) and out["encoder.x"] is state["encoder.x"]


# --------------------------------------------------------------------------- an nmt multilingual model

def m2m100_like_dict(directory: str, **train) -> dict:
    """helpers' es -> en and es -> xx (and the yy text), an architecture Hugging Face can represent (M2M100),
    unigram pieces."""
    raw = multilingual_dict(directory, **train)
    p = os.path.join(directory, "data")
    for split in ("train", "valid", "test"):
        with open(os.path.join(p, f"{split}.en"), encoding="utf-8") as f, \
                open(os.path.join(p, f"{split}.yy"), "w", encoding="utf-8") as out:
            out.writelines(yy(line) + "\n" for line in f.read().splitlines())
    raw["data"]["tokenizer"].update(model_type="unigram")
    raw["data"].update(max_len=60)
    raw["model"].update(norm="pre", positions="sinusoidal_fairseq", position_offset=1, activation="gelu")
    raw["decode"].update(max_len_a=0, max_len_b=30)
    return raw


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(directory, raw config, checkpoint) of a multilingual model trained 80 steps."""
    from nmt.train import train

    d = str(tmp_path_factory.mktemp("base"))
    raw = m2m100_like_dict(d, max_steps=80, warmup_steps=10, valid_every=80, valid_max_sentences=4)
    result = train(config_from_dict(raw), quiet=True)
    return d, raw, os.path.join(result["run_dir"], "checkpoints", "latest.pt")


def add_yy(base, tmp_path, add_languages=None, add_pieces: int = 20, **train) -> dict:
    """The fine-tuning config: the old directions replayed, es -> yy added."""
    import copy

    d, raw, ckpt = base
    raw = copy.deepcopy(raw)
    p = os.path.join(d, "data")
    data = raw["data"]
    data["train"].append({"src": f"{p}/train.es", "tgt": f"{p}/train.yy", "tgt_lang": "yy"})
    data["valid"].append({"src": f"{p}/valid.es", "tgt": f"{p}/valid.yy", "tgt_lang": "yy"})
    data["add_languages"] = {"yy": "xx"} if add_languages is None else add_languages
    data["tokenizer"]["add_pieces"] = add_pieces
    raw.update(name="add-yy", output_dir=str(tmp_path / "runs"))
    raw["train"].update({"init_from": ckpt, "max_steps": 30, "warmup_steps": 5, "valid_every": 30, **train})
    return raw


@pytest.mark.slow
def test_the_grown_source_translates_the_old_directions_as_before(base, tmp_path):
    """Before any training: the new token copies xx's rows, old ids keep their rows, and every old
    direction's greedy output is the source model's for each line whose source ids did not change."""
    from nmt import Translator
    from nmt.model.checkpoint import load_record, save_checkpoint
    from nmt.training.finetune import load_source

    d, _, ckpt = base
    cfg = config_from_dict(add_yy(base, tmp_path))
    logged = []
    grown = load_source(cfg, str(tmp_path / "run"), logged.append)
    old = load_record(ckpt)
    tok, old_tok = grown.load_tokenizer(), old.load_tokenizer()
    V = old_tok.tgt_vocab_size
    assert old_tok.languages.items() < tok.languages.items() and tok.languages["yy"] == V
    assert tok.tgt_vocab_size == V + 1 + 20 and grown.vocab == {"src": V + 21, "tgt": V + 21}
    for name in ("src_embed.weight", "output_proj.weight"):
        assert torch.equal(grown.model[name][:V], old.model[name])
        assert torch.equal(grown.model[name][V], old.model[name][old_tok.languages["xx"]])
    logged = [line for line in logged if not line.startswith("tokenizer:")]  # (the new-language model's size)
    assert logged[0].startswith(f"add languages yy: language tokens yy (id {V}, from xx); vocabulary {V}/{V} -> {V + 21}/")
    assert logged[1].startswith("add_pieces: new-language model: 20 pieces appended (")
    path = str(tmp_path / "grown.pt")
    save_checkpoint(grown, path)
    with open(os.path.join(d, "data", "test.es"), encoding="utf-8") as f:
        lines = f.read().splitlines()[:40]
    same = [i for i, (a, b) in enumerate(zip(old_tok.encode_src(lines), tok.encode_src(lines))) if a == b]
    assert len(same) >= 30
    for lang in ("en", "xx"):
        before = Translator(ckpt, device="cpu").translate(lines, tgt_lang=lang, beam_size=1)
        after = Translator(path, device="cpu").translate(lines, tgt_lang=lang, beam_size=1)
        assert [after[i].text for i in same] == [before[i].text for i in same]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_a_new_target_language_is_learnt_and_travels(base, tmp_path, capsys):
    """nmt train with data.add_languages: per-direction validation of old and new directions, the run's
    language identifier knows yy, nmt translate --tgt-lang yy, nmt evaluate counts off-target lines; the
    CTranslate2 export and the Hugging Face export (MarianTokenizer files, generate() with the new
    token forced) give nmt's greedy outputs."""
    import yaml

    from nmt import Translator
    from nmt.model.checkpoint import load_record
    from nmt.cli import main

    d, _, _ = base
    config = tmp_path / "add.yaml"
    config.write_text(yaml.safe_dump(add_yy(base, tmp_path, max_steps=150, valid_every=150)))
    assert main(["train", "--config", str(config), "-q"]) == 0
    run = tmp_path / "runs" / "add-yy"
    log = (run / "train.log").read_text()
    for direction in ("es-en", "es-xx", "es-yy"):
        assert f"valid step 150 {direction} |" in log
    ckpt = str(run / "checkpoints" / "latest.pt")
    state = load_record(ckpt)
    assert "yy" in state.load_tokenizer().languages and "yy" in state.langid["profiles"]
    test_es = os.path.join(d, "data", "test.es")
    out = tmp_path / "out.yy"
    assert main(["translate", "-c", ckpt, "-i", test_es, "-o", str(out), "--tgt-lang", "yy", "--beam", "1", "-q"]) == 0
    hyps = out.read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 100 and sum(any(c in h for c in "åëïøü") for h in hyps) > 50
    capsys.readouterr()
    assert main(["evaluate", "-c", ckpt, "--src", test_es, "-r", os.path.join(d, "data", "test.yy"), "--tgt-lang", "yy",
                 "--beam", "1", "--json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["off_target"]["lang"] == "yy" and report["off_target"]["count"] == sum(
        not any(c in h for c in "åëïøü") for h in hyps)  # the identifier learnt yy from the training text
    lines = [s for s, _ in make_pairs(30, seed=21)]
    ours = {lang: [r.text for r in Translator(ckpt, device="cpu").translate(lines, tgt_lang=lang, beam_size=1)]
            for lang in ("yy", "en")}
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        pass  # (CTranslate2 is optional: pip install -e '.[ct2]')
    else:
        assert main(["export", "-c", ckpt, "-o", str(tmp_path / "ct2")]) == 0
        assert [r.text for r in Translator(str(tmp_path / "ct2"), device="cpu").translate(
            lines, tgt_lang="yy", beam_size=1)] == ours["yy"]
    transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers is a test-only dependency")
    assert main(["export", "-c", ckpt, "--format", "hf", "-o", str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path / "hf")).eval()
    for lang in ("yy", "en"):
        with torch.no_grad():
            out = model.generate(**tok(lines, return_tensors="pt", padding=True), num_beams=1,
                                 forced_bos_token_id=tok.convert_tokens_to_ids(f"__{lang}__"))
        # (stripped: an output ending in a lone `▁` piece keeps a trailing space in nmt's decoding, which
        # MarianTokenizer strips)
        assert tok.batch_decode(out, skip_special_tokens=True) == [text.strip() for text in ours[lang]]


@pytest.mark.slow
@pytest.mark.parametrize("edit, message", [
    (lambda raw: raw["data"].update(add_languages={}, tokenizer={**raw["data"]["tokenizer"], "add_pieces": 0}),
     "data.train[2].tgt_lang: 'yy' is not a language of the model in train.init_from"),
    (lambda raw: raw["data"].update(add_languages={"yy": "xx", "en": None}),
     "data.add_languages.en: the model in train.init_from"),
    (lambda raw: raw["data"].update(add_languages={"yy": "xx", "zz": None}),
     "data.add_languages.zz: no corpus of data.train has 'zz'"),
    (lambda raw: raw["data"].update(add_languages={"yy": "es"}),
     "data.add_languages.yy: 'es' has no language token in the model"),
    (lambda raw: raw["data"]["valid"][2].update(src_lang="qq"),
     "data.valid[2].src_lang: 'qq' is not a language of the model"),
    (lambda raw: raw["data"]["train"].append({"src": raw["data"]["train"][0]["tgt"], "tgt": raw["data"]["train"][0]["src"],
                                              "src_lang": "en", "tgt_lang": "es"}),
     "data.train[3].tgt_lang: the model in train.init_from"),  # ... knows 'es' as a source language only
    (lambda raw: raw["train"].update(init_reset=["schedule", "counters"]),
     "train.init_reset: the optimizer state of train.init_from"),  # ... cannot be carried over when ... grow
])
def test_language_errors_are_one_line(base, tmp_path, capsys, edit, message):
    import yaml

    from nmt.cli import main

    raw = add_yy(base, tmp_path)
    edit(raw)
    config = tmp_path / "add.yaml"
    config.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["train", "--config", str(config), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.slow
def test_a_new_source_language_keeps_the_optimizer(base, tmp_path):
    """nmt's multilingual models have no source-language tokens: a new source language (add_pieces 0)
    grows nothing, so the optimizer state may be carried over (train.init_reset without optimizer)."""
    import yaml

    from nmt.cli import main

    raw = add_yy(base, tmp_path, add_languages={}, add_pieces=0, init_reset=["schedule", "counters"], max_steps=85)
    data = raw["data"]
    for split in ("train", "valid"):
        data[split][2].update(src=data[split][2]["tgt"], tgt=data[split][0]["tgt"], src_lang="zz", tgt_lang="en")
    data["add_languages"] = {"zz": None}
    config = tmp_path / "add.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["train", "--config", str(config), "-q"]) == 0


def test_a_bilingual_model_cannot_learn_a_second_target_language(tmp_path, capsys):
    """A bilingual model has no language tokens: a second target language is refused; a new source
    language (no token needed) grows the vocabulary."""
    import yaml

    from helpers import make_tiny_checkpoint
    from nmt.config import to_dict
    from nmt.model.checkpoint import load_record
    from nmt.cli import main
    from nmt.training.finetune import load_source

    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    raw = tiny_config_dict(str(tmp_path))
    source = load_record(ckpt)
    raw["model"] = to_dict(source.load_config().model)
    raw["data"]["tokenizer"] = to_dict(source.load_config().data.tokenizer)
    p = os.path.join(str(tmp_path), "data")
    with open(f"{p}/train.en", encoding="utf-8") as f, open(f"{p}/train.yy", "w", encoding="utf-8") as out:
        out.writelines(yy(line) + "\n" for line in f)
    raw["data"]["train"] = [raw["data"]["train"], {"src": f"{p}/train.es", "tgt": f"{p}/train.yy", "tgt_lang": "yy"}]
    raw["data"]["add_languages"] = {"yy": None}
    raw["train"].update(init_from=ckpt, max_steps=2, warmup_steps=1)
    raw["data"]["max_len"] = 20
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["train", "--config", str(config), "-q"]) == 2
    assert "cannot learn a second target language" in capsys.readouterr().err
    raw["data"]["train"] = [raw["data"]["train"][0], {"src": f"{p}/train.yy", "tgt": f"{p}/train.en", "src_lang": "yy"}]
    raw["data"]["tokenizer"]["add_pieces"] = 5
    grown = load_source(config_from_dict(raw), str(tmp_path / "run"), lambda msg: None)
    tok = grown.load_tokenizer()
    assert not tok.languages and tok.src_vocab_size == source.load_tokenizer().src_vocab_size + 5


@pytest.mark.slow
def test_separate_vocabularies_grow_the_side_the_new_text_is_on(base, tmp_path):
    """joint: false: a new target language grows the target model (token and pieces) and leaves the
    source model as it is; the grown checkpoint loads and translates into the new language."""
    import copy

    from nmt import Translator
    from nmt.model.checkpoint import load_record, save_checkpoint
    from nmt.training.finetune import load_source
    from nmt.train import train

    raw = copy.deepcopy(base[1])
    raw["data"]["tokenizer"].update(joint=False, vocab_size=60)
    raw["model"].update(share_embeddings=False, tie_output=False)
    raw["train"].update(max_steps=2, warmup_steps=1, valid_every=2, valid_bleu=False, metric="loss")
    raw.update(name="separate", output_dir=str(tmp_path / "runs"))
    ckpt = os.path.join(train(config_from_dict(raw), quiet=True)["run_dir"], "checkpoints", "latest.pt")
    finetune = add_yy((base[0], raw, ckpt), tmp_path, add_pieces=10, valid_bleu=False, metric="loss")
    grown = load_source(config_from_dict(finetune), str(tmp_path / "run"), lambda msg: None)
    old, new = load_record(ckpt).load_tokenizer(), grown.load_tokenizer()
    assert new.to_bytes()["src"] == old.to_bytes()["src"] and new.src_vocab_size == old.src_vocab_size
    assert new.tgt_vocab_size == old.tgt_vocab_size + 1 + 10 and new.languages["yy"] == old.tgt_vocab_size
    assert grown.model["src_embed.weight"].shape[0] == old.src_vocab_size
    assert grown.model["tgt_embed.weight"].shape[0] == grown.model["output_proj.weight"].shape[0] == \
        new.tgt_vocab_size
    path = str(tmp_path / "grown.pt")
    save_checkpoint(grown, path)
    assert len(Translator(path, device="cpu").translate(["el perro ve la casa"], tgt_lang="yy")) == 1

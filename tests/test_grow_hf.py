"""A new language for an imported M2M100 / NLLB model (issue 38, nmt/training/grow/), against transformers 5.

Tiny models built with transformers' own classes (tests/hf_fixtures.py), imported with `nmt import`,
fine-tuned a few steps on es -> en (replay) and es -> a new language (English of the Bible with the
vowels written å ë ï ø ü, every word ending in "in"), with new pieces; then `nmt export --format hf`
loads with AutoTokenizer / AutoModelForSeq2SeqLM and gives nmt's ids and greedy outputs, in the new
language too; `nmt import` of that directory and the CTranslate2 export give them as well. The new
language as a source language (yy -> en) likewise, through its source-language token.
"""

from __future__ import annotations


import pytest

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 is a test-only dependency: pip install -e '.[dev]'")
pytest.importorskip("safetensors", reason="transformers checkpoints are safetensors files: pip install safetensors")

import hf_fixtures as fx  # noqa: E402

from nmt.model.checkpoint import load_record  # noqa: E402
from nmt.cli import main  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")]

VOWELS = str.maketrans("aeiou", "åëïøü")
CODES = {"m2m100": ("es", "en", "qy", "__qy__"), "nllb": ("spa_Latn", "eng_Latn", "qya_Latn", "qya_Latn")}


def yy(line: str) -> str:
    return " ".join(w.translate(VOWELS) + "in" for w in line.split())


@pytest.fixture(scope="module", params=["m2m100", "nllb"])
def grown(request, tmp_path_factory):
    """(family, directory, imported checkpoint, fine-tuned checkpoint) for es -> en + es -> new."""
    import yaml

    from nmt.commands.import_model import ImportOptions, import_command

    family = request.param
    d = tmp_path_factory.mktemp(family)
    hf = str(d / "hf")
    fx.m2m100_model(hf, nllb=family == "nllb")
    imported = str(d / "imported.pt")
    assert import_command(ImportOptions(hf, imported, quiet=True)) == 0
    files = {}
    for split, n in (("train", 300), ("dev", 10)):
        es, en = fx.corpus_lines(split, "es", n), fx.corpus_lines(split, "en", n)
        for lang, lines in (("es", es), ("en", en), ("yy", [yy(line) for line in en])):
            files[split, lang] = str(d / f"{split}.{lang}")
            with open(files[split, lang], "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
    src, tgt, new, _ = CODES[family]
    raw = {"name": "ft", "output_dir": str(d / "runs"),
           "data": {"src_lang": src, "tgt_lang": tgt, "batch_tokens": 3000, "max_len": 200,
                    "train": [{"src": files["train", "es"], "tgt": files["train", "en"]},
                              {"src": files["train", "es"], "tgt": files["train", "yy"], "tgt_lang": new}],
                    "valid": [{"src": files["dev", "es"], "tgt": files["dev", "en"]},
                              {"src": files["dev", "es"], "tgt": files["dev", "yy"], "tgt_lang": new}],
                    "add_languages": {new: tgt}, "tokenizer": {"add_pieces": 30}},
           "model": load_record(imported).config["model"],
           "decode": {"beam_size": 1, "max_len_a": 0, "max_len_b": 40},
           "train": {"init_from": imported, "max_steps": 10, "warmup_steps": 2, "lr": 1e-3, "valid_every": 10,
                     "valid_max_sentences": 2, "device": "cpu", "threads": 1}}
    config = d / "ft.yaml"
    config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    assert main(["train", "--config", str(config), "-q"]) == 0
    return family, d, imported, str(d / "runs" / "ft" / "checkpoints" / "latest.pt")


def generate(directory: str, lines: list[str], token: str) -> list[str]:
    """transformers alone: greedy generate() with the language token forced (the directory's
    generation_config.json otherwise: its max_length is nmt's limit)."""
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    with torch.no_grad():
        out = model.generate(**tok(lines, return_tensors="pt", padding=True), num_beams=1,
                             forced_bos_token_id=tok.convert_tokens_to_ids(token))
    return tok.batch_decode(out, skip_special_tokens=True)


@pytest.mark.slow
def test_old_ids_and_rows_are_kept(grown):
    """The grown tokenizer encodes and numbers every old language as before; the new pieces shorten the
    new language's lines; the new code is a target language (nmt translate --tgt-lang)."""
    family, d, imported, ckpt = grown
    old, new = (load_record(p).load_tokenizer() for p in (imported, ckpt))
    code = CODES[family][2]
    V = old.tgt_vocab_size
    assert old.languages.items() < new.languages.items() and new.languages[code] == V
    assert new.tgt_vocab_size == V + 1 + 30 and new.vocab_pieces()[1][:V] == old.vocab_pieces()[1]
    lines = fx.corpus_lines("test", "en", 40)
    fresh = [yy(line) for line in lines]
    assert sum(map(len, new.encode_tgt(fresh))) < 0.9 * sum(map(len, old.encode_tgt(fresh)))
    out = d / "out.yy"
    src = d / "in.es"
    src.write_text("\n".join(fx.corpus_lines("test", "es", 5)) + "\n", encoding="utf-8")
    assert main(["translate", "-c", ckpt, "-i", str(src), "-o", str(out), "--tgt-lang", code, "-q"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 5


@pytest.mark.slow
def test_exported_directory_gives_nmt_outputs_in_every_language(grown, tmp_path):
    """nmt export --format hf -> AutoTokenizer + AutoModelForSeq2SeqLM: greedy generate() with the new
    token forced equals nmt's greedy output on every line (and for an old language); NLLB's tokenizer
    takes the new code as tgt_lang and gives nmt's ids; `nmt import` of the directory and the
    CTranslate2 export translate alike."""
    from nmt import Translator

    family, d, _, ckpt = grown
    src_code, old_code, code, token = CODES[family]
    out = str(tmp_path / "hf")
    assert main(["export", "-c", ckpt, "--format", "hf", "-o", out]) == 0
    lines = fx.corpus_lines("test", "es", 30, skip=100)
    translator = Translator(ckpt, device="cpu")
    ours = [r.text for r in translator.translate(lines, tgt_lang=code)]
    assert generate(out, lines, token) == ours
    old_token = f"__{old_code}__" if family == "m2m100" else old_code
    assert generate(out, lines, old_token) == [r.text for r in translator.translate(lines, tgt_lang=old_code)]
    tok = transformers.AutoTokenizer.from_pretrained(out)
    targets = [yy(line) for line in fx.corpus_lines("test", "en", 30)]
    mine = load_record(ckpt).load_tokenizer()
    if family == "nllb":  # the directory's ids are nmt's
        tok.src_lang, tok.tgt_lang = src_code, code
        assert tok(text_target=targets)["input_ids"] == [[mine.languages[code]] + ids + [2]
                                                         for ids in mine.encode_tgt(targets)]
        assert tok(lines)["input_ids"] == [ids + [2] for ids in mine.encode_src(lines)]
    reimported = str(tmp_path / "reimported.pt")
    assert main(["import", out, "-o", reimported, "-q"]) == 0
    again = load_record(reimported).load_tokenizer()
    assert tok(targets)["input_ids"] == [ids + [2] for ids in again.encode_src(targets)]  # M2M100: renumbered ids
    assert [r.text for r in Translator(reimported, device="cpu").translate(lines, tgt_lang=code, beam_size=1)] == ours
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return  # (CTranslate2 is optional: pip install -e '.[ct2]')
    assert main(["export", "-c", ckpt, "-o", str(tmp_path / "ct2")]) == 0
    assert [r.text for r in Translator(str(tmp_path / "ct2"), device="cpu").translate(lines, tgt_lang=code)] == ours


@pytest.mark.slow
def test_a_new_source_language(grown, tmp_path):
    """A new language as the source language of a corpus (yy -> en beside es -> en): its training sources
    start with the new language's token, the other corpus's with the imported one; `--src-lang` puts it
    before every line; transformers on the `nmt export --format hf` directory, given that token, gives
    nmt's greedy outputs (NLLB's tokenizer takes the new code as src_lang and gives nmt's ids; M2M100's
    knows a fixed list of codes, so the token's id replaces the first one); CTranslate2 alike."""
    import yaml

    from nmt import Translator
    from nmt.config import config_from_dict
    from nmt.data.batches import load_data

    family, d, _, _ = grown
    src, tgt, new, token = CODES[family]
    raw = yaml.safe_load((d / "ft.yaml").read_text(encoding="utf-8"))
    for corpus, split in ((raw["data"]["train"][1], "train"), (raw["data"]["valid"][1], "dev")):
        corpus.update(src=str(d / f"{split}.yy"), tgt=str(d / f"{split}.en"), src_lang=new, tgt_lang=tgt)
    raw["data"]["add_languages"] = {new: None}
    raw.update(name="srcnew", output_dir=str(tmp_path / "runs"))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    assert main(["train", "--config", str(config), "-q"]) == 0
    run = tmp_path / "runs" / "srcnew"
    ckpt = str(run / "checkpoints" / "latest.pt")
    tok = load_record(ckpt).load_tokenizer()
    assert new in tok.languages and tok.languages[new] >= tok.languages[src]
    train = load_data(config_from_dict(raw), tok, str(run), log=lambda m: None).train  # the run's cached pairs
    firsts = [int(train.src(i)[0]) for i in range(len(train))]
    assert firsts == [tok.languages[src]] * train.parts[0] + [tok.languages[new]] * train.parts[1]

    lines = [yy(line) for line in fx.corpus_lines("test", "en", 20, skip=100)]
    ids = tok.encode_src(lines, new)
    assert [x[0] for x in ids] == [tok.languages[new]] * 20 and [x[1:] for x in ids] == [x[1:] for x in tok.encode_src(lines)]
    translator = Translator(ckpt, device="cpu")
    ours = [r.text for r in translator.translate(lines, src_lang=new, tgt_lang=tgt)]
    given = tmp_path / "in.yy"
    given.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    assert main(["translate", "-c", ckpt, "-i", str(given), "-o", str(out), "--src-lang", new, "--tgt-lang", tgt,
                 "-q"]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == ours

    import torch

    hf = str(tmp_path / "hf")
    assert main(["export", "-c", ckpt, "--format", "hf", "-o", hf]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
    if family == "nllb":
        hf_tok.src_lang = new
        batch = hf_tok(lines, return_tensors="pt", padding=True)
        assert hf_tok(lines)["input_ids"] == [x + [2] for x in ids]
    else:
        batch = hf_tok(lines, return_tensors="pt", padding=True)
        assert (batch["input_ids"][:, 0] == hf_tok.convert_tokens_to_ids(f"__{src}__")).all()
        batch["input_ids"][:, 0] = hf_tok.convert_tokens_to_ids(token)
    tgt_token = tgt if family == "nllb" else f"__{tgt}__"
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=1, forced_bos_token_id=hf_tok.convert_tokens_to_ids(tgt_token))
    assert hf_tok.batch_decode(generated, skip_special_tokens=True) == ours
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return  # (CTranslate2 is optional: pip install -e '.[ct2]')
    assert main(["export", "-c", ckpt, "-o", str(tmp_path / "ct2")]) == 0
    ct2 = Translator(str(tmp_path / "ct2"), device="cpu")
    assert [r.text for r in ct2.translate(lines, src_lang=new, tgt_lang=tgt)] == ours


@pytest.mark.slow
def test_data_src_lang_becomes_the_default_source_language(grown, tmp_path, capsys):
    """data.src_lang a new language (the old corpus naming its own): NLLB's fine-tuned model puts the
    new token first without --src-lang, and the exported tokenizer's src_lang is the new code; M2M100's
    tokenizer cannot take a new code as src_lang: a one-line error says to name it per corpus."""
    import yaml

    from nmt import Translator

    family, d, _, _ = grown
    src, tgt, new, _ = CODES[family]
    raw = yaml.safe_load((d / "ft.yaml").read_text(encoding="utf-8"))
    raw["data"].update(src_lang=new, add_languages={new: None})
    for corpus in (raw["data"]["train"][0], raw["data"]["valid"][0]):
        corpus.update(src_lang=src)
    for corpus, split in ((raw["data"]["train"][1], "train"), (raw["data"]["valid"][1], "dev")):
        corpus.update(src=str(d / f"{split}.yy"), tgt=str(d / f"{split}.en"), tgt_lang=tgt)
    raw.update(name="default", output_dir=str(tmp_path / "runs"))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    capsys.readouterr()
    if family == "m2m100":
        assert main(["train", "--config", str(config), "-q"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"data.src_lang: {new!r} is a new language, which transformers' " \
                                          "M2M100Tokenizer cannot take" in err, err
        raw["data"].pop("add_languages")  # a model that learnt it in an earlier run: still not a code it can take
        raw["data"]["tokenizer"]["add_pieces"] = 0
        raw["train"]["init_from"] = grown[3]
        config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
        assert main(["train", "--config", str(config), "-q"]) == 2
        assert "M2M100Tokenizer cannot take" in capsys.readouterr().err
        return
    assert main(["train", "--config", str(config), "-q"]) == 0
    ckpt = str(tmp_path / "runs" / "default" / "checkpoints" / "latest.pt")
    tok = load_record(ckpt).load_tokenizer()
    lines = [yy(line) for line in fx.corpus_lines("test", "en", 10, skip=100)]
    assert [ids[0] for ids in tok.encode_src(lines)] == [tok.languages[new]] * 10
    translator = Translator(ckpt, device="cpu")
    assert [r.text for r in translator.translate(lines)] == [r.text for r in translator.translate(lines, src_lang=new)]
    hf = str(tmp_path / "hf")
    assert main(["export", "-c", ckpt, "--format", "hf", "-o", hf]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf)
    assert hf_tok.src_lang == new and hf_tok(lines)["input_ids"] == [ids + [2] for ids in tok.encode_src(lines)]


@pytest.mark.slow
def test_an_unknown_source_language_is_one_line(grown, tmp_path, capsys):
    """--src-lang names a language the model lacks: one line, exit 2, no output file."""
    family, d, _, ckpt = grown
    given = tmp_path / "in.es"
    given.write_text("hola\n", encoding="utf-8")
    out = tmp_path / "out"
    capsys.readouterr()
    bad = "zzz_Zzzz" if family == "nllb" else "zz"
    assert main(["translate", "-c", ckpt, "-i", str(given), "-o", str(out), "--src-lang", bad, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown source language {bad!r} for this model" in err and not out.exists()
    from nmt import Translator
    from nmt.commands.batcher import Settings
    from nmt.commands.serve_request import RequestError, check_options

    translator = Translator(ckpt, device="cpu")
    with pytest.raises(RequestError) as e:  # a request's "options" of nmt serve
        check_options(translator, {"src_lang": bad}, Settings())
    assert e.value.status == 400 and f"unknown source language {bad!r}" in str(e.value)
    assert check_options(translator, {"src_lang": CODES[family][0]}, Settings()).src_lang == CODES[family][0]


@pytest.mark.slow
@pytest.mark.parametrize("grown", ["nllb"], indirect=True)  # (M2M100 numbers every piece in vocab.json)
def test_a_grown_nllb_vocabulary_is_not_grown_again(grown, tmp_path, capsys):
    """NLLB numbers appended pieces from one recorded place (settings added_pieces): a second growth
    with pieces is a one-line error naming data.tokenizer.add_pieces."""
    import yaml

    family, d, _, ckpt = grown
    raw = yaml.safe_load((d / "ft.yaml").read_text(encoding="utf-8"))
    raw["data"]["train"][1].update(tgt_lang="qyb_Latn")
    raw["data"]["valid"][1].update(tgt_lang="qyb_Latn")
    raw["data"]["add_languages"] = {"qyb_Latn": None}
    raw["train"].update(init_from=ckpt)
    raw.update(name="again", output_dir=str(tmp_path / "runs"))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    capsys.readouterr()
    assert main(["train", "--config", str(config), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.tokenizer.add_pieces: the vocabulary of the NLLB model" in err, err

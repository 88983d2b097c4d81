"""Config loading: defaults, every error kind, overrides, round trip."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from nmt.config import (Config, ConfigError, DecodeConfig, ModelConfig, TrainConfig, apply_overrides,
                        config_from_dict, dump_config, load_config)

from helpers import ROOT, config_errors, one_line_error, run_nmt, tiny_config_dict, write_yaml


@pytest.fixture
def files(tmp_path):
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt"):
        (tmp_path / name).write_text("a b c\n", encoding="utf-8")
    return tmp_path


def write(tmp_path, raw: dict, name="cfg.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def minimal(d) -> dict:
    return {"data": {"src_lang": "de", "tgt_lang": "en",
                     "train": {"src": str(d / "train.src"), "tgt": str(d / "train.tgt")},
                     "valid": {"src": str(d / "valid.src"), "tgt": str(d / "valid.tgt")}}}


def errors_of(tmp_path, raw, overrides=None) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, raw), overrides)
    return e.value.errors


def test_defaults_filled_in(files):
    cfg = load_config(write(files, minimal(files), "myrun.yaml"))
    assert isinstance(cfg, Config)
    assert cfg.model == ModelConfig() and cfg.train == TrainConfig() and cfg.decode == DecodeConfig()
    assert cfg.name == "myrun"  # named after the file when `name` is absent
    assert cfg.run_dir == os.path.join("runs", "myrun")
    assert cfg.data.train.kind == "text" and cfg.data.test is None
    assert cfg.model.n_encoder_layers == cfg.model.layers == 6
    assert cfg.train.betas == (0.9, 0.98)


def test_unknown_key_suggests_closest(files):
    raw = minimal(files)
    raw["train"] = {"warmup": 100}
    (err,) = errors_of(files, raw)
    assert err == "unknown key 'train.warmup' - did you mean 'train.warmup_steps'?"


def test_unknown_key_without_close_match_lists_valid_keys(files):
    raw = minimal(files)
    raw["decode"] = {"zzzzzz": 1}
    (err,) = errors_of(files, raw)
    assert "unknown key 'decode.zzzzzz'" in err and "beam_size" in err


def test_unknown_section(files):
    raw = minimal(files)
    raw["trian"] = {}
    (err,) = errors_of(files, raw)
    assert err == "unknown key 'trian' - did you mean 'train'?"


@pytest.mark.parametrize("key,value,expect", [
    ("lr", "fast", "invalid value for 'train.lr': 'fast' (expected a number)"),
    ("lr", 0, "invalid value for 'train.lr': 0.0 (must be > 0)"),
    ("warmup_steps", -5, "invalid value for 'train.warmup_steps': -5 (must be >= 0)"),
    ("warmup_steps", 1.5, "invalid value for 'train.warmup_steps': 1.5 (expected an integer)"),
    ("compile", "yes", "invalid value for 'train.compile': 'yes' (expected true or false)"),
    ("precision", "fp8", "invalid value for 'train.precision': 'fp8' (choose from auto, fp32, bf16, fp16)"),
    ("label_smoothing", 1.5, "invalid value for 'train.label_smoothing': 1.5 (must be <= 1)"),
    ("betas", [0.9], "invalid value for 'train.betas': [0.9] (expected a list of 2 numbers)"),
])
def test_wrong_type_or_range_names_key_and_value(files, key, value, expect):
    raw = minimal(files)
    raw["train"] = {key: value}
    assert errors_of(files, raw) == [expect]


@pytest.mark.parametrize("key,value,expect", [
    ("length_penalty", 1e300, "invalid value for 'decode.length_penalty': 1e+300 (must be <= 10)"),
    ("patience", 1e300, "invalid value for 'decode.patience': 1e+300 (must be <= 1000)"),
])
def test_decode_values_that_would_overflow_the_search_are_refused(files, key, value, expect):
    """A length penalty or patience of 1e300 passed the check and ended in an OverflowError traceback in
    the search (lp = ((5 + len) / 6) ** alpha, round(beam * patience))."""
    raw = minimal(files)
    raw["decode"] = {key: value}
    assert errors_of(files, raw) == [expect]


def test_missing_required_keys(files):
    raw = minimal(files)
    del raw["data"]["src_lang"]
    del raw["data"]["valid"]
    errs = errors_of(files, raw)
    assert "missing required key 'data.src_lang'" in errs
    assert "missing required key 'data.valid'" in errs


def test_missing_data_file(files):
    raw = minimal(files)
    raw["data"]["train"]["tgt"] = str(files / "nope.tgt")
    (err,) = errors_of(files, raw)
    assert err == f"data file not found: 'data.train.tgt': {files / 'nope.tgt'}"


def test_all_errors_reported_together(files):
    raw = minimal(files)
    raw["model"] = {"d_modle": 3, "layers": 0}
    raw["train"] = {"lr": -1}
    errs = errors_of(files, raw)
    assert len(errs) == 3
    assert any("model.d_model" in e for e in errs) and any("model.layers" in e for e in errs)


def test_cross_field_checks(files):
    raw = minimal(files)
    raw["model"] = {"d_model": 100, "n_heads": 8}
    raw["data"]["tokenizer"] = {"joint": False, "model": "x.model"}
    errs = errors_of(files, raw)
    assert any("'model.n_heads': 8 (must divide model.d_model=100)" in e for e in errs)
    assert any("share_embeddings" in e for e in errs)


def test_patience_rules(files):
    """patience must leave at least one finished hypothesis, and no more n-best than the search keeps."""
    from nmt.config import ConfigError, decode_config
    from nmt.schema import DecodeConfig

    with pytest.raises(ConfigError, match=r"'decode.patience': 0.1 \(beam_size \* patience rounds to 0"):
        decode_config(DecodeConfig(), dict(beam_size=4, patience=0.1))
    with pytest.raises(ConfigError, match=r"'decode.nbest': 4 .* = 2 finished hypotheses"):
        decode_config(DecodeConfig(), dict(beam_size=4, nbest=4, patience=0.5))
    assert decode_config(DecodeConfig(), dict(beam_size=4, nbest=2, patience=0.5)).patience == 0.5
    assert decode_config(DecodeConfig(), dict(beam_size=1, patience=0.1)).patience == 0.1  # greedy: no beam to stop


def test_max_finished_rounds_as_ctranslate2_does():
    """round(float32(K) * float32(p)), half away from zero (CTranslate2's std::round on floats): numpy's
    float32 arithmetic as the reference; e.g. K=25, p=0.58 gives 15 (14 in float64)."""
    import numpy as np

    from nmt.schema import max_finished

    for K in range(1, 41):
        for i in range(1, 301):
            p = i / 100
            prod = np.float32(K) * np.float32(p)
            want = int(np.floor(prod)) + (1 if prod - np.floor(prod) >= 0.5 else 0)
            assert max_finished(K, p) == want, (K, p)
    assert max_finished(25, 0.58) == 15 and max_finished(30, 1.05) == 31 and max_finished(5, 0.0) == 0


def test_hf_source_and_requirements(files):
    raw = minimal(files)
    raw["data"]["train"] = {"hf_path": "wmt14", "hf_name": "de-en"}
    cfg = load_config(write(files, raw))
    assert cfg.data.train.kind == "hf" and cfg.data.train.hf_split == "train"
    raw["data"]["train"] = {"hf_path": "json"}
    assert errors_of(files, raw) == ["'data.train.hf_path: json' needs 'data.train.hf_data_files'"]


def test_several_training_corpora(files):
    raw = minimal(files)
    one = dict(raw["data"]["train"])
    raw["data"]["train"] = [one, {**one, "weight": 0.25, "src_tag": "<BT>"}]
    cfg = load_config(write(files, raw))
    assert [c.weight for c in cfg.data.train_corpora] == [1.0, 0.25] and cfg.data.train[1].src_tag == "<BT>"
    assert load_config(write(files, yaml.safe_load(dump_config(cfg)), "resolved.yaml")) == cfg  # round trip
    single = load_config(write(files, minimal(files), "single.yaml"))
    assert single.data.train_corpora == (single.data.train,) and single.data.train_key(0) == "data.train"
    assert "weight: 1.0" in dump_config(single)  # a single mapping stays a mapping
    assert "- src:" not in dump_config(single)
    path = write(files, raw, "two.yaml")
    over = load_config(path, ["data.train[1].weight=3", "data.train[0].src_tag=<R>"])
    assert [(c.weight, c.src_tag) for c in over.data.train] == [(1.0, "<R>"), (3.0, "<BT>")]
    with pytest.raises(ConfigError) as e:
        load_config(path, ["data.train.weight=3"])
    assert e.value.errors == ["invalid override 'data.train.weight=3': 'data.train' is a list; name an item, "
                              "e.g. data.train[0].weight=..."]
    with pytest.raises(ConfigError, match=r"'data.train' has no item 2 \(it is a list of 2\)"):
        load_config(path, ["data.train[2].weight=3"])


@pytest.mark.parametrize("train,valid,expected", [
    ([{"weight": 0}, {"weight": 0.0}], {}, ["the weights of 'data.train' sum to 0 (at least one corpus needs a weight > 0)"]),
    ([{"weight": -1}], {}, ["invalid value for 'data.train[0].weight': -1.0 (must be >= 0)"]),
    ([{}, {"weight": float("nan")}], {}, ["invalid value for 'data.train[1].weight': nan (must be a finite number)"]),
    ([{"src_tag": "BT"}], {}, ["invalid value for 'data.train[0].src_tag': 'BT' (expected <NAME> with NAME made of "
                               "letters, digits, '_', '-' and '.', e.g. <BT>)"]),
    ([{"src_tag": "<B T>"}], {}, ["invalid value for 'data.train[0].src_tag': '<B T>' (expected <NAME> with NAME made "
                                  "of letters, digits, '_', '-' and '.', e.g. <BT>)"]),
    ([{"src_tag": "<unk>"}], {}, ["invalid value for 'data.train[0].src_tag': '<unk>' (reserved for SentencePiece's "
                                  "special tokens <pad>, <unk>, <s>, </s>; choose another name, e.g. <BT>)"]),
    ([{"wieght": 2}], {}, ["unknown key 'data.train[0].wieght' - did you mean 'data.train[0].weight'?"]),
    ([{}], {"weight": 2, "src_tag": "<BT>"},
     ["'data.valid.weight' is set, but weights apply only to training corpora (data.train)",
      "'data.valid.src_tag' is set, but tags apply only to training corpora (data.train)"]),
    ([], {}, ["'data.train' is an empty list (give at least one corpus)"]),
])
def test_weight_and_tag_errors(files, train, valid, expected):
    raw = minimal(files)
    one = raw["data"]["train"]
    raw["data"]["train"] = [{**one, **c} for c in train]
    raw["data"]["valid"].update(valid)
    assert errors_of(files, raw) == expected


def test_overrides_apply_and_validate(files):
    path = write(files, minimal(files))
    cfg = load_config(path, ["train.lr=5e-4", "model.layers=4", "data.tokenizer.vocab_size=1000", "name=x"])
    assert cfg.train.lr == 5e-4 and cfg.model.layers == 4 and cfg.data.tokenizer.vocab_size == 1000 and cfg.name == "x"
    with pytest.raises(ConfigError) as e:
        load_config(path, ["train.warmup=3"])
    assert e.value.errors == ["unknown key 'train.warmup' - did you mean 'train.warmup_steps'?"]
    with pytest.raises(ConfigError):
        load_config(path, ["train.lr"])  # no '='
    # overrides never modify the caller's dict
    raw = minimal(files)
    apply_overrides(raw, ["data.src_lang=fr"])
    assert raw["data"]["src_lang"] == "de"


def test_round_trip_of_resolved_config(files):
    cfg = load_config(write(files, minimal(files)), ["train.betas=[0.9, 0.997]", "decode.beam_size=4"])
    again = load_config(write(files, yaml.safe_load(dump_config(cfg)), "resolved.yaml"))
    assert again == cfg


def test_bad_yaml_and_missing_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(str(bad))
    assert "invalid YAML at line" in e.value.errors[0]
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path / "none.yaml"))
    assert e.value.errors == [f"config file not found: {tmp_path / 'none.yaml'}"]


@pytest.mark.slow
def test_config_docs_are_current():
    """configs/README.md's key table is generated from the dataclasses; it must not drift."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_config_docs.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_field_is_documented():
    from nmt.config import iter_fields
    for key, _, _, help in iter_fields():
        assert help.strip(), f"{key} has no help text"


@pytest.mark.parametrize("model, positions, offset", [
    ({}, "sinusoidal_fairseq", 1),  # pre-norm, nmt's default: M2M100's table (first position pad id 0 + 1)
    ({"norm": "post"}, "sinusoidal_halves", 0),  # MarianMT's
    ({"positions": "learned"}, "learned", 0),
    ({"positions": "sinusoidal"}, "sinusoidal", 0),  # the paper's, as models trained before stored it
    ({"norm": "post", "positions": "sinusoidal_fairseq"}, "sinusoidal_fairseq", 1),
    ({"positions": "sinusoidal_fairseq", "position_offset": 2}, "sinusoidal_fairseq", 2),
    ({"positions": None, "position_offset": None}, "sinusoidal_fairseq", 1),
])
def test_position_defaults_are_a_hugging_face_familys(files, model, positions, offset):
    """Left out (or null), `positions` is the table of the Hugging Face family with the model's norm, and
    `position_offset` the one that family numbers positions with: what `nmt export --format hf` needs.
    The resolved values are what a dumped config (and a checkpoint) holds."""
    cfg = load_config(write(files, {**minimal(files), "model": model}))
    assert (cfg.model.positions, cfg.model.position_offset) == (positions, offset)
    dumped = yaml.safe_load(dump_config(cfg))["model"]
    assert (dumped["positions"], dumped["position_offset"]) == (positions, offset)


def test_learned_positions_with_an_offset_are_refused(files):
    errors = errors_of(files, {**minimal(files), "model": {"positions": "learned", "position_offset": 1}})
    assert errors == ["invalid value for 'model.position_offset': 1 (must be 0 with learned positions)"]


def test_exact_stop_is_the_default_for_nmts_own_models(files):
    """decode.stopping defaults to the exact stop (transformers' heuristic, `hf`, is what `nmt import`
    chooses for models whose generation config asks for it); every recipe keeps it."""
    import glob

    assert load_config(write(files, minimal(files))).decode.stopping == "exact" == DecodeConfig().stopping
    for path in glob.glob(os.path.join(ROOT, "configs", "*.yaml")):
        assert load_config(path, check_files=False).decode.stopping == "exact", path
    assert load_config(write(files, {**minimal(files), "decode": {"stopping": "hf"}})).decode.stopping == "hf"
    assert errors_of(files, {**minimal(files), "decode": {"stopping": "never"}}) == [
        "invalid value for 'decode.stopping': 'never' (choose from exact, hf)"]


# --------------------------------------------------------------------------- values and YAML the loader refuses

@pytest.mark.slow
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", ".nan", "1e999"])
def test_non_finite_floats_are_rejected(tmp_path, value):
    raw = tiny_config_dict(str(tmp_path))
    path = write_yaml(tmp_path / "c.yaml", raw)
    with pytest.raises(ConfigError, match="train.lr.*finite"):
        load_config(path, [f"train.lr={value}"])
    with pytest.raises(ConfigError, match="decode.length_penalty.*finite"):
        load_config(path, [f"decode.length_penalty={value}"])
    one_line_error(run_nmt("train", "--config", path, "--check", "--set", f"model.dropout={value}"), 2, "finite")


@pytest.mark.slow
def test_yaml_aliases_are_refused(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi"))
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    t0 = time.perf_counter()
    proc = run_nmt("train", "--config", str(path), "--check")
    assert time.perf_counter() - t0 < 60
    one_line_error(proc, 2, "alias")
    merge = tmp_path / "merge.yaml"
    raw = tiny_config_dict(str(tmp_path))
    merge.write_text("base: &base {lr: 0.1}\n" + yaml.safe_dump(raw) + "extra: *base\n")
    with pytest.raises(ConfigError, match="alias"):
        load_config(str(merge))


# --------------------------------------------------------------------------- the schedule against the budget, reserved tags, the generated docs

@pytest.mark.slow
def test_a_warmup_as_long_as_the_step_budget_is_one_line_error(tmp_path):
    """warmup_steps 4000 with max_steps 30 reached 0.8% of the peak lr and exited 0."""
    raw = tiny_config_dict(str(tmp_path), warmup_steps=4000, max_steps=30)
    (err,) = config_errors(raw)
    assert "'train.warmup_steps: 4000'" in err and "'train.max_steps: 30'" in err
    for warmup, ok in ((30, False), (29, True), (0, True)):
        raw["train"].update(warmup_steps=warmup)
        if ok:
            config_from_dict(raw)
        else:
            config_errors(raw)
    path = write_yaml(tmp_path / "c.yaml", tiny_config_dict(str(tmp_path), warmup_steps=4000, max_steps=30))
    one_line_error(run_nmt("train", "--config", path, "--check"), 2, "nmt train: error: 'train.warmup_steps: 4000'",
                   "train.max_steps")


@pytest.mark.slow
def test_a_time_clock_takes_its_warmup_as_a_fraction(tmp_path):
    """With schedule_clock: time, warmup_steps counted seconds: its default 4000 swallowed an 8-second
    budget (peak 6e-6 for lr 3e-3). warmup_steps now always counts steps, so a time clock needs
    warmup_fraction (or no warmup)."""
    timed = dict(schedule="cosine", schedule_clock="time", max_time=8.0, max_steps=0, lr=3e-3)
    raw = tiny_config_dict(str(tmp_path), **timed, warmup_steps=4000)
    (err,) = config_errors(raw)
    assert "'train.warmup_steps: 4000'" in err and "'train.warmup_fraction'" in err and "schedule_clock: time" in err
    del raw["train"]["warmup_steps"]  # the default (4000) too
    assert config_errors(raw) == [err]
    config_from_dict(tiny_config_dict(str(tmp_path), **timed, warmup_fraction=0.1))
    config_from_dict(tiny_config_dict(str(tmp_path), **timed, warmup_steps=0))
    with open(os.path.join(ROOT, "configs", "quickstart-30min.yaml"), encoding="utf-8") as f:
        recipe = yaml.safe_load(f)
    del recipe["train"]["warmup_fraction"]  # the case: the lr ended at 0.45x its peak, no decay
    path = write_yaml(tmp_path / "q.yaml", recipe)
    one_line_error(run_nmt("train", "--config", path, "--check"), 2, "'train.warmup_fraction'")


def test_warmup_fraction_needs_a_budget_it_is_a_share_of(tmp_path):
    """warmup_fraction with an epochs-only budget gave no warmup at all."""
    raw = tiny_config_dict(str(tmp_path), warmup_fraction=0.1, max_steps=0, max_epochs=3)
    (err,) = config_errors(raw)
    assert "'train.warmup_fraction: 0.1'" in err and "train.max_steps" in err and "train.warmup_steps" in err
    raw["train"].update(max_time=60.0)  # a time budget with the step clock: still no step budget
    assert config_errors(raw) == [err]
    config_from_dict(tiny_config_dict(str(tmp_path), warmup_fraction=0.1, max_steps=100))


@pytest.mark.parametrize("value", [1.0, 1.5])
def test_warmup_fraction_has_one_range(tmp_path, value):
    """1.5 said "must be <= 1" and 1.0 "must be < 1"."""
    raw = tiny_config_dict(str(tmp_path), warmup_fraction=value)
    assert config_errors(raw) == [f"invalid value for 'train.warmup_fraction': {value} (must be < 1)"]


def test_a_checkpoint_stays_loadable_when_the_schedule_rules_grow(tmp_path):
    """Rules about starting training (the schedule against the budget, init_from) are not applied to
    the config of a trained model: checkpoints of older runs still translate."""
    raw = tiny_config_dict(str(tmp_path), warmup_steps=4000, max_steps=30, init_from=str(tmp_path / "gone.pt"))
    assert len(config_errors(raw)) == 2
    cfg = config_from_dict(raw, training=False, check_files=False)
    assert cfg.train.warmup_steps == 4000


def test_a_tag_that_is_a_placeholder_is_refused(tmp_path):
    raw = tiny_config_dict(str(tmp_path))
    raw["data"]["train"]["src_tag"] = "<ph_0>"
    (err,) = config_errors(raw)
    assert err.startswith("invalid value for 'data.train.src_tag': '<ph_0>' (reserved for the placeholders")
    raw["data"]["train"]["src_tag"] = "<ph>"
    config_from_dict(raw)


def test_config_docs_show_the_alignment_separator():
    """configs/README.md showed ` /// ` (the generator replaced pipes instead of escaping them)."""
    with open(os.path.join(ROOT, "configs", "README.md"), encoding="utf-8") as f:
        row = next(line for line in f if line.startswith("| `decode.alignment`"))
    assert "after ` ||| `" in row.replace("\\|", "|") and "///" not in row


def test_decode_keys_written_before_the_sections_load_into_them(tmp_path):
    """Configs and checkpoints written with the flat decode keys (sampling, topk, ..., glossary_beam_size,
    contrast_lang, ...) load into the sections with the same values, as the flags and options name them;
    a flat key wins over the same key in its section; the removed glossary_annotate is dropped at its old
    default and refused otherwise."""
    from nmt.config import decode_config, decode_value, to_dict
    from nmt.schema import DECODE_FLAT

    flat = {"sampling": "topp", "topk": 3, "topp": 0.5, "temperature": 0.7, "seed": 4, "glossary_constrain": "missing",
            "glossary_margin": 2.0, "glossary_beam_size": 8, "glossary_length_penalty": 0.6, "contrast_lang": "fr",
            "contrast_weight": 0.2, "glossary_annotate": False}
    assert set(flat) - {"glossary_annotate"} == set(DECODE_FLAT)
    raw = tiny_config_dict(str(tmp_path))
    raw["decode"] = {**raw.get("decode", {}), **flat}
    for dec in (config_from_dict(raw, check_files=False).decode, decode_config(flat)):
        assert {k: decode_value(dec, k) for k in DECODE_FLAT} == {k: flat[k] for k in DECODE_FLAT}
        assert dec.sampling.method == "topp" and dec.glossary.beam_size == 8 and dec.contrast.lang == "fr"
        assert decode_config(dec) == dec and decode_config(yaml.safe_load(yaml.safe_dump(to_dict(dec)))) == dec
    both = decode_config({"glossary": {"beam_size": 4, "margin": 3.0}, "glossary_beam_size": 6})
    assert (both.glossary.beam_size, both.glossary.margin) == (6, 3.0)
    assert decode_config(None, {"sampling": "topk", "seed": "7"}).sampling == decode_config(
        {"sampling": {"method": "topk", "seed": 7}}).sampling
    with pytest.raises(ConfigError, match="'decode.glossary_annotate' was removed"):
        decode_config({"glossary_annotate": True})


@pytest.mark.parametrize("data, message", [
    (dict(length_buckets=[16, 8]), "increasing whole numbers >= 2"),
    (dict(length_buckets=[16, 32]), "its last bucket 32 must hold the longest training pair (data.max_len + 2 = 42)"),
    (dict(length_buckets=[16, 128]), "and fit model.max_positions (64)"),
    (dict(length_buckets=[16, 42], same_source_length=True), "choose one"),
    (dict(collate="gpu"), "invalid value for 'data.collate': 'gpu' (choose from host, device)")])
def test_batch_shape_keys_are_checked(tmp_path, data, message):
    """Issue 56's data keys: a bucket list that leaves pairs without a bucket or passes the model's positions
    (a shape per leftover length, or a batch the model refuses mid-epoch) is a config error."""
    raw = tiny_config_dict(str(tmp_path))  # max_len 40, max_positions 64
    raw["data"].update(data)
    (err,) = config_errors(raw)
    assert message in err
    raw["data"].update(length_buckets=[16, 42], same_source_length=False, collate="device")
    config_from_dict(raw)


def test_a_key_given_twice_and_a_run_name_outside_output_dir_are_refused(tmp_path):
    """An appended `train: {lr: ...}` replaced the whole first train section (max_steps 30 became 0, no limit);
    `--set name=..` made the run directory output_dir's parent, `name: /tmp/x` one outside it."""
    raw = tiny_config_dict(str(tmp_path))
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump(raw) + "train: {lr: 0.0005}\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'train' at line \d+"):
        load_config(str(path))
    path.write_text(yaml.safe_dump(raw).replace("model:\n", "model:\n  layers: 1\n  layers: 2\n", 1))
    with pytest.raises(ConfigError, match="duplicate key 'layers'"):
        load_config(str(path))
    for name, ok in [("..", False), (".", False), ("/tmp/x", False), ("a/../..", False), ("", False),
                     ("run-1", True), ("de-en/base", True)]:
        errors = [] if ok else config_errors({**raw, "name": name}, check_files=False)
        assert ok or any("invalid value for 'name'" in e for e in errors), name
        if ok:
            config_from_dict({**raw, "name": name}, check_files=False)
    config_from_dict({**raw, "name": ".."}, check_files=False, training=False)  # a checkpoint's config still loads


@pytest.mark.slow
def test_the_runs_own_config_is_never_rewritten_from_under_its_user(tmp_path):
    """A hand-written output_dir/name/config.yaml given as --config lost its comments, and --set values were written
    into it: the run's config.yaml is rewritten only when its settings change, and --set over it is refused."""
    from nmt.config import same_settings, save_config

    raw = tiny_config_dict(str(tmp_path))
    run_dir = tmp_path / "runs" / "own"
    run_dir.mkdir(parents=True)
    own = run_dir / "config.yaml"
    text = "# my notes\n" + yaml.safe_dump({**raw, "name": "own", "output_dir": str(tmp_path / "runs")})
    own.write_text(text)
    cfg = load_config(str(own))
    assert same_settings(str(own), cfg)
    save_config(cfg, str(own))
    assert own.read_text() == text
    one_line_error(run_nmt("train", "--config", str(own), "--set", "train.max_steps=400", "--check"), 2,
                   "is the run's own config.yaml", "copy it out of the run directory")
    assert own.read_text() == text and run_nmt("train", "--config", str(own), "--check").returncode == 0
    changed = load_config(str(own), ["train.max_steps=400"])
    save_config(changed, str(tmp_path / "other.yaml"))  # any other file: written as resolved
    assert (tmp_path / "other.yaml").read_text() == dump_config(changed) and not same_settings(str(own), changed)


def test_a_beam_beyond_max_beam_is_refused(tmp_path):
    """`--beam 1000000000` passed the check and failed mid-search asking for gigabytes (a traceback, or the process
    killed)."""
    from nmt.schema import MAX_BEAM

    raw = tiny_config_dict(str(tmp_path))
    for key in ("beam_size", "glossary_beam_size"):
        (err,) = config_errors({**raw, "decode": {**raw["decode"], key: MAX_BEAM + 1}}, check_files=False)
        assert f"(must be <= {MAX_BEAM})" in err, err
    config_from_dict({**raw, "decode": {**raw["decode"], "beam_size": MAX_BEAM}}, check_files=False)

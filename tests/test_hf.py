"""nmt.interop.hf: Hugging Face MarianMT and M2M100/NLLB models imported into nmt's Transformer.

The reference is transformers itself (a test-only dependency): tiny models built with its own
classes (random weights, every tensor perturbed so that a miswired norm, bias or tie would show),
saved with `save_pretrained`, imported, and compared with transformers' forward pass.
"""

from __future__ import annotations

import inspect

import json
import os
import subprocess
import sys

import pytest
import torch

from nmt.errors import UserError

transformers = pytest.importorskip(  # the reference semantics are transformers 5's (embedding ties)
    "transformers", minversion="5.0", reason="transformers >= 5 is a test-only dependency: pip install -e '.[dev]'")
pytest.importorskip("safetensors", reason="transformers checkpoints are safetensors files: pip install safetensors")

from nmt.interop.hf import (architecture, architecture_from_nmt, config_to_hf, import_weights, read_config,  # noqa: E402
                    read_weights, weights_to_hf, weights_to_nmt)

pytestmark = pytest.mark.usefixtures("one_thread")
TOLERANCE = 1e-4  # max abs logit difference, fp32
SIZES = dict(d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
             encoder_layers=2, decoder_layers=3, max_position_embeddings=64, dropout=0.1)

# MarianMT: eos 0, unk 1, pad = decoder start = the last id. M2M100: bos 0, pad 1, eos 2 = decoder start.
MARIAN = {
    "opus-mt": dict(vocab_size=100, pad_token_id=99, decoder_start_token_id=99, eos_token_id=0,
                    activation_function="swish", scale_embedding=True),
    "separate-vocabs": dict(vocab_size=100, decoder_vocab_size=80, share_encoder_decoder_embeddings=False,
                            pad_token_id=79, decoder_start_token_id=79, eos_token_id=0, activation_function="gelu"),
    "untied": dict(vocab_size=100, tie_word_embeddings=False, pad_token_id=99, decoder_start_token_id=99,
                   eos_token_id=0, activation_function="relu", scale_embedding=True),
}
M2M100 = {
    "m2m100": dict(vocab_size=100, activation_function="relu", scale_embedding=True),
    "untied-gelu": dict(vocab_size=100, tie_word_embeddings=False, activation_function="gelu", scale_embedding=False),
}
VARIANTS = [("marian", k) for k in MARIAN] + [("m2m_100", k) for k in M2M100]


def hf_model(family: str, variant: str, seed: int = 0):
    """A tiny transformers model (eval mode) with every weight perturbed off its initialisation."""
    torch.manual_seed(seed)
    if family == "marian":
        model = transformers.MarianMTModel(transformers.MarianConfig(**SIZES, **MARIAN[variant]))
    else:
        model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**SIZES, **M2M100[variant]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:  # Marian's fixed table is a (frozen) parameter
                p.add_(0.3 * torch.randn_like(p))
        if family == "marian":
            model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias))
    return model.eval()


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{f}-{v}" for f, v in VARIANTS])
def saved(request, tmp_path_factory):
    """(transformers model, its save_pretrained directory, imported nmt model, HFArchitecture)."""
    family, variant = request.param
    model = hf_model(family, variant)
    path = str(tmp_path_factory.mktemp(f"{family}-{variant}"))
    model.save_pretrained(path)
    ours, arch, _ = import_weights(path)
    return model, path, ours, arch


def padded_batch(model, lengths: list[int], seed: int, start: bool):
    """Right-padded ids [B,L] and mask: sources end with EOS; decoder inputs begin with the decoder start."""
    c = model.config
    vocab = c.decoder_vocab_size if start and c.model_type == "marian" else c.vocab_size
    specials = {c.pad_token_id, c.eos_token_id, c.decoder_start_token_id}
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), c.pad_token_id)
    for row, n in enumerate(lengths):
        tokens = [t for t in torch.randint(0, vocab, (4 * n,), generator=g).tolist() if t not in specials][:n - 1]
        ids[row, :n] = torch.tensor([c.decoder_start_token_id] + tokens if start else tokens + [c.eos_token_id])
    mask = torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    return ids, mask


def max_diff(a, b, mask) -> float:
    return (a - b).abs()[mask].max().item()


# --------------------------------------------------------------------------- against transformers

@torch.no_grad()
def test_logits_and_encoder_output_match_transformers(saved):
    model, _, ours, _ = saved
    src, src_mask = padded_batch(model, [7, 3, 11, 5], seed=1, start=False)
    tgt, tgt_mask = padded_batch(model, [6, 9, 2, 4], seed=2, start=True)
    theirs = model(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt)
    memory = ours.encode(src, src_mask)
    assert max_diff(memory, theirs.encoder_last_hidden_state, src_mask) <= TOLERANCE
    logits = ours.decode(tgt, memory, src_mask)
    assert logits.shape == theirs.logits.shape
    assert max_diff(logits, theirs.logits, tgt_mask) <= TOLERANCE
    assert theirs.logits[tgt_mask].std() > 1.0  # the logits are far from uniform: a miswiring would show


@torch.no_grad()
def test_cached_steps_match_the_full_forward(saved):
    model, _, ours, _ = saved
    src, src_mask = padded_batch(model, [8, 4, 6], seed=3, start=False)
    tgt, _ = padded_batch(model, [7, 7, 7], seed=4, start=True)
    theirs = model(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits
    cache = ours.init_cache(ours.encode(src, src_mask), src_mask, max_len=tgt.shape[1])
    steps = torch.stack([ours.decode_step(tgt[:, t], cache) for t in range(tgt.shape[1])], dim=1)
    assert (steps - theirs).abs().max().item() <= TOLERANCE


@torch.no_grad()
def test_greedy_tokens_match_transformers_step_by_step(saved):
    """Greedy decoding with transformers' own cache (use_cache, one token per call) against ours."""
    model, _, ours, _ = saved
    src, src_mask = padded_batch(model, [9, 5], seed=5, start=False)
    start = model.config.decoder_start_token_id
    cache = ours.init_cache(ours.encode(src, src_mask), src_mask, max_len=8)
    tokens = torch.full((2,), start)
    past, enc = None, None
    # transformers renamed `past_key_values` to `cache` during 5.x (the old name is removed in 5.40): whichever
    # this version's forward takes
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for _ in range(8):
        out = model(input_ids=None if enc else src, attention_mask=src_mask.long(), encoder_outputs=enc,
                    decoder_input_ids=tokens[:, None], use_cache=True, **{name: past})
        enc = enc or (out.encoder_last_hidden_state,)
        past = getattr(out, name)
        logits = ours.decode_step(tokens, cache)
        assert (logits - out.logits[:, -1]).abs().max().item() <= TOLERANCE
        tokens = logits.argmax(-1)
        assert torch.equal(tokens, out.logits[:, -1].argmax(-1))


def test_architecture(saved):
    model, _, ours, arch = saved
    c, m = model.config, arch.model
    assert m.norm == ("post" if c.model_type == "marian" else "pre")
    assert (m.n_encoder_layers, m.n_decoder_layers, m.d_model, m.n_heads, m.ffn_dim) == (2, 3, 32, 4, 64)
    assert ours.pad_id == c.pad_token_id
    assert ours.src_embed.padding_idx == ours.tgt_embed.padding_idx == c.pad_token_id
    assert m.dropout == 0.1 and m.max_positions == 64
    tied = c.tie_word_embeddings
    assert (ours.output_proj.weight is ours.tgt_embed.weight) == tied
    assert (ours.src_embed is ours.tgt_embed) == (tied and getattr(c, "share_encoder_decoder_embeddings", True))


# --------------------------------------------------------------------------- the inverse mapping

def test_weights_round_trip_to_what_save_pretrained_writes(saved):
    """nmt -> HF gives back exactly the tensors of model.safetensors (an untied Marian model's unused
    `model.shared` aside: the import drops it)."""
    _, path, ours, arch = saved
    written = read_weights(path)
    back = weights_to_hf(ours.state_dict(), arch)
    assert set(back) == set(written)
    for name, tensor in written.items():
        if name == "model.shared.weight" and not arch.tie_word_embeddings:
            continue
        assert torch.equal(back[name], tensor), name


def token_ids(config) -> dict:
    keys = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "forced_eos_token_id")
    return {k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}


NMT_MODELS = [  # nmt models (as if trained from scratch) that transformers can load
    ("marian", dict(norm="post", positions="sinusoidal_halves", activation="silu", output_bias=True), (60, 60)),
    ("marian", dict(norm="post", positions="sinusoidal_halves", share_embeddings=False, tie_output=True), (60, 50)),
    ("marian", dict(norm="post", positions="sinusoidal_halves", share_embeddings=True, tie_output=False,
                    scale_embeddings=False), (60, 60)),
    ("marian", dict(norm="post", positions="sinusoidal_halves", share_embeddings=False, tie_output=False,
                    output_bias=True), (60, 50)),
    ("m2m_100", dict(norm="pre", positions="sinusoidal_fairseq", position_offset=2), (60, 60)),
    ("m2m_100", dict(norm="pre", positions="sinusoidal_fairseq", position_offset=2, share_embeddings=False,
                     tie_output=False, activation="silu"), (60, 60)),
]


@pytest.mark.parametrize("family,kw,vocab", NMT_MODELS)
@torch.no_grad()
def test_nmt_model_written_for_transformers_gives_the_same_logits(tmp_path, family, kw, vocab):
    from safetensors.torch import save_file

    from nmt.config import ModelConfig
    from nmt.model.transformer import Transformer

    pad = 1 if family == "m2m_100" else vocab[1] - 1
    cfg = ModelConfig(d_model=32, n_heads=4, layers=2, decoder_layers=1, ffn_dim=48, max_positions=40, **kw)
    torch.manual_seed(0)
    ours = Transformer(cfg, *vocab, pad_id=pad).eval()
    for p in ours.parameters():
        p.add_(0.3 * torch.randn_like(p))
    arch = architecture_from_nmt(cfg, *vocab, pad)
    assert arch.family == family
    ids = dict(pad_token_id=pad, eos_token_id=0 if family == "marian" else 2, decoder_start_token_id=pad if family == "marian" else 2)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config_to_hf(arch, ids), f)
    save_file(weights_to_hf(ours.state_dict(), arch), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    src, src_mask = padded_batch(model, [6, 3], seed=7, start=False)
    tgt, tgt_mask = padded_batch(model, [5, 2], seed=8, start=True)
    theirs = model.eval()(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits
    assert max_diff(ours(src, src_mask, tgt), theirs, tgt_mask) <= TOLERANCE
    again, arch_again, _ = import_weights(str(tmp_path))  # and back: the same function
    assert max_diff(again(src, src_mask, tgt), theirs, tgt_mask) <= TOLERANCE


def test_models_no_family_represents_are_refused():
    from nmt.config import ModelConfig

    with pytest.raises(UserError, match=r"marian \(post-norm\).*positions='sinusoidal'.*before the default became"):
        architecture_from_nmt(ModelConfig(norm="post", positions="sinusoidal"), 50, 50, 0)
    with pytest.raises(UserError, match=r"m2m_100 \(pre-norm\).*position_offset=1.*output_bias=True"):
        architecture_from_nmt(ModelConfig(positions="sinusoidal_fairseq", output_bias=True), 50, 50, 1)
    with pytest.raises(UserError, match="separate vocabularies"):
        architecture_from_nmt(ModelConfig(positions="sinusoidal_fairseq", position_offset=2, share_embeddings=False),
                              50, 40, 1)


def test_nmts_default_models_have_a_family():
    """A model left to nmt's position defaults is what a family represents, pre-norm (M2M100) or post-norm
    (MarianMT), with nmt's padding id 0."""
    from nmt.config import ModelConfig

    assert architecture_from_nmt(ModelConfig(), 50, 50, 0).family == "m2m_100"
    assert architecture_from_nmt(ModelConfig(norm="post"), 50, 50, 0).family == "marian"


# --------------------------------------------------------------------------- other files and layouts

@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("marian"))
    hf_model("marian", "opus-mt").save_pretrained(path)
    return path


def copy_dir(src: str, dst) -> str:
    os.makedirs(dst)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())
    return str(dst)


def test_pytorch_bin_and_sharded_files_give_the_same_model(marian_dir, tmp_path):
    reference = {k: v.clone() for k, v in import_weights(marian_dir)[0].state_dict().items()}
    binary = copy_dir(marian_dir, tmp_path / "bin")
    torch.save(read_weights(binary), os.path.join(binary, "pytorch_model.bin"))
    os.remove(os.path.join(binary, "model.safetensors"))
    sharded = str(tmp_path / "sharded")
    hf_model("marian", "opus-mt").save_pretrained(sharded, max_shard_size="50KB")
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    for path in (binary, sharded):
        state = import_weights(path)[0].state_dict()
        assert all(torch.equal(state[k], v) for k, v in reference.items()), path


def test_old_marian_files_with_position_tables_and_aliases_are_read(marian_dir, tmp_path):
    """Checkpoints of older transformers store the fixed position tables and the tied copies."""
    from safetensors.torch import save_file

    model = hf_model("marian", "opus-mt")
    path = copy_dir(marian_dir, tmp_path / "old")
    full = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    save_file(full, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    reference = import_weights(marian_dir)[0].state_dict()
    state = import_weights(path)[0].state_dict()
    assert all(torch.equal(state[k], v) for k, v in reference.items())
    full["lm_head.weight"] = full["lm_head.weight"] + 1
    save_file(full, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="tied weights model.shared.weight and lm_head.weight differ"):
        import_weights(path)
    full["lm_head.weight"] = full["model.shared.weight"]
    full["model.encoder.embed_positions.weight"] = full["model.encoder.embed_positions.weight"].flip(0).contiguous()
    save_file({k: v.clone() for k, v in full.items()}, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="embed_positions.weight .*not MarianMT's sinusoidal table"):
        import_weights(path)


@pytest.mark.slow
def test_nmt_does_not_import_transformers(marian_dir):
    code = ("import sys; from nmt.interop.hf import import_weights; import_weights(sys.argv[1]); "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code, marian_dir], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- bad input: one line each

def one_line_error(path: str, match: str) -> None:
    with pytest.raises(UserError, match=match) as e:
        import_weights(path)
    assert "\n" not in str(e.value)


def test_not_a_model_directory(tmp_path):
    one_line_error(str(tmp_path / "nowhere"), "Hugging Face model directory not found")
    (tmp_path / "empty").mkdir()
    one_line_error(str(tmp_path / "empty"), r"not a Hugging Face model directory \(no config.json\)")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    one_line_error(str(tmp_path / "broken"), "cannot read .*config.json")


@pytest.mark.parametrize("other", ["t5", "bart"])
def test_other_families_are_refused_naming_the_supported_ones(tmp_path, other):
    config = {"t5": lambda: transformers.T5Config(vocab_size=50, d_model=16, d_ff=32, num_layers=1, num_heads=2),
              "bart": lambda: transformers.BartConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1)}[other]()
    config.save_pretrained(str(tmp_path))
    one_line_error(str(tmp_path), rf"model_type '{other}' is not supported \(supported: marian .* m2m_100")


def test_missing_and_truncated_weights(marian_dir, tmp_path):
    path = copy_dir(marian_dir, tmp_path / "m")
    weights = os.path.join(path, "model.safetensors")
    data = open(weights, "rb").read()
    with open(weights, "wb") as f:
        f.write(data[: len(data) // 2])
    one_line_error(path, r"cannot read weights .*model.safetensors: truncated")
    torch.save(read_weights(marian_dir), os.path.join(path, "pytorch_model.bin"))
    os.remove(weights)
    data = open(os.path.join(path, "pytorch_model.bin"), "rb").read()
    with open(os.path.join(path, "pytorch_model.bin"), "wb") as f:
        f.write(data[: len(data) // 2])
    one_line_error(path, r"cannot read weights .*pytorch_model.bin: truncated")
    os.remove(os.path.join(path, "pytorch_model.bin"))
    one_line_error(path, r"has no weights file \(looked for model.safetensors")


def test_weights_that_do_not_fit_the_config(marian_dir, tmp_path):
    def with_config(name, **changes):
        path = copy_dir(marian_dir, tmp_path / name)
        config = json.load(open(os.path.join(path, "config.json")))
        config.update(changes)
        json.dump(config, open(os.path.join(path, "config.json"), "w"))
        return path

    one_line_error(with_config("more", encoder_layers=3), r"the weights lack model.encoder.layers.2")
    one_line_error(with_config("fewer", decoder_layers=2), r"unexpected weight\(s\) model.decoder.layers.2")
    one_line_error(with_config("wider", encoder_ffn_dim=128, decoder_ffn_dim=128), r"weights do not match config.json")
    one_line_error(with_config("act", activation_function="gelu_new"), r"activation_function 'gelu_new' is not supported")
    one_line_error(with_config("heads", decoder_attention_heads=2), r"must be equal")
    one_line_error(with_config("pad", pad_token_id=None), r"pad_token_id must be an integer >= 0, got None")
    one_line_error(with_config("empty", encoder_layers=0), r"encoder_layers must be an integer >= 1")


def test_read_config_and_architecture_agree_with_transformers_defaults(marian_dir):
    """An OPUS-MT-shaped config: post-norm, swish, scaled embeddings, logits bias, pad id = vocab_size - 1."""
    arch = architecture(read_config(marian_dir))
    m = arch.model
    assert (m.activation, m.positions, m.position_offset, m.scale_embeddings, m.output_bias) == \
        ("silu", "sinusoidal_halves", 0, True, True)
    assert arch.pad_id == 99 and arch.src_vocab_size == arch.tgt_vocab_size == 100
    assert weights_to_nmt(read_weights(marian_dir), arch).keys() >= {"output_proj.bias", "tgt_embed.weight"}

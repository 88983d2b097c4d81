"""decode.precision (nmt/model/precision.py) and the lean-inference paths of issue 27, each against the plain
path: int8 linear layers against nn.Linear and, on a trained model, int8 and bf16 translations
against fp32 by BLEU; the precision key's validation and one-line refusals; a batch searched in
parts of at most MAX_CPU_ROWS rows against one search; growing caches against a preallocated one
through whole searches."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from nmt.model import precision
from nmt.search.cache import DecoderCache
from nmt.config import ConfigError, ModelConfig, config_from_dict, decode_config
from nmt.errors import UserError
from nmt.search.fast import FAST_OPS, ReusingDecoderCache
from nmt.model.transformer import Transformer
from nmt.search import SearchOps, SearchOptions, beam_search, greedy_search
from tests.helpers import make_tiny_checkpoint, tiny_config_dict

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- the key and its refusals

def test_precision_key_is_validated_and_refusals_are_one_line(monkeypatch):
    assert decode_config(None, {}).precision == "auto"
    assert decode_config(None, {"precision": "int8"}).precision == "int8"
    with pytest.raises(ConfigError, match="precision"):
        decode_config(None, {"precision": "int4"})
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for p in ("auto", "fp32"):
        precision.check(p, cpu)
    with pytest.raises(UserError, match="int8 runs on CPU only") as e:
        precision.check("int8", cuda)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        precision.check("fp16", cpu)
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: False)
    with pytest.raises(UserError, match="bf16 on this CPU would be emulated"):
        precision.check("bf16", cpu)
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: True)
    precision.check("bf16", cpu)
    assert precision.resolve("auto") == "fp32" and precision.CT2_COMPUTE_TYPES["int8"] == "int8"


def test_int8_where_it_measures_slower_than_fp32_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """Issue 59 item 13: on a CPU without AVX-512 VNNI / AVX-VNNI / AMX `torch._int_mm` has no fast kernel and
    int8 ran several times slower than fp32. The load measures int8 against fp32 products (`int8_speedup`,
    patched here: the test does not depend on this machine's CPU) and refuses int8 where it is slower, in
    one line pointing to CTranslate2's int8."""
    from nmt import Translator
    from nmt.cli import main

    speedup = precision.int8_speedup()  # the real measurement: a ratio, whatever this CPU's
    assert 0 < speedup < float("inf") and precision.int8_speedup() == speedup  # (measured once)
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    monkeypatch.setattr(precision, "int8_speedup", lambda: 0.25)
    with pytest.raises(UserError) as e:
        Translator(ckpt, device="cpu", precision="int8")
    assert str(e.value) == ("--precision int8 on this CPU would be slower than fp32 (its int8 matrix products, "
                            "measured at load, are slower than fp32 ones: no AVX-512 VNNI, AVX-VNNI or AMX); use fp32, "
                            "or export the model (nmt export) and translate with --engine ctranslate2 --precision int8")
    src = tmp_path / "in.txt"
    src.write_text("el perro come\n")
    assert main(["translate", "-c", ckpt, "-i", str(src), "--precision", "int8", "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"nmt translate: error: {e.value}\n"
    precision.check("fp32", torch.device("cpu"))  # (fp32 is never refused)
    monkeypatch.setattr(precision, "int8_speedup", lambda: 3.0)
    assert Translator(ckpt, device="cpu", precision="int8")._engine.precision == "int8"


def test_precision_is_fixed_when_the_model_loads(tmp_path, capsys, monkeypatch):
    from nmt import Translator

    monkeypatch.setattr(precision, "int8_speedup", lambda: 3.0)  # (int8 is refused where it measures slow)
    from nmt.cli import main

    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    t = Translator(ckpt, device="cpu", precision="int8")
    assert t._engine.precision == "int8" and t.decode.precision == "int8"
    assert any(type(m).__name__ == "Int8Linear" for m in t._engine.model.modules())
    assert len(t.translate(["el perro come"])) == 1
    with pytest.raises(UserError, match="loaded with precision int8"):
        t.translate(["el perro come"], precision="fp32")
    assert Translator(ckpt, device="cpu")._engine.precision == "fp32"  # auto
    src = tmp_path / "in.txt"
    src.write_text("el perro come\n")
    assert main(["translate", "-c", ckpt, "-i", str(src), "--precision", "fp16", "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nmt translate: error: --precision fp16 is for GPUs") and "\n" not in err


# --------------------------------------------------------------------------- int8 linear layers

def test_int8_linear_is_close_to_nn_linear_and_replaces_every_linear():
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    x = torch.randn(7, 5, 64)
    q = precision.Int8Linear.from_linear(lin)
    with torch.no_grad():
        ref, out = lin(x), q(x)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert torch.equal(q(x[2:4, 1:3]), out[2:4, 1:3])  # per-row scales: a row's result ignores its batch
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()  # 8-bit weights and activations
    assert (out - ref).abs().mean() < 0.01 * ref.abs().mean() + 1e-3
    model = Transformer(ModelConfig(d_model=32, n_heads=4, layers=2, ffn_dim=64, max_positions=32), 40, 40).eval()
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    embed = model.tgt_embed.weight
    assert precision.quantize_int8(model) == n_linear
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert model.tgt_embed.weight is embed and embed.dtype == torch.float32  # tied embedding kept


# --------------------------------------------------------------------------- a trained model: BLEU

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, source lines, reference lines) of the synthetic task trained briefly."""
    from nmt.train import train

    d = tmp_path_factory.mktemp("trained")
    raw = tiny_config_dict(str(d), max_steps=150, valid_every=1000, valid_bleu=False, metric="loss")
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    with open(raw["data"]["test"]["src"], encoding="utf-8") as f:
        src = f.read().splitlines()
    with open(raw["data"]["test"]["tgt"], encoding="utf-8") as f:
        ref = f.read().splitlines()
    return os.path.join(cfg.run_dir, "checkpoints", "latest.pt"), src, ref


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 4])
def test_int8_and_bf16_translate_about_as_well_as_fp32(trained, beam, monkeypatch):
    """Reduced precision changes some outputs of a briefly trained model, not its quality: BLEU against
    the references within 2 points of fp32 (the issue's target on the real test split: 0.3)."""
    import sacrebleu

    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_lines

    ckpt, src, ref = trained
    monkeypatch.setattr(precision, "int8_speedup", lambda: 3.0)  # (int8 is refused where it measures slow)
    fp32 = TorchEngine.load(ckpt, "cpu", precision="fp32")
    int8 = TorchEngine.load(ckpt, "cpu", precision="int8")
    bf16 = TorchEngine.load(ckpt, "cpu", precision="fp32")
    bf16.autocast, bf16.precision = torch.bfloat16, "bf16"  # autocast on any CPU (emulated where not native)
    decode = decode_config(fp32.decode, {"beam_size": beam})
    bleu = {e.precision: sacrebleu.corpus_bleu(translate_lines(e, src, decode), [ref]).score for e in (fp32, int8, bf16)}
    assert bleu["fp32"] > 30
    assert bleu["int8"] > bleu["fp32"] - 2 and bleu["bf16"] > bleu["fp32"] - 2, bleu


# --------------------------------------------------------------------------- fp32 fast paths: identical

def test_a_batch_searched_in_parts_gives_the_same_results(tmp_path, monkeypatch):
    """TorchEngine.search_batch splits a CPU batch into parts of MAX_CPU_ROWS decoder rows: the same
    hypotheses and scores as one search of the whole batch (greedy, beam, n-best)."""
    from nmt.translation import torch_engine
    from nmt.translation.torch_engine import TorchEngine
    from tests.helpers import make_pairs

    engine = TorchEngine.load(make_tiny_checkpoint(str(tmp_path / "t.pt")), "cpu")
    src = engine.tokenizer.encode_src([p[0] for p in make_pairs(11, 3)])
    for beam, nbest in ((1, 1), (3, 2)):
        options = SearchOptions.from_decode(decode_config(engine.decode, {"beam_size": beam, "nbest": nbest}),
                                            engine.tokenizer)
        with engine.running():
            whole = engine.search_batch(src, options)
            monkeypatch.setattr(torch_engine, "MAX_CPU_ROWS", 4)  # 4 sentences greedy, 1 at beam 3
            parts = engine.search_batch(src, options)
            monkeypatch.undo()
        assert len(parts) == len(src)
        for a, b in zip(whole, parts):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


class PreallocatedCache(DecoderCache):
    """The reference: every position allocated at once (chunk 0), as before caches grew."""

    @classmethod
    def create(cls, cross_k, cross_v, src_mask, max_len, chunk=0):
        return super().create(cross_k, cross_v, src_mask, max_len, chunk=0)


@pytest.mark.parametrize("V", [50, 640])
def test_searches_with_growing_caches_equal_the_preallocated_cache(V):
    """Greedy and beam search (outputs up to 30 tokens: the caches grow twice) with the growing
    DecoderCache and ReusingDecoderCache give the hypotheses and scores of a preallocated cache."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, n_heads=4, layers=2, ffn_dim=64, dropout=0.0, max_positions=64,
                                    positions="sinusoidal"), V, V).eval()  # the table these seeds give long outputs with
    with torch.no_grad():
        model.output_proj.weight.normal_(0.0, 0.5)
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, V, (6, 8), generator=g)
    src[2, 5:] = 0
    src[4, 3:] = 0
    mask = src != 0
    kw = dict(max_len_a=2.0, max_len_b=14, no_repeat_ngram=2)
    reference = SearchOps(cache_cls=PreallocatedCache)
    growing = [SearchOps(), SearchOps(cache_cls=ReusingDecoderCache), FAST_OPS]
    expected = [h for (h,) in greedy_search(model, src, mask, SearchOptions(**kw), ops=reference)]
    assert max(len(h.tokens) for h in expected) > 16
    for ops in growing:
        got = [h for (h,) in greedy_search(model, src, mask, SearchOptions(**kw), ops=ops)]
        assert [h.tokens for h in got] == [h.tokens for h in expected]
        assert [h.score for h in got] == pytest.approx([h.score for h in expected], abs=1e-5)
    options = SearchOptions(beam_size=4, nbest=2, **kw)
    expected = beam_search(model, src, mask, options, ops=reference)
    for ops in growing:
        got = beam_search(model, src, mask, options, ops=ops)
        assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in expected]
        assert [h.score for n in got for h in n] == pytest.approx([h.score for n in expected for h in n], abs=1e-5)

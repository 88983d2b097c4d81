"""The CUDA paths, each against the CPU or fp32 path: cached decode steps against the full forward
pass (fp32, bf16, fp16 autocast), training with mixed precision (a briefly trained model translates
its test set), and translation on the GPU in fp32 / bf16 / fp16 against the CPU's fp32 outputs.

Skipped where torch sees no CUDA device (CI has none); run on a GPU machine with
`python3 -m pytest tests/test_gpu.py`. BENCHMARKS.md ("On a GPU") records the last run."""

from __future__ import annotations

import os

import pytest
import torch

from nmt.config import config_from_dict, decode_config
from tests.helpers import make_pairs, tiny_config_dict
from tests.test_cache import full_logits, source, tiny_model, tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on CI)")


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
@torch.no_grad()
def test_cached_steps_equal_the_full_decode_on_cuda(dtype):
    model = tiny_model().cuda()
    src, src_mask = (t.cuda() for t in source([9, 3, 6]))
    tgt = tokens(3, 12).cuda()
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        full = full_logits(model, src, src_mask, tgt).float()
        cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=12)
        steps = torch.stack([model.decode_step(tgt[:, t], cache).float() for t in range(12)], 1)
    if dtype is None:
        torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)  # TF32 may be on: not bitwise
    else:
        assert cache.self_k[0].dtype == dtype
        torch.testing.assert_close(steps, full, atol=0.1, rtol=0.05)
    cpu = full_logits(tiny_model(), *source([9, 3, 6]), tokens(3, 12))
    torch.testing.assert_close(steps.cpu(), cpu, atol=0.1 if dtype else 1e-3, rtol=0.05 if dtype else 1e-3)


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def trained_on_gpu(request, tmp_path_factory):
    """(checkpoint, source lines, reference lines): the synthetic task trained on CUDA with AMP
    (bf16 autocast; fp16 with a GradScaler)."""
    from nmt.train import train

    d = tmp_path_factory.mktemp(f"gpu-{request.param}")
    raw = tiny_config_dict(str(d), max_steps=300, valid_every=1000, valid_bleu=False, metric="loss",
                           device="cuda", precision=request.param)
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    with open(raw["data"]["test"]["src"], encoding="utf-8") as f:
        src = f.read().splitlines()
    with open(raw["data"]["test"]["tgt"], encoding="utf-8") as f:
        ref = f.read().splitlines()
    return os.path.join(cfg.run_dir, "checkpoints", "latest.pt"), src, ref


@pytest.mark.parametrize("beam", [1, 4])
def test_gpu_training_and_translation_in_every_precision(trained_on_gpu, beam):
    """A model trained with AMP on the GPU translates well; on the GPU in fp32 it gives nearly the
    CPU's lines (TF32 and kernel order may flip near-ties), in bf16/fp16 about the same BLEU."""
    import sacrebleu

    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_lines

    ckpt, src, ref = trained_on_gpu
    cpu = TorchEngine.load(ckpt, "cpu", precision="fp32")
    decode = decode_config(cpu.decode, {"beam_size": beam})
    expected = translate_lines(cpu, src, decode)
    bleu_cpu = sacrebleu.corpus_bleu(expected, [ref]).score
    assert bleu_cpu > 30
    for precision in ("fp32", "bf16", "fp16"):
        engine = TorchEngine.load(ckpt, "cuda", precision=precision)
        assert engine.torch_device.type == "cuda"
        got = translate_lines(engine, src, decode)
        assert len(got) == len(src)
        if precision == "fp32":
            same = sum(a == b for a, b in zip(got, expected))
            assert same >= 0.95 * len(src), (same, len(src))
        bleu = sacrebleu.corpus_bleu(got, [ref]).score
        assert bleu > bleu_cpu - 2, (precision, bleu, bleu_cpu)


def test_translate_command_on_cuda(tmp_path, capsys):
    """`nmt translate --device cuda --precision bf16` end to end: one line per input line, and
    `--precision int8` on a GPU refused with one line."""
    from nmt.cli import main
    from tests.helpers import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    lines = [p[0] for p in make_pairs(40, 5)] + [""]
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("\n".join(lines) + "\n")
    assert main(["translate", "-c", ckpt, "-i", str(inp), "-o", str(out), "--device", "cuda",
                 "--precision", "bf16", "--beam", "3", "--quiet"]) == 0
    assert len(out.read_text().split("\n")) == len(lines) + 1
    assert main(["translate", "-c", ckpt, "-i", str(inp), "--device", "cuda", "--precision", "int8", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "int8 runs on CPU only" in err and "\n" not in err


# --------------------------------------------------------------------------- CUDA graphs (nmt/search/cuda_graphs.py)

class _Counting:
    """GraphedDecoder subclasses that count recordings and replays, with graphs on or off."""

    @staticmethod
    def make(graphs: bool, counts: dict):
        from nmt.search.cuda_graphs import GraphedDecoder

        class Counting(GraphedDecoder):
            def __init__(self, *args):
                super().__init__(*args)
                self.use_graphs = self.use_graphs and graphs

            def step(self, tokens):
                fresh = self.graph is not None and self.graph_of == self.cache.generation
                counts["replays" if fresh else "eager_or_record"] = counts.get(
                    "replays" if fresh else "eager_or_record", 0) + 1
                return super().step(tokens)

            def _record(self, tokens):
                counts["records"] = counts.get("records", 0) + 1
                return super()._record(tokens)
        return Counting


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@torch.no_grad()
def test_graph_replays_equal_eager_steps_bit_for_bit(dtype):
    """Greedy, beam (n-best) and sampling through recorded graphs give exactly the tokens and scores of
    the same steps run eagerly (graphs off), while sentences finish at different steps; and the tokens
    of the plain cache (attention over the filled positions only)."""
    from nmt.search import PLAIN_OPS, SearchOps, SearchOptions, search

    model = tiny_model(max_positions=64).cuda()
    src, src_mask = (t.cuda() for t in source([9, 3, 6, 8, 2, 5, 7]))
    kw = dict(max_len_a=1.0, max_len_b=8)
    cases = [SearchOptions(**kw), SearchOptions(beam_size=4, nbest=2, **kw),
             SearchOptions(beam_size=3, length_penalty=1.0, **kw),
             SearchOptions(sampling="topk", topk=5, nbest=3, seed=7, **kw)]
    counts: dict = {}
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        for options in cases:
            graphed = search(model, src, src_mask, options, ops=SearchOps(decoder_cls=_Counting.make(True, counts)))
            eager = search(model, src, src_mask, options, ops=SearchOps(decoder_cls=_Counting.make(False, {})))
            plain = search(model, src, src_mask, options, ops=PLAIN_OPS)
            assert [[(h.tokens, h.score) for h in hs] for hs in graphed] == \
                [[(h.tokens, h.score) for h in hs] for hs in eager]
            if dtype is None:
                assert [[h.tokens for h in hs] for hs in graphed] == [[h.tokens for h in hs] for hs in plain]
    assert counts["records"] >= len(cases) and counts["replays"] > counts["eager_or_record"]


def test_engine_decodes_with_graphs_on_cuda_and_equals_them_off(tmp_path, monkeypatch):
    """TorchEngine.load on CUDA decodes through GraphedDecoder; NMT_CUDA_GRAPHS=0 gives the plain
    decoder, and the same lines (fp32: the two differ only in which positions attention reads)."""
    from nmt.config import decode_config
    from nmt.search.cuda_graphs import GraphedDecoder
    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_lines
    from tests.helpers import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    lines = [p[0] for p in make_pairs(60, 5)]
    engine = TorchEngine.load(ckpt, "cuda", precision="fp32")
    assert engine.ops.decoder_cls is GraphedDecoder
    monkeypatch.setenv("NMT_CUDA_GRAPHS", "0")
    plain = TorchEngine.load(ckpt, "cuda", precision="fp32")
    assert plain.ops.decoder_cls is None
    for beam in (1, 4):
        decode = decode_config(engine.decode, {"beam_size": beam})
        got, expected = translate_lines(engine, lines, decode), translate_lines(plain, lines, decode)
        assert sum(a == b for a, b in zip(got, expected)) >= 0.98 * len(lines)

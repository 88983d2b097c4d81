"""nmt/search/cuda_graphs.py's decoder and nmt/search/cache.py's StaticDecoderCache, on CPU: the same steps a CUDA
graph records (attention over all positions under a mask, a device-side position, rows compacted in
place with padding rows) give the logits of the plain cache and the full decode, and every search
gives the plain path's hypotheses. The graphs themselves (record and replay) are tested on CUDA in
tests/test_gpu.py."""

import pytest
import torch

from nmt.search import cuda_graphs
from nmt.search.cache import DecoderCache, StaticDecoderCache
from nmt.search.cuda_graphs import GraphedDecoder
from nmt.search import PLAIN_OPS, SearchOps, SearchOptions, beam_search, greedy_search, search
from tests.test_cache import CONFIGS, full_logits, source, tiny_model, tokens

GRAPHED = SearchOps(decoder_cls=GraphedDecoder)


@pytest.mark.parametrize("kw", CONFIGS)
@torch.no_grad()
def test_static_steps_equal_full_decode(kw):
    model = tiny_model(**kw)
    src, src_mask = source([9, 3, 6])
    tgt = tokens(3, 12)
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=15, cache_cls=StaticDecoderCache)
    buffers = cache.kv.data_ptr()
    steps = [model.decode_step(tgt[:, t], cache) for t in range(12)]
    assert cache.length == 12 and int(cache.pos) == 12 and cache.kv.data_ptr() == buffers
    torch.testing.assert_close(torch.stack(steps, 1), full_logits(model, src, src_mask, tgt), atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", ["pre", "post"])
@torch.no_grad()
def test_static_reorders_follow_the_selected_rows(norm):
    """As tests/test_cache.py's reorder test, through the static cache: rows compacted in place
    (buffers kept, padding rows after the batch) while more than half stay and the group holds;
    new buffers (a new generation) when the group changes or half of the rows leave."""
    model = tiny_model(norm=norm)
    src, src_mask = source([7, 2, 5, 4])
    K, T = 3, 11
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=T, cache_cls=StaticDecoderCache)
    rows = torch.arange(4)  # source sentence of each batch row
    prefix = tokens(4, 0)
    reorders = {2: (torch.arange(4).repeat_interleave(K), True),  # expand to beams: group 1 -> 3
                4: (torch.tensor([2, 0, 1, 3, 4, 5, 8, 8, 6, 9, 9, 11]), False),  # permute inside sentences
                5: (torch.tensor([6, 7, 8, 0, 1, 2, 9, 10, 11]), False),  # drop sentence 1: 9 of 12 rows, in place
                7: (torch.tensor([3, 4, 5, 0, 0, 1, 6, 7, 8]), False),  # permute sentences, still padded
                8: (torch.tensor([6, 7, 8]), True),  # 3 of 12 rows left: new buffers
                9: (torch.tensor([2, 0, 1]), False)}
    for t in range(T):
        if t in reorders:
            idx, fresh = reorders[t]
            before = (cache.generation, cache.kv.data_ptr())
            cache.reorder(idx)
            rows, prefix = rows[idx], prefix[idx]
            assert (cache.generation != before[0]) == fresh and (cache.kv.data_ptr() != before[1]) == fresh
            assert cache.rows == len(idx) <= cache.kv.shape[2]
        new = tokens(len(rows), 1, seed=10 + t)
        prefix = torch.cat([prefix, new], 1)
        padded = torch.cat([new[:, 0], new[:1, 0].expand(cache.kv.shape[2] - len(rows))])
        logits = model.decode_step(padded, cache)[: len(rows)]
        reference = full_logits(model, src[rows], src_mask[rows], prefix)[:, -1]
        torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)


@torch.no_grad()
def test_interleaved_rows_give_group_one_and_new_buffers():
    model = tiny_model()
    src, src_mask = source([4, 6])
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=6, cache_cls=StaticDecoderCache)
    cache.reorder(torch.arange(2).repeat_interleave(2))
    model.decode_step(tokens(4, 1)[:, 0], cache)
    plain = model.init_cache(model.encode(src, src_mask), src_mask, max_len=6, cache_cls=DecoderCache)
    plain.reorder(torch.arange(2).repeat_interleave(2))
    model.decode_step(tokens(4, 1)[:, 0], plain)
    for c in (cache, plain):
        c.reorder(torch.tensor([0, 2, 1, 3]))
    assert cache.group == plain.group == 1 and cache.generation == 2
    step = tokens(4, 1, seed=5)[:, 0]
    torch.testing.assert_close(model.decode_step(step, cache), model.decode_step(step, plain), atol=1e-5, rtol=0)


def test_searches_through_the_graphed_decoder_equal_the_plain_path():
    """On CPU the graphed decoder runs its steps eagerly over the static cache: every search kind
    (greedy, beam with n-best, sampling, prefixes) gives the plain path's tokens and scores while
    sentences finish at different steps (rows compacted, padding, new buffers)."""
    torch.manual_seed(0)
    model = tiny_model(max_positions=64)
    src, src_mask = source([9, 3, 6, 8, 2, 5, 7])
    kw = dict(max_len_a=1.0, max_len_b=5)
    cases = [SearchOptions(**kw), SearchOptions(beam_size=4, nbest=2, **kw),
             SearchOptions(beam_size=3, length_penalty=1.0, **kw),
             SearchOptions(sampling="topk", topk=5, nbest=3, seed=7, **kw)]
    finished, given = set(), src_mask.clone()
    for options in cases:
        b, a = (search(model, src, src_mask, options, ops=ops) for ops in (GRAPHED, PLAIN_OPS))
        assert torch.equal(src_mask, given)  # the caller's mask is not compacted with the cache
        assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b]
        for ha, hb in zip(a, b):
            assert [h.score for h in ha] == pytest.approx([h.score for h in hb], abs=1e-5)
        finished |= {len(h.tokens) for hs in a for h in hs if h.finished}
    assert len(finished) > 2  # sentences ended at different steps: the batch shrank


def test_enabled_by_default_and_switched_off_by_the_environment(monkeypatch):
    monkeypatch.delenv("NMT_CUDA_GRAPHS", raising=False)
    assert cuda_graphs.enabled()
    monkeypatch.setenv("NMT_CUDA_GRAPHS", "0")
    assert not cuda_graphs.enabled()


def test_greedy_and_beam_share_the_decoder_protocol():
    """The decoder class comes from the search ops (nmt/search/decoding.py's start)."""
    model = tiny_model(max_positions=64)
    src, src_mask = source([4, 6])
    made = []

    class Spy(GraphedDecoder):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    ops = SearchOps(decoder_cls=Spy)
    greedy_search(model, src, src_mask, SearchOptions(max_len_a=0, max_len_b=4), ops=ops)
    beam_search(model, src, src_mask, SearchOptions(beam_size=2, max_len_a=0, max_len_b=4), ops=ops)
    assert len(made) == 2 and all(isinstance(d.cache, StaticDecoderCache) for d in made)
    assert not made[0].use_graphs  # CPU: eager steps


class _FakeStream:
    """Stands in for torch.cuda streams on CPU (the recording path's control flow only)."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other) -> None:
        pass


class _UnrecordableGraph:
    def capture_begin(self, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    def capture_end(self):
        raise RuntimeError("capture invalidated")


def test_a_step_that_cannot_be_recorded_is_decoded_eagerly_with_a_warning(monkeypatch):
    """GraphedDecoder's fallback (exercised on CPU with stand-ins for torch.cuda's stream and graph):
    recording fails, the step runs eagerly with a warning, the rest of the batch stays eager, and the
    hypotheses equal the plain path's; the cache's position is not moved by the failed recording."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _UnrecordableGraph)
    made = []

    class Forced(GraphedDecoder):
        def __init__(self, *args):
            super().__init__(*args)
            self.use_graphs = True  # as on CUDA
            made.append(self)

    model = tiny_model(max_positions=64)
    src, src_mask = source([9, 3, 6, 8])
    options = SearchOptions(beam_size=3, nbest=2, max_len_a=1.0, max_len_b=5)
    with pytest.warns(RuntimeWarning, match="decoding without CUDA graphs"):
        got = search(model, src, src_mask, options, ops=SearchOps(decoder_cls=Forced))
    expected = search(model, src, src_mask, options, ops=PLAIN_OPS)
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in expected]
    (decoder,) = made
    assert not decoder.use_graphs and decoder.graph is None
    assert int(decoder.cache.pos) == decoder.cache.length

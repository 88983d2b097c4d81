"""Cached decoding: step-by-step logits equal the full teacher-forced decode, through reorders,
for the plain DecoderCache and nmt/search/fast.py's ReusingDecoderCache alike."""

import pytest
import torch

from nmt.search.cache import GROW_CHUNK, DecoderCache, source_groups
from nmt.search.joining import joined_step
from nmt.search.fast import ReusingDecoderCache
from nmt.config import ModelConfig
from nmt.masks import padding_mask
from nmt.model.transformer import PAD_ID, Transformer

V = 29


def tiny_model(**kw) -> Transformer:
    """Seeded, eval mode, every weight moved off its init (identical LayerNorms and
    zero biases would hide miswiring)."""
    torch.manual_seed(0)
    base = dict(d_model=32, n_heads=4, layers=2, ffn_dim=48, max_positions=40)
    base.update(kw)
    model = Transformer(ModelConfig(**base), V, V).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def source(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = padding_mask(torch.tensor(lengths))
    return torch.randint(4, V, mask.shape, generator=g).masked_fill(~mask, PAD_ID), mask


def tokens(rows, length, seed=2):
    return torch.randint(4, V, (rows, length), generator=torch.Generator().manual_seed(seed))


def full_logits(model, src, src_mask, tgt):
    """The reference: teacher-forced decode of the whole prefix."""
    return model.decode(tgt, model.encode(src, src_mask), src_mask)


CONFIGS = [dict(norm="pre"), dict(norm="post"), dict(positions="learned", activation="gelu"),
           dict(encoder_layers=1, decoder_layers=3, share_embeddings=False, tie_output=False),
           dict(norm="post", activation="silu", positions="sinusoidal_halves", output_bias=True),
           dict(positions="sinusoidal_fairseq", position_offset=2, scale_embeddings=False)]


@pytest.mark.parametrize("kw", CONFIGS)
@torch.no_grad()
def test_steps_equal_full_decode(kw):
    model = tiny_model(**kw)
    src, src_mask = source([9, 3, 6])
    tgt = tokens(3, 12)
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=12)
    steps = []
    for t in range(12):
        logits = model.decode_step(tgt[:, t], cache)
        steps.append(logits)
    assert cache.length == 12
    torch.testing.assert_close(torch.stack(steps, 1), full_logits(model, src, src_mask, tgt), atol=1e-5, rtol=0)


@pytest.mark.parametrize("cache_cls", [DecoderCache, ReusingDecoderCache])
@pytest.mark.parametrize("norm", ["pre", "post"])
@torch.no_grad()
def test_reorders_follow_the_selected_rows(norm, cache_cls):
    """Expand to beams, permute inside sentences, drop a sentence, then mix sentences
    arbitrarily (repeats included); after each reorder the next logits must equal a full
    decode of the correspondingly reordered prefixes."""
    model = tiny_model(norm=norm)
    src, src_mask = source([7, 2, 5])
    K, T = 3, 10
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=T, cache_cls=cache_cls)
    assert type(cache) is cache_cls
    rows = torch.arange(3)  # source sentence of each cache row
    prefix = tokens(3, 0)  # tokens fed so far, per row [B,t]
    reorders = {2: torch.arange(3).repeat_interleave(K),  # expand to beams -> 9 rows
                4: torch.tensor([2, 0, 1, 3, 4, 5, 8, 8, 6]),  # permute/repeat inside sentences
                5: torch.tensor([0, 1, 2, 3, 3, 5, 6, 7, 6]),  # few rows change: copied in place
                6: torch.tensor([6, 7, 8, 0, 1, 2]),  # drop sentence 1, swap the others
                8: torch.tensor([4, 0, 0, 5, 3])}  # arbitrary: sentences interleaved
    expected_group = {2: K, 4: K, 5: K, 6: K, 8: 1}
    for t in range(T):
        if t in reorders:
            idx = reorders[t]
            assert cache.reorder(idx) is None  # in place
            rows, prefix = rows[idx], prefix[idx]
            assert cache.group == expected_group[t] and cache.batch_size == len(idx)
        new = tokens(len(rows), 1, seed=10 + t)
        prefix = torch.cat([prefix, new], 1)
        logits = model.decode_step(new[:, 0], cache)
        reference = full_logits(model, src[rows], src_mask[rows], prefix)[:, -1]
        torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)


@torch.no_grad()
def test_beam_reorder_keeps_cross_attention_once_per_sentence():
    model = tiny_model()
    src, src_mask = source([4, 6])
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=5)
    cross = cache.cross_k[0]
    cache.reorder(torch.arange(2).repeat_interleave(4))
    assert cache.cross_k[0].shape[0] == 2 and cache.self_k[0].shape[0] == 8
    assert cache.cross_k[0] is cross  # no copy for beam expansion
    model.decode_step(tokens(8, 1)[:, 0], cache)
    cache.reorder(torch.tensor([3, 2, 1, 0, 4, 4, 5, 7]))
    assert cache.cross_k[0] is cross
    cache.reorder(torch.arange(4, 8))
    assert cache.cross_k[0].shape[0] == 1
    torch.testing.assert_close(cache.cross_k[0][0], cross[1], atol=0, rtol=0)
    torch.testing.assert_close(cache.src_mask, src_mask[1:])


def testsource_groups():
    assert source_groups([0, 0, 1, 1, 4, 4]) == ([0, 1, 4], 2)
    assert source_groups([2, 0, 1]) == ([2, 0, 1], 1)
    assert source_groups([0, 0, 1]) == ([0, 0, 1], 1)  # unequal runs
    assert source_groups([0, 0, 0, 1]) == ([0, 0, 0, 1], 1)  # unequal runs, 4 = 2 x 2
    assert source_groups([0, 1, 0, 1]) == ([0, 1, 0, 1], 1)  # a source in two runs
    assert source_groups([3, 3, 3]) == ([3], 3)
    assert source_groups([]) == ([], 1)
    assert source_groups([0, 0, 1, 1, 0, 0]) == ([0, 1, 0], 2)  # a repeated source is fine


@torch.no_grad()
def test_cache_overflow_raises_a_clear_error():
    model = tiny_model()
    src, src_mask = source([3])
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=2)
    for t in range(2):
        model.decode_step(torch.tensor([5]), cache)
    with pytest.raises(ValueError, match="max_len=2"):
        model.decode_step(torch.tensor([5]), cache)
    with pytest.raises(ValueError, match="max_positions"):
        model.init_cache(model.encode(src, src_mask), src_mask, max_len=41)


@torch.no_grad()
def test_reusing_cache_rotates_one_spare_and_copies_few_rows_in_place():
    """ReusingDecoderCache: a permutation of most rows gathers each buffer into one spare buffer (the
    replaced buffer becomes the next spare: after the first, no allocation); a reorder that changes few
    rows copies them in place; fewer rows reuse the same memory (prefix views); contents as the plain cache."""
    model = tiny_model()
    src, src_mask = source([5, 2, 4, 3])
    plain = model.init_cache(model.encode(src, src_mask), src_mask, max_len=6)
    fast = model.init_cache(model.encode(src, src_mask), src_mask, max_len=6, cache_cls=ReusingDecoderCache)
    for c in (plain, fast):
        model.decode_step(torch.tensor([5, 6, 7, 8]), c)
    storages = lambda c: {t.untyped_storage().data_ptr() for t in c.self_k + c.self_v}
    seen = storages(fast)
    n_buffers = len(seen)
    for idx, in_place in ((torch.tensor([1, 0, 3, 2]), False), (torch.tensor([1, 0, 3, 2]), False),
                          (torch.tensor([0, 0, 2, 3]), True), (torch.tensor([3, 1, 0]), False),
                          (torch.tensor([2, 0]), False)):
        before = fast.self_k[0].data_ptr()
        plain.reorder(idx)
        fast.reorder(idx)
        assert (fast.self_k[0].data_ptr() == before) == in_place
        for a, b in zip(plain.self_k + plain.self_v, fast.self_k + fast.self_v):
            assert b.shape == a.shape and b.is_contiguous()
            torch.testing.assert_close(a[:, :, :1], b[:, :, :1], atol=0, rtol=0)
        seen |= storages(fast) | {fast.spare.untyped_storage().data_ptr()}
    assert len(seen) == n_buffers + 1  # one spare buffer, reused throughout
    torch.testing.assert_close(model.decode_step(torch.tensor([4, 5]), plain),
                               model.decode_step(torch.tensor([4, 5]), fast), atol=0, rtol=0)


@pytest.mark.parametrize("cache_cls", [DecoderCache, ReusingDecoderCache])
@torch.no_grad()
def test_growing_cache_holds_what_the_preallocated_one_holds(cache_cls):
    """A cache that grows by chunks of 2 positions, through steps, beam expansion, permutations and
    finished rows leaving: after every step its filled positions equal a preallocated cache's
    (chunk 0), its logits too, and its capacity is the filled positions rounded up to the chunk."""
    model = tiny_model()
    src, src_mask = source([7, 2, 5])
    memory = model.encode(src, src_mask)
    pre = model.init_cache(memory, src_mask, max_len=11, chunk=0)
    grown = model.init_cache(memory, src_mask, max_len=11, cache_cls=cache_cls, chunk=2)
    assert pre.capacity == 11 and grown.capacity == 2 and grown.max_len == pre.max_len == 11
    reorders = {1: torch.arange(3).repeat_interleave(3), 3: torch.tensor([2, 0, 1, 3, 4, 5, 8, 8, 6]),
                4: torch.tensor([0, 1, 2, 3, 3, 5, 6, 7, 6]), 6: torch.tensor([6, 7, 8, 0, 1, 2]),
                9: torch.tensor([4, 0])}
    rows = 3
    for t in range(11):
        if t in reorders:
            pre.reorder(reorders[t])
            grown.reorder(reorders[t])
            rows = len(reorders[t])
        new = tokens(rows, 1, seed=20 + t)[:, 0]
        torch.testing.assert_close(model.decode_step(new, grown), model.decode_step(new, pre), atol=0, rtol=0)
        assert grown.capacity == min(11, 2 * ((t + 2) // 2)) and grown.length == t + 1
        for a, b in zip(pre.self_k + pre.self_v, grown.self_k + grown.self_v):
            assert torch.equal(a[:, :, : t + 1], b[:, :, : t + 1])
    with pytest.raises(ValueError, match="max_len=11"):
        model.decode_step(torch.tensor([5, 5]), grown)


@torch.no_grad()
def test_cache_shapes_and_contract():
    model = tiny_model()
    src, src_mask = source([5, 2])
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=7)
    assert isinstance(cache, DecoderCache) and cache.length == 0 and cache.max_len == 7
    assert len(cache.self_k) == len(cache.cross_v) == 2
    assert cache.self_k[0].shape == (2, 4, min(7, GROW_CHUNK), 8) and cache.cross_k[0].shape == (2, 4, 5, 8)
    with pytest.raises(ValueError):
        DecoderCache(cache.self_k, cache.self_v, cache.cross_k, cache.cross_v, src_mask, group=2)
    # append writes at `length` and returns the filled positions; only advance moves on
    k1, v1 = torch.full((2, 4, 8), 1.0), torch.full((2, 4, 8), -1.0)
    keys, values = cache.append(1, k1, v1)
    assert keys.shape == values.shape == (2, 4, 1, 8) and torch.equal(keys[:, :, 0], k1) and cache.length == 0
    keys, _ = cache.append(1, 2 * k1, 2 * v1)  # the same position again (no advance): overwritten
    assert keys.shape[2] == 1 and torch.equal(keys[:, :, 0], 2 * k1)
    cache.advance()
    keys, values = cache.append(1, 3 * k1, 3 * v1)
    assert keys.shape[2] == 2 and torch.equal(keys[:, :, 0], 2 * k1) and torch.equal(values[:, :, 1], 3 * v1)
    k, v, mask = cache.cross(0)
    assert k is cache.cross_k[0] and v is cache.cross_v[0] and mask.shape == (2, 1, 1, 5)
    for _ in range(6):
        cache.advance()
    with pytest.raises(ValueError, match="full"):
        cache.next_position()


@torch.no_grad()
def test_steps_under_bf16_autocast_track_full_decode():
    model = tiny_model()
    src, src_mask = source([6, 4])
    tgt = tokens(2, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = full_logits(model, src, src_mask, tgt).float()
        cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=6)
        steps = []
        for t in range(6):
            logits = model.decode_step(tgt[:, t], cache)
            steps.append(logits.float())
    assert cache.self_k[0].dtype == torch.bfloat16
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("kw", [dict(norm="pre"), CONFIGS[2], CONFIGS[5]])
@torch.no_grad()
def test_a_joined_step_gives_each_search_the_full_decode_of_its_prefix(kw):
    """The steps of three searches at different positions, with different sources, source lengths and groups
    (beams sharing one source, and one row per source), run as one batch (nmt/search/joining.py): each
    search's logits equal the teacher-forced decode of its own prefix, step after step, through a reorder
    of one of them between joined steps and a search joining late; one search's step alone is its plain step."""
    model = tiny_model(**kw)
    searches = []  # [cache, src rows, src_mask rows, prefix [b,t]]
    for lengths, seed, cls in (([7, 2], 1, DecoderCache), ([3], 4, ReusingDecoderCache), ([9, 5, 4], 5, DecoderCache)):
        src, src_mask = source(lengths, seed=seed)
        cache = model.init_cache(model.encode(src, src_mask), src_mask, max_len=14, cache_cls=cls)
        searches.append([cache, src, src_mask, tokens(len(lengths), 0)])
    beams = torch.arange(2).repeat_interleave(3)  # the first search: 3 beams per source
    searches[0][0].reorder(beams, None, 3)
    searches[0][1:3] = [searches[0][1][beams], searches[0][2][beams]]
    searches[0][3] = searches[0][3][beams]
    for t in range(10):
        active = [s for i, s in enumerate(searches) if t >= 3 * i]  # starting 3 steps apart: different positions
        if t == 5:  # the first search drops a sentence and reorders its beams between two joined steps
            idx = torch.tensor([4, 3, 3])
            searches[0][0].reorder(idx, torch.tensor([1]), 3)
            searches[0][1:] = [x[idx] for x in searches[0][1:]]
        new = [tokens(s[3].shape[0], 1, seed=30 + 7 * t + i)[:, 0] for i, s in enumerate(active)]
        logits = joined_step([(model, s[0], x) for s, x in zip(active, new)])
        for s, x, got in zip(active, new, logits):
            s[3] = torch.cat([s[3], x[:, None]], 1)
            torch.testing.assert_close(got, full_logits(model, s[1], s[2], s[3])[:, -1], atol=1e-5, rtol=0)
    assert [s[0].length for s in searches] == [10, 7, 4]

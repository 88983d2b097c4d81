"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Encoder-decoder with multi-head attention through `F.scaled_dot_product_attention`,
pre-norm (default, with a final LayerNorm per stack) or post-norm (the paper),
sinusoidal (three table layouts) or learned positions, shared or separate vocabularies,
optional embedding scaling and output bias, and cached step-by-step decoding
(`init_cache` + `decode_step`, see nmt/search/cache.py). The options cover Hugging Face's
MarianMT and M2M100/NLLB models exactly (nmt/interop/hf.py maps their weights).

Shapes: B batch, S source length, T target length, D d_model, H heads,
Dh head dim (D / H), V vocabulary. Masks follow nmt/masks.py: True = may attend.

Parameter names are kept flat and stable (they are mapped to other toolkits):
`src_embed`, `tgt_embed`, `src_positions`/`tgt_positions` (learned only),
`encoder.layers.N.{self_attn.qkv_proj, self_attn.out_proj, ffn.fc1, ffn.fc2, norm1, norm2}`,
`decoder.layers.N.{self_attn.*, cross_attn.q_proj, cross_attn.kv_proj,
cross_attn.out_proj, ffn.*, norm1, norm2, norm3}`, `encoder.final_norm`,
`decoder.final_norm` (pre-norm only), `output_proj` (bias with `output_bias` only).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.search.cache import GROW_CHUNK, DecoderCache
from nmt.config import ModelConfig
from nmt.layout import PAD_ID
from nmt.masks import attention_mask

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """The paper's table [n_positions, D]: PE(p, 2i) = sin(p / 10000^(2i/D)), PE(p, 2i+1) = cos(...)."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # [P, 1]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table.float()


def sinusoidal_halves_positions(n_positions: int, d_model: int) -> Tensor:
    """MarianMT's table [n_positions, D] (transformers' MarianSinusoidalPositionalEmbedding.create_weight):
    the paper's frequencies, sines in the first half, cosines in the second:
    PE(p, i) = sin(p / 10000^(2i/D)), PE(p, D/2 + i) = cos(p / 10000^(2i/D)), i < D/2 (computed in float64)."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # [P, 1]
    angle = position / torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # [P, D/2]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()


def sinusoidal_fairseq_positions(n_positions: int, d_model: int) -> Tensor:
    """fairseq's (tensor2tensor's) table [n_positions, D], as transformers' M2M100SinusoidalPositionalEmbedding
    .get_embedding computes it (float32): PE(p, i) = sin(p * w_i), PE(p, D/2 + i) = cos(p * w_i),
    w_i = exp(-i * log(10000) / (D/2 - 1)). Row p is position p; fairseq's models start at row padding_idx + 1."""
    half = d_model // 2
    inv_freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
    angle = torch.arange(n_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # [P, D/2]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)


POSITION_TABLES = {"sinusoidal": sinusoidal_positions, "sinusoidal_halves": sinusoidal_halves_positions,
                   "sinusoidal_fairseq": sinusoidal_fairseq_positions}


def position_table(cfg: ModelConfig) -> Tensor:
    """The fixed table [max_positions, D] of a sinusoidal `cfg.positions`: row p for position p, i.e. the
    formula's rows position_offset .. position_offset + max_positions - 1."""
    table = POSITION_TABLES[cfg.positions](cfg.position_offset + cfg.max_positions, cfg.d_model)
    return table[cfg.position_offset:].clone()


def _xavier_chunks(weight: Tensor, n_chunks: int) -> None:
    """Xavier-uniform init of a fused [n*D, D] projection as n separate [D, D] matrices."""
    for chunk in weight.data.chunk(n_chunks, dim=0):
        nn.init.xavier_uniform_(chunk)


def _joined(parts: list[Tensor]) -> Tensor:
    """The outputs of a step's parts (`DecoderCache.parts`) as one batch."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused Q/K/V projection."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.head_dim, self.dropout = n_heads, d_model // n_heads, dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def reset_parameters(self) -> None:
        _xavier_chunks(self.qkv_proj.weight, 3)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.qkv_proj.bias)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """x [B,T,D], mask [B,1,1,T] or None -> [B,T,D]."""
        B, T, D = x.shape
        q, k, v = self.qkv_proj(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x [B,H,T,Dh]
        dropout_p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))

    def step(self, x: Tensor, cache: DecoderCache, layer: int) -> Tensor:
        """One new position per row. x [B,D]; its K/V go into `cache` (layer `layer`), and it
        attends to every filled position (the cache returns only those, or all with a mask). -> [B,D]."""
        B, D = x.shape
        q, k, v = self.qkv_proj(x).view(B, 3, self.n_heads, self.head_dim).unbind(1)  # 3 x [B,H,Dh]
        ys = []
        for rows, part in cache.parts():  # the whole cache (a joined step: each search's rows with its own)
            keys, values = part.append(layer, k[rows], v[rows])  # [b,H,t,Dh] (StaticDecoderCache: [b,H,Tmax,Dh])
            ys.append(F.scaled_dot_product_attention(q[rows, :, None], keys, values, attn_mask=part.self_mask()))
        return self.out_proj(_joined(ys).view(B, D))  # ([B,H,1,Dh])


class CrossAttention(nn.Module):
    """Multi-head attention from the decoder to the encoder memory; fused K/V projection."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.head_dim, self.dropout = n_heads, d_model // n_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.q_proj.weight)
        _xavier_chunks(self.kv_proj.weight, 2)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for lin in (self.q_proj, self.kv_proj, self.out_proj):
            nn.init.zeros_(lin.bias)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory [B,S,D] -> keys, values, each [B,H,S,Dh] (views of one projection)."""
        B, S, _ = memory.shape
        k, v = self.kv_proj(memory).view(B, S, 2, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return k, v

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """x [B,T,D] attends to k, v [B,H,S,Dh] under mask [B,1,1,S] -> [B,T,D]."""
        B, T, D = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B,H,T,Dh]
        dropout_p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        """x [B,T,D], memory [B,S,D], mask [B,1,1,S] -> [B,T,D]."""
        return self.attend(x, *self.project_kv(memory), mask)

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """The attention weights SDPA computes inside `forward` (no dropout): softmax(q k^T / sqrt(Dh))
        over the unmasked keys. x [B,T,D], memory [B,S,D], mask [B,1,1,S] -> [B,H,T,S]."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B,H,T,Dh]
        k, _ = self.project_kv(memory)  # [B,H,S,Dh]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # [B,H,T,S]
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


class FeedForward(nn.Module):
    """Position-wise FFN: fc2(dropout(act(fc1(x))))."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str, activation_dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.activation = ACTIVATIONS[activation]
        self.activation_dropout = nn.Dropout(activation_dropout)

    def reset_parameters(self) -> None:
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., D] -> [..., D]."""
        h = self.activation(self.fc1(x))
        return self.fc2(self.activation_dropout(h) if self.training else h)


class _Sublayers(nn.Module):
    """Residual wiring shared by both layer types: pre-norm or post-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.dropout = nn.Dropout(cfg.dropout)

    def residual(self, x: Tensor, norm: nn.LayerNorm, fn, *args) -> Tensor:
        """pre: x + drop(fn(norm(x))); post (paper): norm(x + drop(fn(x))). (Dropout is skipped, not
        called, in eval mode, where it is the identity: one module call less per sublayer and step.)"""
        if self.pre_norm:
            y = fn(norm(x), *args)
            return x + (self.dropout(y) if self.training else y)
        y = fn(x, *args)
        return norm(x + (self.dropout(y) if self.training else y))


class EncoderLayer(_Sublayers):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        D = cfg.d_model
        self.self_attn = SelfAttention(D, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(D, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x [B,S,D], mask [B,1,1,S] -> [B,S,D]."""
        x = self.residual(x, self.norm1, self.self_attn, mask)
        return self.residual(x, self.norm2, self.ffn)


class DecoderLayer(_Sublayers):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        D = cfg.d_model
        self.self_attn = SelfAttention(D, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = CrossAttention(D, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(D, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        """Teacher forcing. x [B,T,D], memory [B,S,D], mask [B,1,1,S] -> [B,T,D].

        Self-attention is causal and has no target padding mask: targets are padded on
        the right, so a real position t only sees positions <= t, which are all real.
        Padded positions see real ones and padding; their outputs are garbage that the
        loss ignores (their targets are PAD) and that never flows back into a real position.
        """
        x = self.residual(x, self.norm1, lambda h: self.self_attn(h, is_causal=True))
        x = self.residual(x, self.norm2, self.cross_attn, memory, mask)
        return self.residual(x, self.norm3, self.ffn)

    def cross_attention_weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """The cross-attention weights of this layer's forward pass. x [B,T,D] (the layer's input) -> [B,H,T,S]."""
        x = self.residual(x, self.norm1, lambda h: self.self_attn(h, is_causal=True))
        return self.cross_attn.weights(self.norm2(x) if self.pre_norm else x, memory, mask)

    def step(self, x: Tensor, cache: DecoderCache, i: int) -> Tensor:
        """One position per row, layer i of `cache`. x [B,D] -> [B,D].

        Cross-attention runs per source group: the `cache.group` rows of one source sentence
        (its beams) are that sentence's `group` queries against its single K/V copy.
        """
        x = self.residual(x, self.norm1, self.self_attn.step, cache, i)
        x = self.residual(x, self.norm2, self._cross_step, cache, i)
        return self.residual(x, self.norm3, self.ffn)

    def _cross_step(self, x: Tensor, cache: DecoderCache, i: int) -> Tensor:
        """x [B,D] -> [B,D]: rows viewed as [N, group, D], i.e. `group` queries per source."""
        B, D = x.shape
        return _joined([self.cross_attn.attend(x[rows].view(-1, part.group, D), *part.cross(i)).view(-1, D)
                        for rows, part in cache.parts()])  # (a joined step: each search's rows with its own cache)


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else None

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x [B,S,D] (embedded), mask [B,1,1,S] -> [B,S,D]."""
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x) if self.final_norm is not None else x


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else None

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        """x [B,T,D] (embedded), memory [B,S,D], mask [B,1,1,S] -> [B,T,D]."""
        for layer in self.layers:
            x = layer(x, memory, mask)
        return self.final_norm(x) if self.final_norm is not None else x

    def step(self, x: Tensor, cache: DecoderCache) -> Tensor:
        """x [B,D] (embedded token at position cache.length) -> [B,D]."""
        for i, layer in enumerate(self.layers):
            x = layer.step(x, cache, i)
        return self.final_norm(x) if self.final_norm is not None else x


class Transformer(nn.Module):
    """Encoder-decoder Transformer returning logits (no softmax, no loss)."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = PAD_ID):
        """pad_id: the padding id of both vocabularies: nmt's tokenizers use 0, imported models their own
        (MarianMT: vocab_size - 1, M2M100: 1). Its embedding row starts at zero and the embedding lookup
        gives it no gradient (with tie_output it is still trained as PAD's output row)."""
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"n_heads={cfg.n_heads} must divide d_model={cfg.d_model}")
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"share_embeddings needs equal vocabularies, got source {src_vocab_size} "
                             f"and target {tgt_vocab_size}")
        self.cfg, self.pad_id = cfg, pad_id
        self.max_positions = cfg.max_positions
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        D = cfg.d_model
        self.src_embed = nn.Embedding(src_vocab_size, D, padding_idx=pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(tgt_vocab_size, D, padding_idx=pad_id)
        if cfg.positions == "learned":
            self.src_positions = nn.Embedding(cfg.max_positions, D)
            self.tgt_positions = nn.Embedding(cfg.max_positions, D)
        else:
            self.register_buffer("sinusoids", position_table(cfg), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.output_proj = nn.Linear(D, tgt_vocab_size, bias=cfg.output_bias)
        if cfg.tie_output:
            self.output_proj.weight = self.tgt_embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections, zero biases, N(0, D^-0.5) embeddings with the pad row zeroed."""
        std = self.cfg.d_model ** -0.5
        for module in self.modules():
            if isinstance(module, (SelfAttention, CrossAttention, FeedForward)):
                module.reset_parameters()
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        embeds = [self.src_embed] if self.tgt_embed is self.src_embed else [self.src_embed, self.tgt_embed]
        for embed in embeds:  # a list, not a set: a fixed order keeps the init reproducible
            nn.init.normal_(embed.weight, 0.0, std)
            with torch.no_grad():
                embed.weight[self.pad_id].zero_()
        if self.cfg.positions == "learned":
            nn.init.normal_(self.src_positions.weight, 0.0, std)
            nn.init.normal_(self.tgt_positions.weight, 0.0, std)
        if not self.cfg.tie_output:
            nn.init.normal_(self.output_proj.weight, 0.0, std)
        if self.output_proj.bias is not None:
            nn.init.zeros_(self.output_proj.bias)

    def compile_layers(self, shapes: int = 0) -> None:
        """torch.compile each encoder and decoder layer's training forward in place (`train.compile`), with
        dynamic shapes; a stack's layers share one compiled graph, and parameter names do not change. Eval
        mode and decoding run eagerly. Duck sizing is turned off (process-wide), so a first batch whose row
        count equals its length does not specialise the graph. shapes > 0 (data.length_buckets: batches of
        that many shapes): a graph per shape without dynamic sizes, captured as CUDA graphs on a GPU (mode
        "reduce-overhead"), with Dynamo's recompile limit raised to hold them all (process-wide)."""
        import torch.fx.experimental._config as fx_config

        from nmt.device import allow_recompiles

        fx_config.use_duck_shape = False
        cuda = next(self.parameters()).device.type == "cuda"
        options = dict(dynamic=True)
        if shapes:
            allow_recompiles(shapes)
            options = dict(dynamic=False, mode="reduce-overhead" if cuda else None)
        for layer in [*self.encoder.layers, *self.decoder.layers]:
            eager = layer.forward
            compiled = torch.compile(eager, **options)

            def forward(*args, _eager=eager, _compiled=compiled, _layer=layer):
                return (_compiled if _layer.training else _eager)(*args)
            layer.forward = forward

    def num_parameters(self) -> int:
        """Distinct trainable parameters (shared/tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ embedding

    def _positions(self, side: str, start: int, length: int) -> Tensor:
        """Position vectors [length, D] for positions start .. start+length-1."""
        self._check_positions(start + length)
        return self._position_table(side)[start : start + length]

    def _check_positions(self, n: int) -> None:
        """ValueError unless a sequence of n positions fits the position table."""
        if n > self.max_positions:
            raise ValueError(f"sequence of {n} positions exceeds model.max_positions={self.max_positions}")

    def _position_table(self, side: str) -> Tensor:
        """[max_positions, D]: the learned table of `side` or the fixed sinusoids."""
        if self.cfg.positions == "learned":
            return (self.src_positions if side == "src" else self.tgt_positions).weight
        return self.sinusoids

    def _embed(self, tokens: Tensor, side: str) -> Tensor:
        """tokens [B,L] -> dropout(embed * embed_scale + positions) [B,L,D] (embed_scale: sqrt(D) or 1)."""
        embed = self.src_embed if side == "src" else self.tgt_embed
        x = embed(tokens) * self.embed_scale + self._positions(side, 0, tokens.shape[1])
        return self.dropout(x)

    # ------------------------------------------------------------------ full sequences

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """src [B,S] ids, src_mask [B,S] (True = token; None: no padding) -> memory [B,S,D]."""
        return self.encoder(self._embed(src, "src"), attention_mask(src_mask))

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor | None) -> Tensor:
        """Teacher forcing. tgt_in [B,T] (BOS + y), memory [B,S,D], src_mask [B,S] -> logits [B,T,V]."""
        h = self.decoder(self._embed(tgt_in, "tgt"), memory, attention_mask(src_mask))
        return self.output_proj(h)

    def forward(self, src: Tensor, src_mask: Tensor | None, tgt_in: Tensor) -> Tensor:
        """src [B,S], src_mask [B,S] or None (no source padding), tgt_in [B,T] -> logits [B,T,V]."""
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask)

    def alignment(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Last decoder layer's cross-attention weights, averaged over heads, in a teacher-forced pass
        (computed explicitly: SDPA returns no weights). src, src_mask [B,S], tgt_in [B,T] -> [B,T,S]."""
        memory, mask = self.encode(src, src_mask), attention_mask(src_mask)
        x = self._embed(tgt_in, "tgt")
        *layers, last = self.decoder.layers
        for layer in layers:
            x = layer(x, memory, mask)
        return last.cross_attention_weights(x, memory, mask).mean(dim=1)

    # ------------------------------------------------------------------ cached decoding

    def init_cache(self, memory: Tensor, src_mask: Tensor, max_len: int,
                   cache_cls: type[DecoderCache] = DecoderCache, chunk: int = GROW_CHUNK) -> DecoderCache:
        """Cache for decoding up to `max_len` target positions (BOS included) of B rows.

        memory [B,S,D], src_mask [B,S]. Cross-attention K/V are computed here, once per layer.
        chunk: the self-attention buffers grow by this many positions as needed (0: max_len at once).
        Expand to beams with `cache.reorder(torch.arange(B).repeat_interleave(K))`.
        """
        if max_len > self.max_positions:
            raise ValueError(f"max_len={max_len} exceeds model.max_positions={self.max_positions}")
        cross = [layer.cross_attn.project_kv(memory) for layer in self.decoder.layers]
        return cache_cls.create([k for k, _ in cross], [v for _, v in cross], src_mask, max_len, chunk)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens [B] at position cache.length -> logits [B,V] for the next token.

        Each layer appends this position's self-attention K/V to the cache, which then
        advances (the cache changes in place; it owns its buffers). Logits come in the output
        projection's dtype: float32, or bfloat16/float16 under autocast (callers apply .float()).
        """
        self._check_positions(cache.next_position() + 1)  # next_position raises if the cache is full
        x = self.tgt_embed(tokens) * self.embed_scale + cache.position_vectors(self._position_table("tgt"))  # [B,D]
        h = self.decoder.step(self.dropout(x) if self.training else x, cache)
        cache.advance()
        return self.output_proj(h)

"""Hugging Face model directories for the import/export tests (imported as `hf_fixtures`).

Tiny MarianMT / M2M100 models built with transformers' own classes, random weights made peaked
(scaled embeddings and output layer, so greedy and beam choices are not near-ties), saved with
`save_pretrained`, plus tokenizer files written the way the hub's are: SentencePiece models trained
here on the shipped Bible corpus, and

- Marian: source.spm, target.spm, vocab.json (`</s>` 0, `<unk>` 1, the pieces of both models in
  an order unrelated to SentencePiece's ids, a few left out so they become `<unk>`, `>>fr<<` and
  `>>en<<`, `<pad>` last), tokenizer_config.json;
- M2M100: sentencepiece.bpe.model, vocab.json (fairseq dictionary `<s> <pad> </s> <unk>` + pieces),
  tokenizer_config.json and special_tokens_map.json listing the `__xx__` language tokens;
- NLLB: sentencepiece.bpe.model and tokenizer.json (transformers' conversion of it, with the 202
  language codes added at sp_size + 1 + i and `<mask>` after them, as on the hub).

Needs transformers (a test-only dependency): the callers skip without it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import shutil

import sentencepiece as spm
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")
DATA = os.path.join(ROOT, "data", "bible-es-en")
SIZES = dict(d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
             encoder_layers=2, decoder_layers=2, max_position_embeddings=256, dropout=0.1)


def corpus_lines(split: str, lang: str, n: int, skip: int = 0) -> list[str]:
    with gzip.open(os.path.join(DATA, f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
        out = [line.strip() for _, line in zip(range(skip + n), f)]
    return out[skip:]


def train_spm(lines: list[str], vocab_size: int, model_type: str) -> bytes:
    """SentencePiece's default special ids (unk 0, bos 1, eos 2, no pad), as the hub's models have."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=vocab_size,
                                   model_type=model_type, character_coverage=1.0, minloglevel=2)
    return out.getvalue()


def pieces(proto: bytes) -> list[str]:
    sp = spm.SentencePieceProcessor(model_proto=proto)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]


def _write(path: str, data) -> None:
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
        f.write(data if isinstance(data, (bytes, str)) else json.dumps(data, ensure_ascii=False))


def marian_tokenizer(d: str, n_lines: int = 2000, vocab: int = 400) -> int:
    """Marian tokenizer files in d; returns the vocabulary size V (pad = V - 1)."""
    src = train_spm(corpus_lines("train", "es", n_lines), vocab, "unigram")
    tgt = train_spm(corpus_lines("train", "en", n_lines), vocab, "unigram")
    words = list(dict.fromkeys(pieces(src) + pieces(tgt)))
    random.Random(0).shuffle(words)
    words = [w for i, w in enumerate(words) if i % 37 != 5] + [">>fr<<", ">>en<<"]  # a few pieces left out
    table = {"</s>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    table["<pad>"] = len(table)
    os.makedirs(d, exist_ok=True)
    _write(os.path.join(d, "source.spm"), src)
    _write(os.path.join(d, "target.spm"), tgt)
    _write(os.path.join(d, "vocab.json"), table)
    _write(os.path.join(d, "tokenizer_config.json"), {"source_lang": "es", "target_lang": "en",
                                                     "tokenizer_class": "MarianTokenizer"})
    return len(table)


def m2m100_codes() -> list[str]:
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    return list(FAIRSEQ_LANGUAGE_CODES["m2m100"])


def m2m100_tokenizer(d: str, n_lines: int = 2000, vocab: int = 400) -> int:
    """M2M100 tokenizer files in d; returns the model's vocabulary size (dictionary + 100 languages + 8)."""
    proto = train_spm(corpus_lines("train", "es", n_lines) + corpus_lines("train", "en", n_lines), vocab, "bpe")
    words = pieces(proto)
    random.Random(1).shuffle(words)  # a fairseq dictionary is ordered by frequency, not by SentencePiece id
    words = [w for i, w in enumerate(words) if i % 41 != 7]
    table = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    os.makedirs(d, exist_ok=True)
    _write(os.path.join(d, "sentencepiece.bpe.model"), proto)
    _write(os.path.join(d, "vocab.json"), table)
    specials = [f"__{c}__" for c in m2m100_codes()]
    _write(os.path.join(d, "tokenizer_config.json"), {"tokenizer_class": "M2M100Tokenizer", "src_lang": "es",
                                                     "tgt_lang": "en", "additional_special_tokens": specials})
    _write(os.path.join(d, "special_tokens_map.json"), {"additional_special_tokens": specials})
    return len(table) + 100 + 8


def nllb_tokenizer(d: str, n_lines: int = 2000, vocab: int = 400) -> int:
    """NLLB tokenizer files in d; returns the vocabulary size (sp_size + 1 + 202 languages + <mask>)."""
    import transformers
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    proto = train_spm(corpus_lines("train", "es", n_lines) + corpus_lines("train", "en", n_lines), vocab, "bpe")
    n = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
    os.makedirs(d, exist_ok=True)
    raw = d + ".conversion"
    os.makedirs(raw, exist_ok=True)
    _write(os.path.join(raw, "sentencepiece.bpe.model"), proto)
    transformers.NllbTokenizer.from_pretrained(raw).save_pretrained(raw)  # transformers' conversion to tokenizer.json
    with open(os.path.join(raw, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    shutil.rmtree(raw)
    special = dict(single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    added = [t for t in tj["added_tokens"] if t["content"] != "<mask>"]
    added += [dict(id=n + 1 + i, content=c, **special) for i, c in enumerate(FAIRSEQ_LANGUAGE_CODES)]
    added.append(dict(special, id=n + 1 + len(FAIRSEQ_LANGUAGE_CODES), content="<mask>", lstrip=True, normalized=True))
    tj["added_tokens"] = added
    _write(os.path.join(d, "sentencepiece.bpe.model"), proto)
    _write(os.path.join(d, "tokenizer.json"), tj)
    _write(os.path.join(d, "tokenizer_config.json"), {"tokenizer_class": "NllbTokenizer", "src_lang": "spa_Latn",
                                                     "tgt_lang": "eng_Latn"})
    return n + 1 + len(FAIRSEQ_LANGUAGE_CODES) + 1


# --------------------------------------------------------------------------- models

def peaked(model, *, embed: float = 1.0, gamma: float = 3.0, sublayers: float = 1.0, cross: float = 1.0, seed: int = 0):
    """Random weights that give peaked, varied greedy outputs (a random decoder otherwise repeats one
    token): every weight perturbed off its initialisation; the decoder's token embeddings scaled by
    `embed` and its self-attention / feed-forward outputs by `sublayers` (the residual carries the
    previous token, an untied output layer maps it to a pseudo-random next one), cross-attention
    outputs by `cross`; the decoder's last LayerNorm gain by `gamma` (sharp distributions: greedy and
    beam choices are no near-ties); one hidden dimension a constant 1 there (gain 0, bias 1) and 0 in
    every embedding, so that `set_eos_offset` can move the EOS logit alone. Eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            p.add_(0.3 * torch.randn(p.shape, generator=g))
            if "decoder.layers" in name and ("self_attn.out_proj" in name or ".fc2." in name):
                p.mul_(sublayers)
            if "decoder.layers" in name and "encoder_attn.out_proj" in name:
                p.mul_(cross)
        model.get_decoder().embed_tokens.weight.mul_(embed)
        last = _last_decoder_norm(model)
        last.weight.mul_(gamma)
        last.weight[0], last.bias[0] = 0.0, 1.0
        for embedding in _output_matrices(model):
            embedding[:, 0] = 0.0
    return model.eval()


def _last_decoder_norm(model) -> torch.nn.LayerNorm:
    return [m for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm) and ".decoder." in f".{n}"][-1]


def _output_matrices(model) -> list[torch.Tensor]:
    """The output projection and every embedding matrix (the same tensor when tied)."""
    mats = [model.get_output_embeddings().weight, model.get_input_embeddings().weight,
            model.get_decoder().embed_tokens.weight]
    return list({m.data_ptr(): m for m in mats}.values())


def set_eos_offset(model, tokenizer, sources: list[str], steps_per_sentence: float = 12.0, **generate):
    """Add a constant to the EOS logit (through the constant hidden dimension of `peaked`) so that
    greedy outputs of `sources` end after about `steps_per_sentence` tokens: the offset is the quantile
    of the per-step gaps (best logit - EOS logit) that EOS then wins. Other tokens' ranking is unchanged."""
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=1, max_length=40, output_scores=True, return_dict_in_generate=True,
                             **generate)
        eos = model.config.eos_token_id
        gaps = torch.cat([(s.max(dim=-1).values - s[:, eos])[torch.isfinite(s[:, eos])] for s in out.scores])
        offset = torch.quantile(gaps.float(), 1.0 / steps_per_sentence).item()
        model.get_output_embeddings().weight[eos, 0] += offset
    return model


def train(model, tokenizer, steps: int, seed: int = 0, batch_size: int = 32):
    """`steps` AdamW updates of transformers' own loss (the model's forward with `labels`) on Bible
    pairs (es -> en, the lines the toy tokenizers were trained on): a weak but real translation model,
    whose distributions are not near-ties and whose beam search differs from greedy search. Eval mode."""
    src, tgt = corpus_lines("train", "es", 2000), corpus_lines("train", "en", 2000)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        rows = rng.sample(range(len(src)), batch_size)
        batch = tokenizer([src[i] for i in rows], text_target=[tgt[i] for i in rows], return_tensors="pt",
                          padding=True, truncation=True, max_length=48)
        labels = batch["labels"].masked_fill(batch["labels"] == model.config.pad_token_id, -100)
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def marian_model(d: str, seed: int = 0, train_steps: int = 0, **overrides):
    """A tiny OPUS-MT-like MarianMTModel with its tokenizer in d (save_pretrained). Returns the model.
    Random `peaked` weights, or with train_steps > 0 trained by `train`."""
    import transformers

    V = marian_tokenizer(d)
    config = transformers.MarianConfig(**{**SIZES, "vocab_size": V, "pad_token_id": V - 1, "decoder_start_token_id": V - 1,
                                          "eos_token_id": 0, "forced_eos_token_id": 0, "activation_function": "swish",
                                          "scale_embedding": True, "tie_word_embeddings": False, **overrides})
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(d)
    if train_steps:
        train(model, tokenizer, train_steps, seed)
    else:
        peaked(model, sublayers=0.1, cross=0.3, seed=seed)
        set_eos_offset(model, tokenizer, corpus_lines("dev", "es", 32), bad_words_ids=[[V - 1]])
    model.generation_config.update(num_beams=4, max_length=60, bad_words_ids=[[V - 1]])
    model.save_pretrained(d)
    return model


def m2m100_model(d: str, seed: int = 0, nllb: bool = False, train_steps: int = 0, **overrides):
    """A tiny M2M100ForConditionalGeneration with an M2M100 (or NLLB) tokenizer in d. Random `peaked`
    weights, or with train_steps > 0 trained by `train` (Spanish -> English)."""
    import transformers

    V = nllb_tokenizer(d) if nllb else m2m100_tokenizer(d)
    config = transformers.M2M100Config(**{**SIZES, "vocab_size": V, "activation_function": "relu",
                                          "scale_embedding": True, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
                                          "tie_word_embeddings": False, **overrides})
    torch.manual_seed(seed)
    model = transformers.M2M100ForConditionalGeneration(config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(d)
    forced = tokenizer.convert_tokens_to_ids("eng_Latn" if nllb else "__en__")
    if train_steps:
        tokenizer.src_lang, tokenizer.tgt_lang = ("spa_Latn", "eng_Latn") if nllb else ("es", "en")
        train(model, tokenizer, train_steps, seed)
        model.generation_config.update(forced_bos_token_id=forced)
    else:
        peaked(model, embed=10.0, seed=seed)
        set_eos_offset(model, tokenizer, corpus_lines("dev", "es", 32), forced_bos_token_id=forced, bad_words_ids=[[1]])
    model.generation_config.update(num_beams=5, max_length=60)
    model.save_pretrained(d)
    return model

"""A synthetic translation task small enough to learn on CPU in well under a minute.

Toy "Spanish -> English": a fixed word-for-word dictionary plus one local
reordering rule (a noun's adjective follows it in the source and precedes it
in the target):

    el perro rojo ve la casa grande   ->   the red dog sees the big house
    el gato come y el sol ve el rio   ->   the cat eats and the sun sees the river

Sentences are `phrase verb phrase`, optionally followed by `y phrase verb
phrase`; a phrase is `el|la noun [adjective]`. Every output is deterministic
for a given seed, so tests can share and compare runs.

    write_task(tmp_path)           -> dict of file paths (train/valid/test src+tgt)
    tiny_config(tmp_path, ...)     -> a validated nmt Config for a small fast run
    random_corpus(n)               -> an EncodedCorpus of n random pairs (no tokenizer needed)
"""

from __future__ import annotations

import os
import random

import numpy as np

from nmt.config import Config, config_from_dict
from nmt.data import EncodedCorpus

NOUNS = {"casa": "house", "perro": "dog", "gato": "cat", "libro": "book", "mesa": "table",
         "arbol": "tree", "rio": "river", "sol": "sun", "luna": "moon", "flor": "flower"}
ADJECTIVES = {"rojo": "red", "grande": "big", "azul": "blue", "viejo": "old", "nuevo": "new", "bueno": "good"}
VERBS = {"come": "eats", "ve": "sees", "tiene": "has", "lee": "reads"}
ARTICLES = {"el": "the", "la": "the"}


def _phrase(rng: random.Random, nouns: list[str]) -> tuple[list[str], list[str]]:
    art, noun = rng.choice(list(ARTICLES)), rng.choice(nouns)
    src, tgt = [art, noun], [ARTICLES[art], NOUNS[noun]]
    if rng.random() < 0.6:
        adj = rng.choice(list(ADJECTIVES))
        src, tgt = src + [adj], [ARTICLES[art], ADJECTIVES[adj], NOUNS[noun]]  # noun adj -> adj noun
    return src, tgt


def _clause(rng: random.Random, nouns: list[str]) -> tuple[list[str], list[str]]:
    s1, t1 = _phrase(rng, nouns)
    verb = rng.choice(list(VERBS))
    s2, t2 = _phrase(rng, nouns)
    return s1 + [verb] + s2, t1 + [VERBS[verb]] + t2


def make_pairs(n: int, seed: int, nouns: list[str] | None = None) -> list[tuple[str, str]]:
    """`n` (source, target) sentence pairs, deterministic for `seed`; `nouns`: the source nouns
    used (default: all of NOUNS)."""
    rng = random.Random(seed)
    nouns = list(NOUNS) if nouns is None else list(nouns)
    pairs = []
    for _ in range(n):
        src, tgt = _clause(rng, nouns)
        if rng.random() < 0.3:
            s2, t2 = _clause(rng, nouns)
            src, tgt = src + ["y"] + s2, tgt + ["and"] + t2
        pairs.append((" ".join(src), " ".join(tgt)))
    return pairs


def write_task(directory: str, n_train: int = 3000, n_valid: int = 100, n_test: int = 100,
               seed: int = 0) -> dict[str, str]:
    """Write train/valid/test .es/.en files into `directory`; returns {"train.src": path, ...}."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    splits = {"train": make_pairs(n_train, seed), "valid": make_pairs(n_valid, seed + 1),
              "test": make_pairs(n_test, seed + 2)}
    for split, pairs in splits.items():
        for side, lang, col in (("src", "es", 0), ("tgt", "en", 1)):
            path = os.path.join(str(directory), f"{split}.{lang}")
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(p[col] + "\n" for p in pairs))
            paths[f"{split}.{side}"] = path
    return paths


def tiny_config_dict(directory: str, **train_overrides) -> dict:
    """A raw config dict for a ~50k-parameter model that learns the task in a few hundred steps."""
    paths = write_task(os.path.join(str(directory), "data"))
    train = dict(optimizer="adam", lr=2e-3, schedule="inverse_sqrt", warmup_steps=50, label_smoothing=0.1,
                 clip_norm=1.0, max_steps=300, valid_every=100, log_every=20, keep_last=2,
                 valid_max_sentences=0, num_samples=2, metric="bleu", device="cpu", precision="fp32",
                 threads=1)
    train.update(train_overrides)
    return {
        "name": "synthetic", "seed": 1, "output_dir": os.path.join(str(directory), "runs"),
        "data": {"src_lang": "es", "tgt_lang": "en",
                 "train": {"src": paths["train.src"], "tgt": paths["train.tgt"]},
                 "valid": {"src": paths["valid.src"], "tgt": paths["valid.tgt"]},
                 "test": {"src": paths["test.src"], "tgt": paths["test.tgt"]},
                 "tokenizer": {"vocab_size": 64, "model_type": "word", "threads": 1},
                 "batch_tokens": 600, "max_len": 40},
        "model": {"d_model": 64, "n_heads": 4, "layers": 2, "ffn_dim": 128, "dropout": 0.1, "max_positions": 64},
        "decode": {"beam_size": 1, "max_len_a": 1.2, "max_len_b": 5},
        "train": train,
    }


def tiny_config(directory: str, **train_overrides) -> Config:
    """`tiny_config_dict` validated into a Config."""
    return config_from_dict(tiny_config_dict(directory, **train_overrides))


def random_corpus(n: int, vocab: int = 20, seed: int = 0) -> EncodedCorpus:
    """n pairs of 2-8 random real tokens (ids 4..vocab-1) per side, as `load_data` would encode them."""
    rng = np.random.default_rng(seed)
    s_lens, t_lens = rng.integers(2, 9, n), rng.integers(2, 9, n)
    s_tok = rng.integers(4, vocab, int(s_lens.sum())).astype(np.int16)
    t_tok = rng.integers(4, vocab, int(t_lens.sum())).astype(np.int16)
    off = lambda lens: np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return EncodedCorpus(s_tok, off(s_lens), t_tok, off(t_lens))


def prepare_data(cfg: Config, run_dir: str, log=print):
    """(tokenizer, Data) as `nmt train` prepares them: build_tokenizer, then load_data."""
    from nmt.data import load_data
    from nmt.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(cfg, run_dir, log)
    return tokenizer, load_data(cfg, tokenizer, run_dir, log)

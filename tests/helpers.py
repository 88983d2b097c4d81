"""Helpers shared by the tests (imported as `helpers`: pytest puts tests/ on sys.path).

- A synthetic translation task small enough to learn on CPU in well under a minute (below).
- `make_tiny_checkpoint`: an untrained tiny model with a word-level SentencePiece model;
  `multilingual_checkpoint`: one with the target-language tokens of `LANGS`.
- `multilingual_dict`: the synthetic task as es -> en and es -> xx (`backwards`).
- `DDP_MICRO` / `DDP_CLIP`: the two-rank DDP step of tests/test_distributed.py (the test and its workers).
- `FakeModel` / `FakeCache` / `fake_batch`: a scripted decoder for exact search tests.
- Corpus helpers for the data tests: `corpus`, `write`, `corpus_cfg`, `make_cfg`, `from_lists`,
  `dirty_corpus`, `prepare_data`.
- The CLI as a user meets it: `run_nmt` (`python -m nmt` in a subprocess), `one_line_error` (exit code,
  one line on stderr, no traceback), `write_yaml`, `config_errors`; `ROOT` (the repository) and `ENV` (what subprocesses get).

Fixtures shared by several test files are in conftest.py (`one_thread`, `ckpt`).

The synthetic task:

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

import gzip
import os
import random
import resource
import signal
import subprocess
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from nmt.model.checkpoint import record, save_checkpoint
from nmt.config import Config, TokenizerConfig, config_from_dict
from nmt.data.batches import EncodedCorpus
from nmt.model.transformer import Transformer
from nmt.text.tokenizer import EOS_ID, PAD_ID, Tokenizer, train_sentencepiece

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
# what a CLI subprocess gets: one OpenMP thread (2 shared cores), this tree's nmt first on the path
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}

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
    from nmt.data.batches import load_data
    from nmt.text.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(cfg, run_dir, log)
    return tokenizer, load_data(cfg, tokenizer, run_dir, log)


# --------------------------------------------------------------------------- a tiny checkpoint

MAX_POSITIONS = 24  # sources longer than 23 tokens are truncated


def make_tiny_checkpoint(path: str, seed: int = 0, symbols: tuple[str, ...] = (),
                         max_positions: int = MAX_POSITIONS, **model) -> str:
    """An untrained tiny model + word-level SentencePiece model saved as an nmt checkpoint; `symbols`:
    user-defined SentencePiece symbols (e.g. nmt.text.protect.PLACEHOLDERS); max_positions: a larger one
    lets a search run long (e.g. with decode.min_len); `model`: other model keys."""
    text = [s for pair in make_pairs(200, 0) for s in pair]
    tok_cfg = TokenizerConfig(vocab_size=64 + len(symbols), model_type="word", threads=1)
    tokenizer = Tokenizer(train_sentencepiece(text, tok_cfg, seed=1, what="joint", log=lambda m: None,
                                              symbols=list(symbols)))
    raw = {"data": {"src_lang": "es", "tgt_lang": "en", "max_len": 20,
                    "train": {"src": "train.es", "tgt": "train.en"}, "valid": {"src": "valid.es", "tgt": "valid.en"},
                    "tokenizer": {"vocab_size": 64, "model_type": "word"}},
           "model": {"d_model": 16, "n_heads": 2, "layers": 1, "ffn_dim": 32, "dropout": 0.0,
                     "max_positions": max_positions, "tie_output": False, **model},
           "decode": {"beam_size": 2, "max_len_a": 0.5, "max_len_b": 4, "batch_tokens": 30, "max_batch_size": 3}}
    cfg = config_from_dict(raw, check_files=False)
    torch.manual_seed(seed)
    model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    with torch.no_grad():  # flatter next-token distributions: varied outputs from an untrained model
        model.output_proj.weight.normal_(0.0, 0.3)
    save_checkpoint(record(model.state_dict(), tokenizer, cfg, step=seed), path)
    return path


LANGS = ("de", "fr")  # the target languages of `multilingual_checkpoint`


def multilingual_checkpoint(path: str, default: str | None = None) -> str:
    """An untrained tiny model whose word tokenizer has the target-language tokens __de__, __fr__."""
    text = [s for pair in make_pairs(200, 0) for s in pair]
    proto = train_sentencepiece(text, TokenizerConfig(vocab_size=70, model_type="word", threads=1), seed=1,
                                what="joint", log=lambda m: None, symbols=[f"__{c}__" for c in LANGS])
    plain = Tokenizer(proto)
    ids = {c: plain.encode_tgt([f"__{c}__"])[0][-1] for c in LANGS}
    tokenizer = Tokenizer(proto, languages=ids, default_tgt_lang=default)
    raw = {"data": {"src_lang": "es", "tgt_lang": "de", "train": {"src": "a", "tgt": "b"}, "valid": {"src": "a", "tgt": "b"},
                    "tokenizer": {"vocab_size": 70, "model_type": "word"}, "max_len": 20},
           "model": {"d_model": 16, "n_heads": 2, "layers": 1, "ffn_dim": 32, "dropout": 0.0, "max_positions": 24,
                     "tie_output": False},
           "decode": {"beam_size": 1, "max_len_a": 0.5, "max_len_b": 4}}
    cfg = config_from_dict(raw, check_files=False)
    torch.manual_seed(0)
    model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    with torch.no_grad():
        model.output_proj.weight.normal_(0.0, 0.3)
        for i in ids.values():  # the model would rather not say the language token: forcing must do it
            model.output_proj.weight[i] = -model.output_proj.weight[i].abs() * 10
    save_checkpoint(record(model.state_dict(), tokenizer, cfg), path)
    return path


# --------------------------------------------------------------------------- a multilingual task

def backwards(line: str) -> str:
    """The second target language "xx" of the synthetic task: English with every word spelled backwards."""
    return " ".join(w[::-1] for w in line.split())


def multilingual_dict(directory: str, **train) -> dict:
    """The synthetic task as es->en and es->xx (xx: words spelled backwards), one validation set each."""
    raw = tiny_config_dict(directory, **train)
    p = os.path.join(directory, "data")
    for split in ("train", "valid", "test"):
        with open(os.path.join(p, f"{split}.en"), encoding="utf-8") as f, \
                open(os.path.join(p, f"{split}.xx"), "w", encoding="utf-8") as out:
            out.writelines(backwards(line) + "\n" for line in f)
    d = raw["data"]
    d["train"] = [{"src": f"{p}/train.es", "tgt": f"{p}/train.en"},
                  {"src": f"{p}/train.es", "tgt": f"{p}/train.xx", "tgt_lang": "xx"}]
    d["valid"] = [{"src": f"{p}/valid.es", "tgt": f"{p}/valid.en"},
                  {"src": f"{p}/valid.es", "tgt": f"{p}/valid.xx", "tgt_lang": "xx"}]
    d["tokenizer"]["vocab_size"] = 100
    return raw


# --------------------------------------------------------------------------- a tiny model for training steps

def tiny_transformer(seed: int = 0, dropout: float = 0.0) -> Transformer:
    """A seeded 2-layer d_model 16 Transformer over 20 ids a side (`random_corpus`'s vocabulary)."""
    from nmt.config import ModelConfig

    torch.manual_seed(seed)
    return Transformer(ModelConfig(d_model=16, n_heads=2, layers=2, ffn_dim=32, dropout=dropout, max_positions=32),
                       20, 20)


# the DDP step of tests/test_distributed.py, shared with its worker processes: rank r's two micro-batches
# (different sizes and token counts on the two ranks) and the clip norm
DDP_MICRO = {0: [np.arange(0, 5), np.arange(5, 12)], 1: [np.arange(12, 15), np.arange(15, 24)]}
DDP_CLIP = 0.5


class NoSchedule:
    """A learning-rate schedule that leaves the rate alone and counts its steps."""

    steps = 0

    def step(self):
        self.steps += 1


# --------------------------------------------------------------------------- scripted fake model

V = 8  # the fake model's vocabulary: 4 specials + 4 real tokens


class FakeCache:
    """Rows' sources and prefixes (BOS first); reorder selects rows."""

    def __init__(self, src: torch.Tensor, prefix: torch.Tensor):
        self.src, self.prefix = src, prefix  # [R,S], [R,t]

    @property
    def length(self) -> int:
        return self.prefix.shape[1]

    def reorder(self, indices: torch.Tensor, sources=None, group=None) -> None:
        assert indices.dtype == torch.long and int(indices.max()) < self.src.shape[0]
        self.src, self.prefix = self.src.index_select(0, indices), self.prefix.index_select(0, indices)


class FakeModel:
    """Next-token logits are a fixed function of (source tokens, prefix): a seeded table.

    EOS gets more likely as the prefix grows, so hypotheses end at different lengths.
    Records the rows of every decode_step call and counts full `decode` calls.
    """

    max_positions = 64

    def __init__(self, seed: int = 0, scale: float = 2.0):
        self.seed, self.scale = seed, scale
        self.step_rows: list[int] = []
        self.n_decode = 0
        self._table: dict = {}

    def logits(self, src: tuple, prefix: tuple) -> torch.Tensor:
        key = (src, prefix)
        if key not in self._table:
            g = torch.Generator().manual_seed(zlib.crc32(repr((self.seed,) + key).encode()))
            row = torch.randn(V, generator=g) * self.scale
            row[EOS_ID] += 0.7 * len(prefix) - 1.5
            self._table[key] = row
        return self._table[key]

    def log_probs(self, src: tuple, prefix: tuple) -> torch.Tensor:
        return F.log_softmax(self.logits(src, prefix), dim=-1)

    @staticmethod
    def _src(src_row: torch.Tensor) -> tuple:
        return tuple(t for t in src_row.tolist() if t != PAD_ID)

    def encode(self, src, src_mask):
        return src.float()[..., None]  # [B,S,1]: the source itself

    def init_cache(self, memory, src_mask, max_len, cache_cls=None):
        assert max_len <= self.max_positions
        return FakeCache(memory[..., 0].long(), torch.empty(memory.shape[0], 0, dtype=torch.long))

    def decode_step(self, tokens, cache):
        self.step_rows.append(tokens.shape[0])
        prefix = torch.cat([cache.prefix, tokens[:, None]], dim=1)
        logits = torch.stack([self.logits(self._src(s), tuple(p.tolist())) for s, p in zip(cache.src, prefix)])
        cache.prefix = prefix
        return logits

    def decode(self, tgt_in, memory, src_mask):
        self.n_decode += 1
        src = memory[..., 0].long()
        return torch.stack([torch.stack([self.logits(self._src(s), tuple(p[: i + 1].tolist())) for i in range(len(p))])
                            for s, p in zip(src, tgt_in)])


def fake_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded random sources ending in EOS: src, src_mask [B,S]."""
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    src = torch.zeros(len(lengths), S, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, V, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src, src != PAD_ID


# --------------------------------------------------------------------------- corpora for the data tests

ES = "casa perro gato árbol niño libro agua sol luna mar cielo tierra fuego viento año señor".split()
EN = "house dog cat tree child book water sun moon sea sky earth fire wind year lord".split()


def corpus(n=300, seed=0):
    r = random.Random(seed)
    pairs = [[r.randrange(len(ES)) for _ in range(r.randint(1, 12))] for _ in range(n)]
    return [" ".join(ES[i] for i in k) for k in pairs], [" ".join(EN[i] for i in k) for k in pairs]


def write(path, lines, gz=False):
    text = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(text) if gz else text)
    return str(path)


def corpus_cfg(src, tgt):
    return {"src": str(src), "tgt": str(tgt)}


def make_cfg(tmp_path, train, valid=None, **data):
    d = {"src_lang": "es", "tgt_lang": "en", "train": train, "valid": valid or train,
         "tokenizer": {"vocab_size": 60, "threads": 2}, **data}
    return config_from_dict({"data": d, "output_dir": str(tmp_path), "name": "run"}, check_files=False)


def quiet(msg):
    pass


def from_lists(src, tgt, dtype=np.int16, parts=None):
    """An EncodedCorpus built by hand from lists of ids (`parts`: pairs per corpus)."""
    def side(seqs):
        off = np.zeros(len(seqs) + 1, np.int64)
        off[1:] = np.cumsum([len(x) for x in seqs])
        return np.array([i for x in seqs for i in x], dtype), off
    stats = {"corpora": [{"kept": n} for n in parts]} if parts else {}
    return EncodedCorpus(*side(src), *side(tgt), stats)


def dirty_corpus(tmp_path):
    """300 clean pairs plus 2 with an empty side, 2 over-long, 1 with a bad length ratio."""
    src, tgt = corpus(300)
    long_es, long_en = " ".join(["casa perro"] * 40), " ".join(["house dog"] * 40)
    src += ["", "gato", long_es, "sol", "perro perro perro perro perro perro perro perro perro perro"]
    tgt += ["cat", "", "sun", long_en, "dog"]
    return corpus_cfg(write(tmp_path / "t.es", src), write(tmp_path / "t.en", tgt)), src, tgt


# --------------------------------------------------------------------------- the CLI in a subprocess

def run_nmt(*args: str, stdin: str | None = None, cwd: str = ROOT, env: dict | None = None, timeout: float = 300,
            limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    """Run `python -m nmt ARGS` (text mode); limit_bytes caps the size of files it writes (RLIMIT_FSIZE: a
    write past it fails with EFBIG, as a full disk fails with ENOSPC; Python ignores SIGXFSZ)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))) if limit_bytes else None
    return subprocess.run([sys.executable, "-m", "nmt", *args], input=stdin, capture_output=True, text=True, cwd=cwd,
                          env=ENV if env is None else env, timeout=timeout, preexec_fn=limit)


def default_sigint() -> None:
    """A subprocess's preexec_fn: SIGINT back to its default. A suite started in the background (`pytest &`, a CI
    job without a terminal) runs with SIGINT ignored, which its children inherit, and Python then installs no
    KeyboardInterrupt handler: a test that sends SIGINT to a command sets it back first (as a terminal's Ctrl-C
    finds it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_line_error(proc: subprocess.CompletedProcess, code: int, *patterns: str) -> str:
    """Assert that `proc` failed with exit `code` and one line on stderr (no traceback) containing every pattern;
    returns that line."""
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode()
    assert proc.returncode == code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for pattern in patterns:
        assert pattern in err, err
    return err.strip()


def config_errors(raw: dict, **kw) -> list[str]:
    """The errors `config_from_dict(raw, **kw)` reports (it must raise ConfigError)."""
    import pytest

    from nmt.config import ConfigError

    with pytest.raises(ConfigError) as e:
        config_from_dict(raw, **kw)
    return e.value.errors


def write_yaml(path, raw: dict) -> str:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(raw, f)
    return str(path)


# --------------------------------------------------------------------------- host reads

HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero", "masked_select",
              "unique", "equal", "allclose", "is_nonzero"}  # values copied to the host (a device sync on a GPU)


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the calls that read tensor values on the host: HOST_READS, boolean-mask indexing, and
    repeat_interleave with tensor repeats (its output size depends on the values)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else None
        masks = index if isinstance(index, tuple) else (index,)
        if name in HOST_READS or any(isinstance(m, torch.Tensor) and m.dtype == torch.bool for m in masks) or (
                name == "repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor)):
            self.count += 1
        return func(*args, **(kwargs or {}))

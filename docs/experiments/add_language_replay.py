#!/usr/bin/env python3
"""Issue 59 item 14 at a small scale (BENCHMARKS.md, "Add a language: the replay an old direction needs"):
an es->en M2M100 (NLLB layout) made and trained with transformers' own classes on the Bible, imported with
`nmt import --src-lang spa_Latn`, then given Basque (en->eu gettext messages) with es->en replay. Variants
vary one factor at a time. Everything goes under OUT (env, default runs/add-language-replay).

    apt-get update && python3 scripts/prepare_gettext.py --out OUT/gettext --langs eu,es
    python3 docs/experiments/add_language_replay.py base steps=2000 batch=32 lr=1e-3   # transformers, then nmt import
    python3 docs/experiments/add_language_replay.py run NAME [key=value ...]   # one fine-tuning + 40-line scores
    python3 docs/experiments/add_language_replay.py eval200 NAME ...   # es->en on 200 lines: BLEU, off target,
                                                                      # lines with Basque words, loops

`run`'s keys (DEFAULTS: the issue's setting): init, pieces, replay_lines, replay_weight, lr, steps,
batch_tokens, replay_share, seed, langid (the checkpoint whose language identifier scores every run).
Run as in the session of 2026-11-29 with `nice -n 19`, one thread per run.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import os
import random
import re
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_add_language as bench  # noqa: E402

R = os.path.abspath(os.environ.get("OUT", os.path.join(ROOT, "runs", "add-language-replay")))
DATA = f"{R}/data"          # train.en-es.{en,es}: the Bible (bench.make_tokenizer's layout)
GT = f"{R}/gettext"
M2M = os.environ.get("M2M") == "1"
BASE_HF, BASE = (f"{R}/m2m-hf", f"{R}/m2m.pt") if M2M else (f"{R}/base-hf", f"{R}/base.pt")
C = {"en": "en", "es": "es", "eu": "eu"} if M2M else {"en": "eng_Latn", "es": "spa_Latn", "eu": "eus_Latn"}
SIZE = dict(vocab=2000, d_model=128, layers=2, heads=4, ffn=512, max_positions=256, max_len=96)
TEST_LINES = 40


def prepare():
    os.makedirs(DATA, exist_ok=True)
    for split in ("train", "dev", "test"):
        for lang in ("en", "es"):
            with gzip.open(os.path.join(ROOT, "data", "bible-es-en", f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
                text = f.read()
            with open(f"{DATA}/{split}.en-es.{lang}", "w", encoding="utf-8") as f:
                f.write(text)


def base(steps: int, batch: int, lr: float, seed: int = 1):
    import torch
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    prepare()
    args = argparse.Namespace(data=DATA, old=["es"], train_lines=0, vocab=SIZE["vocab"],
                              max_positions=SIZE["max_positions"])
    if M2M:
        make_m2m_tokenizer()
    else:
        bench.make_tokenizer(args, BASE_HF)
    tok = transformers.AutoTokenizer.from_pretrained(BASE_HF)
    n_vocab = len(tok) + 108 if M2M else len(tok)  # M2M100: 100 language codes + 8 madeup words after vocab.json
    config = transformers.M2M100Config(
        vocab_size=n_vocab, d_model=SIZE["d_model"], encoder_layers=SIZE["layers"], decoder_layers=SIZE["layers"],
        encoder_attention_heads=SIZE["heads"], decoder_attention_heads=SIZE["heads"], encoder_ffn_dim=SIZE["ffn"],
        decoder_ffn_dim=SIZE["ffn"], max_position_embeddings=SIZE["max_positions"], dropout=0.1,
        attention_dropout=0.0, activation_function="relu", scale_embedding=True, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        tie_word_embeddings=True)
    model = transformers.M2M100ForConditionalGeneration(config)
    src = bench.read(f"{DATA}/train.en-es.es")
    tgt = bench.read(f"{DATA}/train.en-es.en")
    items = [(s, t) for s, t in zip(src, tgt) if s and t]
    rng = random.Random(seed)
    rng.shuffle(items)
    pool = 100 * batch
    items = [x for i in range(0, len(items), pool) for x in sorted(items[i:i + pool], key=lambda p: len(p[0]))]
    batches = [items[i:i + batch] for i in range(0, len(items), batch)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98))
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, 1.0))
    tok.src_lang, tok.tgt_lang = C["es"], C["en"]
    model.train()
    step, losses, t0 = 0, [], time.time()
    while step < steps:
        rng.shuffle(batches)
        for b in batches:
            enc = tok([s for s, _ in b], text_target=[t for _, t in b], padding=True, truncation=True,
                      max_length=SIZE["max_len"], return_tensors="pt")
            enc["labels"][enc["labels"] == tok.pad_token_id] = -100
            loss = model(**enc).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(), sched.step(), opt.zero_grad()
            losses.append(loss.item())
            step += 1
            if step % 100 == 0:
                print(f"base {step} loss {sum(losses[-100:]) / 100:.3f} {time.time() - t0:.0f}s", flush=True)
            if step == steps:
                break
    model.generation_config.update(num_beams=1, max_length=SIZE["max_len"] + 1,
                                   forced_bos_token_id=tok.convert_tokens_to_ids("__en__" if M2M else "eng_Latn"))
    model.save_pretrained(BASE_HF)
    tok.save_pretrained(BASE_HF)
    from nmt.commands.import_model import ImportOptions, import_command

    if os.path.exists(BASE):
        os.remove(BASE)
    import_command(ImportOptions(BASE_HF, BASE, src_lang=C["es"], tgt_lang=C["en"], quiet=True))
    print("imported", BASE)


def make_m2m_tokenizer():
    import shutil
    import sentencepiece as spm
    import transformers

    if not os.path.exists(f"{R}/base-hf/sentencepiece.bpe.model"):
        raise SystemExit("make the NLLB base first (its SentencePiece model is reused)")
    os.makedirs(BASE_HF, exist_ok=True)
    sp = spm.SentencePieceProcessor(model_file=f"{R}/base-hf/sentencepiece.bpe.model")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(sp.get_piece_size()):
        if not (sp.is_control(i) or sp.is_unknown(i)):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    with open(f"{BASE_HF}/vocab.json", "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    shutil.copy(f"{R}/base-hf/sentencepiece.bpe.model", BASE_HF)
    tok = transformers.M2M100Tokenizer(f"{BASE_HF}/vocab.json", f"{BASE_HF}/sentencepiece.bpe.model", src_lang="es",
                                       tgt_lang="en")
    tok.save_pretrained(BASE_HF)


def config(name: str, o: dict) -> dict:
    import torch

    model = torch.load(BASE, map_location="cpu", weights_only=True)["config"]["model"]
    replay = {"src": f"{DATA}/train.en-es.es", "tgt": f"{DATA}/train.en-es.en", "src_lang": C["es"],
              "tgt_lang": C["en"], "max_sentences": int(o["replay_lines"])}
    if float(o["replay_weight"]) != 1.0:
        replay["weight"] = float(o["replay_weight"])
    new = {"src": f"{GT}/train.en-eu.en", "tgt": f"{GT}/train.en-eu.eu", "src_lang": o.get("new_src", C["en"]),
           "tgt_lang": C["eu"]}
    train = [new] + ([replay] if int(o["replay_lines"]) else [])
    valid = [{"src": f"{DATA}/dev.en-es.es", "tgt": f"{DATA}/dev.en-es.en", "src_lang": C["es"],
              "tgt_lang": C["en"], "max_sentences": 100},
             {"src": f"{GT}/dev.en-eu.en", "tgt": f"{GT}/dev.en-eu.eu", "src_lang": C["en"],
              "tgt_lang": C["eu"], "max_sentences": 100}]
    if not int(o["replay_lines"]):
        valid = valid[1:]
    init = C.get(o["init"], o["init"]) or None
    data = {"src_lang": C["es"], "tgt_lang": C["en"], "add_languages": {C["eu"]: init},
            "tokenizer": {"add_pieces": int(o["pieces"])}, "train": train, "valid": valid,
            "max_len": SIZE["max_len"], "batch_tokens": int(o["batch_tokens"])}
    if o.get("drop_identical") in ("1", "true", True):
        data["drop_identical"] = True
    if "replay_share" in o:
        data["replay_share"] = float(o["replay_share"])
    if o.get("temperature"):
        data["sampling_temperature"] = float(o["temperature"])
    steps = int(o["steps"])
    return {"name": name, "seed": int(o.get("seed", 1)), "output_dir": f"{R}/runs", "data": data, "model": model,
            "train": {"init_from": BASE, "lr": float(o["lr"]), "schedule": "inverse_sqrt",
                      "warmup_steps": max(1, steps // 20), "max_steps": steps, "valid_every": steps,
                      "log_every": max(1, steps // 6), "valid_max_sentences": 100, "keep_last": 1,
                      "device": "cpu", "threads": 1},
            "decode": {"beam_size": 1, "max_len_a": 0, "max_len_b": SIZE["max_len"]}}


DEFAULTS = dict(init="es", pieces=1000, replay_lines=8000, replay_weight=1.0, lr=5e-4, steps=600,
                batch_tokens=1024)


def evaluate(ckpt: str, src: str, ref: str, tgt: str, src_lang: str, langid: str, save: str, extra=None) -> dict:
    from nmt.commands.evaluate import EvaluateOptions, evaluate_command

    out = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):
        overrides = {"tgt_lang": tgt, "src_lang": src_lang, "beam_size": 1, **(extra or {})}
        evaluate_command(EvaluateOptions(None, ref, checkpoint=ckpt, src=src, json_out=True, quiet=True,
                                         save_hyps=save, device="cpu", langid=langid, overrides=overrides),
                         stdout=out)
    rep = json.loads(out.getvalue())
    off = rep.get("off_target") or {}
    return {"bleu": round(rep["bleu"]["score"], 2), "chrf": round(rep["chrf"]["score"], 2),
            "off": off.get("count"), "ref_off": off.get("reference_count"), "n": rep["n_sentences"]}


def test_files():
    os.makedirs(f"{R}/test", exist_ok=True)
    pairs = {"es-en": (f"{DATA}/test.en-es.es", f"{DATA}/test.en-es.en"),
             "en-eu": (f"{GT}/test.en-eu.en", f"{GT}/test.en-eu.eu")}
    out = {}
    for d, (s, r) in pairs.items():
        paths = []
        for p, tag in ((s, "src"), (r, "ref")):
            q = f"{R}/test/{d}.{tag}"
            with open(q, "w", encoding="utf-8") as f:
                f.write("\n".join(bench.read(p, TEST_LINES)) + "\n")
            paths.append(q)
        out[d] = paths
    return out


def new_piece_lines(ckpt: str, hyps: str) -> int:
    """es->en output lines that use a piece the fine-tuning added (ids past the base's 2004 + 1 token)."""
    from nmt.model.checkpoint import load_record

    tok = load_record(ckpt).load_tokenizer(1)
    first = tok.languages[C["eu"]] + 1  # the pieces come after the new language token
    ids = tok.encode_tgt(bench.read(hyps))
    return sum(any(i >= first for i in line) for line in ids)


def run(name: str, o: dict):
    import torch

    torch.set_num_threads(1)
    from nmt.config import config_from_dict
    from nmt.train import train

    cfg = config(name, o)
    t0 = time.time()
    ckpt = f"{R}/runs/{name}/checkpoints/latest.pt"
    if not os.path.exists(ckpt):
        train(config_from_dict(cfg), quiet=True)
    secs = time.time() - t0
    langid = o.get("langid") or ckpt
    files = test_files()
    res = {"name": name, "opts": o, "train_s": round(secs)}
    for d, tgt, sl in (("es-en", C["en"], C["es"]), ("en-eu", C["eu"], C["en"])):
        s, r = files[d]
        res[d] = evaluate(ckpt, s, r, tgt, sl, langid, f"{R}/test/{name}.{d}")
    res["es-en"]["new_piece_lines"] = new_piece_lines(ckpt, f"{R}/test/{name}.es-en")
    with open(f"{R}/runs/{name}/train.log", encoding="utf-8") as f:
        res["valid"] = [line.strip() for line in f if "degeneration" in line]
    print(json.dumps(res))
    with open(f"{R}/results.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(res) + "\n")


# --------------------------------------------------------------------------- 200-line scores

WORD = re.compile(r"\w{4,}")


@functools.lru_cache(None)
def basque_words() -> frozenset:
    """Words (4+ letters) of the Basque training text that the English and Spanish texts never have."""
    eu, other = set(), set()
    for p, s in ((f"{GT}/train.en-eu.eu", eu), (f"{DATA}/train.en-es.en", other), (f"{GT}/train.en-eu.en", other),
                 (f"{GT}/train.en-es.en", other), (f"{DATA}/train.en-es.es", other)):
        with open(p, encoding="utf-8") as f:
            for line in f:
                s.update(w.lower() for w in WORD.findall(line))
    return frozenset(eu - other)


def mixed(path: str) -> int:
    """Output lines holding a Basque-only word (the code-mixing the issue shows)."""
    v = basque_words()
    with open(path, encoding="utf-8") as f:
        return sum(any(w in v for w in WORD.findall(line.lower())) for line in f.read().splitlines())


def eval200(names: list[str], n: int = 200) -> None:
    import torch

    from nmt.evaluation.degeneration import degeneration

    torch.set_num_threads(1)
    src, ref = (bench.read(p, n) for p in (f"{DATA}/test.en-es.es", f"{DATA}/test.en-es.en"))
    os.makedirs(f"{R}/test", exist_ok=True)
    for path, lines in ((f"{R}/test/es-en200.src", src), (f"{R}/test/es-en200.ref", ref)):
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    langid = f"{R}/runs/report/checkpoints/latest.pt"
    for name in names:
        ck = BASE if name == "base" else f"{R}/runs/{name}/checkpoints/latest.pt"
        out = f"{R}/test/{name}.es-en200"
        r = evaluate(ck, f"{R}/test/es-en200.src", f"{R}/test/es-en200.ref", C["en"], C["es"], langid, out)
        r["mixed"] = mixed(out)
        r["loops"] = degeneration(bench.read(out), ref, src)["loops"]["count"]
        print(json.dumps({"name": name, **r}), flush=True)
        with open(f"{R}/eval200.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"name": name, **r}) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "base":
        kw = dict(a.split("=") for a in sys.argv[2:])
        base(int(kw.get("steps", 1500)), int(kw.get("batch", 32)), float(kw.get("lr", 1e-3)))
    elif sys.argv[1] == "run":
        o = {**DEFAULTS, **dict(a.split("=", 1) for a in sys.argv[3:])}
        run(sys.argv[2], o)
    elif sys.argv[1] == "eval200":
        eval200(sys.argv[2:])

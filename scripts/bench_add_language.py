#!/usr/bin/env python3
"""Adding a language to a pretrained multilingual model (issue 38): grown vocabulary + new token +
replay, against no vocabulary growth, no replay, and a model trained from scratch, at one budget.

    python3 scripts/prepare_gettext.py --no-install   # (all its languages: the other recipes need them)
    python3 scripts/bench_add_language.py --data data/gettext --out runs/bench-add-language

Stages (`--stages`, default all, in this order; each reuses what an earlier run of it left in OUT):
  base      a small M2M100ForConditionalGeneration with an NLLB-layout tokenizer, made and trained with
            transformers' own classes only: a SentencePiece BPE model (--vocab pieces) trained on the
            old languages' training text, converted by transformers' NllbTokenizer to tokenizer.json,
            with language codes for the old languages only (eng_Latn and --old); trained with
            transformers (AdamW, linear warmup, one direction per batch of --base-batch sentences of
            similar lengths) on
            en -> each old language for --base-steps steps (--base-drop-identical: without the pairs whose
            target is the source, the rule of data.drop_identical); save_pretrained into OUT/base-hf;
  import    `nmt import OUT/base-hf -o OUT/base.pt --src-lang eng_Latn` (the source language token of
            an imported M2M100/NLLB model is fixed, so every direction is from English);
  train     `nmt train` of four variants, each --steps optimizer steps of --batch-tokens tokens:
              grow      train.init_from base.pt, data.add_languages {NEW: INIT} (--init), data.tokenizer.
                        add_pieces --pieces, the old directions replayed (their corpora in data.train);
              nogrow    the same with add_pieces 0;
              noreplay  grow with the new direction alone in data.train;
              scratch   no init_from: nmt's own model of the base's size and tokenizer size on the
                        same corpora (all directions) and steps;
  evaluate  `nmt evaluate --json` of every model (the imported one too) on the test split of every
            direction (--test-lines), beam --beam; off-target rates with one language identifier for
            all (the grow run's, which every run's corpora would give: it knows every language);
  export    `nmt export --format hf` of the grow model; transformers alone (AutoTokenizer,
            AutoModelForSeq2SeqLM, greedy generate() with the language code forced) against nmt's
            greedy outputs on the test lines of every direction: lines equal, of all and of those
            under the length limit (nmt's output finished before max_len tokens).

Data layout (scripts/prepare_gettext.py): DATA/{train,dev,test}.en-XX.{en,XX}. Language codes are
gettext's (es, pt_BR) in file names and NLLB's in the models (`CODES`). Results: OUT/results.json and
OUT/results.md (tables: new direction BLEU, chrF and off-target rate per variant; every old
direction's BLEU and its change from the imported model), printed at the end; every model's test
outputs in OUT/test/MODEL.LANG. `--quick`: tiny sizes and budgets (a test runs the whole pipeline on
tiny data: tests/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

CODES = {"en": "eng_Latn", "es": "spa_Latn", "de": "deu_Latn", "fr": "fra_Latn", "it": "ita_Latn",
         "pt_BR": "por_Latn", "ru": "rus_Cyrl", "ja": "jpn_Jpan", "zh_CN": "zho_Hans"}
VARIANTS = ("grow", "nogrow", "noreplay", "scratch")
STAGES = ("base", "import", "train", "evaluate", "export")


def read(path: str, limit: int | None = None) -> list[str]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:limit] if limit else lines


def files(data: str, split: str, lang: str) -> tuple[str, str]:
    return os.path.join(data, f"{split}.en-{lang}.en"), os.path.join(data, f"{split}.en-{lang}.{lang}")


# --------------------------------------------------------------------------- the base model (transformers only)

def make_tokenizer(args, directory: str) -> None:
    """sentencepiece.bpe.model, tokenizer.json and tokenizer_config.json of an NLLB-layout tokenizer whose
    language codes are eng_Latn and the old languages (ids after the pieces, then <mask>, as on the hub)."""
    import sentencepiece as spm
    import transformers

    lines = []
    for lang in args.old:
        en, xx = files(args.data, "train", lang)
        lines += read(en, args.train_lines) + read(xx, args.train_lines)
    random.Random(1).shuffle(lines)
    raw = directory + ".conversion"
    os.makedirs(raw, exist_ok=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=os.path.join(raw, "sentencepiece.bpe"),
                                   vocab_size=args.vocab, model_type="bpe", character_coverage=1.0, minloglevel=2,
                                   input_sentence_size=1_000_000, shuffle_input_sentence=True)
    os.remove(os.path.join(raw, "sentencepiece.bpe.vocab"))
    transformers.NllbTokenizer.from_pretrained(raw).save_pretrained(raw)  # transformers' conversion to tokenizer.json
    with open(os.path.join(raw, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    n = spm.SentencePieceProcessor(model_file=os.path.join(raw, "sentencepiece.bpe.model")).get_piece_size()
    codes = [CODES["en"]] + [CODES[lang] for lang in args.old]
    special = dict(single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    added = [t for t in tj["added_tokens"] if t["content"] in ("<s>", "<pad>", "</s>", "<unk>")]
    added += [dict(id=n + 1 + i, content=c, **special) for i, c in enumerate(codes)]
    added.append(dict(special, id=n + 1 + len(codes), content="<mask>", lstrip=True, normalized=True))
    tj["added_tokens"] = added
    os.makedirs(directory, exist_ok=True)
    shutil.copy(os.path.join(raw, "sentencepiece.bpe.model"), directory)
    with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "NllbTokenizer", "src_lang": CODES["en"], "tgt_lang": CODES[args.old[0]],
                   "extra_special_tokens": codes, "model_max_length": args.max_positions}, f)
    shutil.rmtree(raw)


def train_base(args, directory: str, log) -> dict:
    """The base model: made, trained on en -> old languages with transformers, saved; returns timings."""
    import torch
    import transformers

    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    make_tokenizer(args, directory)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    codes = [CODES["en"]] + [CODES[lang] for lang in args.old]
    assert [tok.convert_tokens_to_ids(c) for c in codes] == list(range(tok.convert_tokens_to_ids(codes[0]),
                                                                        tok.convert_tokens_to_ids(codes[0]) + len(codes)))
    config = transformers.M2M100Config(
        vocab_size=len(tok), d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn, max_position_embeddings=args.max_positions, dropout=0.1, attention_dropout=0.0,
        activation_function="relu", scale_embedding=True, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, tie_word_embeddings=True)
    model = transformers.M2M100ForConditionalGeneration(config).to(args.device)
    pairs, dropped = base_pairs(args)
    rng = random.Random(args.seed)
    batches = []
    for lang, items in pairs.items():  # one direction per batch, a share of the batches by size; sentences of
        rng.shuffle(items)  # similar lengths together (pools of 100 batches sorted)
        pool = 100 * args.base_batch
        items = [x for i in range(0, len(items), pool) for x in sorted(items[i:i + pool], key=lambda p: len(p[0]))]
        batches += [(lang, items[i:i + args.base_batch]) for i in range(0, len(items), args.base_batch)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.base_lr, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, args.base_steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 1.0))
    model.train()
    step, losses = 0, []
    while step < args.base_steps:
        rng.shuffle(batches)
        for lang, batch in batches:
            tok.src_lang, tok.tgt_lang = CODES["en"], CODES[lang]
            enc = tok([s for s, _ in batch], text_target=[t for _, t in batch], padding=True, truncation=True,
                      max_length=args.max_len, return_tensors="pt").to(args.device)
            enc["labels"][enc["labels"] == tok.pad_token_id] = -100
            loss = model(**enc).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            if step % max(1, args.base_steps // 10) == 0 or step == args.base_steps:
                log(f"base step {step}/{args.base_steps} loss {sum(losses[-50:]) / len(losses[-50:]):.3f}")
            if step == args.base_steps:
                break
    model.generation_config.update(num_beams=args.beam, max_length=args.max_len + 1,
                                   forced_bos_token_id=tok.convert_tokens_to_ids(CODES[args.old[0]]))
    model.cpu().save_pretrained(directory)
    return {"seconds": time.perf_counter() - t0, "steps": step, "final_loss": sum(losses[-50:]) / len(losses[-50:]),
            "parameters": sum(p.numel() for p in model.parameters()),
            "pairs": {lang: len(items) for lang, items in pairs.items()}, "dropped_identical": dropped}


def base_pairs(args) -> tuple[dict, dict]:
    """The base model's training pairs per old language (empty sides left out) and, with
    --base-drop-identical, how many pairs whose target is the source (nmt's `data.drop_identical` rule)
    were left out too."""
    from nmt.data.corpus import identical_pairs

    pairs, dropped = {}, {}
    for lang in args.old:
        src, tgt = (read(p, args.train_lines) for p in files(args.data, "train", lang))
        both = kept = [(s, t) for s, t in zip(src, tgt) if s and t]
        if args.base_drop_identical:
            same = identical_pairs([s for s, _ in both], [t for _, t in both])
            kept = [p for p, x in zip(both, same) if not x]
        pairs[lang], dropped[lang] = kept, len(both) - len(kept)
    return pairs, dropped


# --------------------------------------------------------------------------- nmt runs

def corpus(args, split: str, lang: str) -> dict:
    src, tgt = files(args.data, split, lang)
    entry = {"src": src, "tgt": tgt, "tgt_lang": CODES[lang]}
    return entry if split == "train" or not args.valid_lines else {**entry, "max_sentences": args.valid_lines}


def variant_config(args, name: str, base_ckpt: str, model_section: dict) -> dict:
    """The nmt config of one variant (module docstring)."""
    new = CODES[args.new]
    old = [] if name == "noreplay" else list(args.old)
    data = {"src_lang": CODES["en"], "tgt_lang": new, "batch_tokens": args.batch_tokens, "max_len": args.max_len,
            "train": [corpus(args, "train", lang) for lang in old + [args.new]],
            "valid": [corpus(args, "dev", lang) for lang in old + [args.new]]}
    if args.train_lines:
        for c in data["train"]:
            c["max_sentences"] = args.train_lines
    if args.replay_weight != 1.0:  # the old directions' share of the mix (data.train.weight)
        for c in data["train"][:len(old)]:
            c["weight"] = args.replay_weight
    if args.drop_identical:
        data["drop_identical"] = True
    train = {"max_steps": args.steps, "valid_every": max(1, args.steps // 2), "log_every": max(1, args.steps // 10),
             "valid_max_sentences": args.valid_lines, "keep_last": 1, "device": args.device}
    if name == "scratch":
        model = {k: model_section[k] for k in ("d_model", "n_heads", "layers", "ffn_dim", "max_positions")}
        data["tokenizer"] = {"vocab_size": args.vocab, "model_type": "unigram"}
        train.update(lr=args.scratch_lr, warmup_steps=max(1, args.steps // 10))
    else:
        model = dict(model_section)
        data["add_languages"] = {new: CODES[args.init] if args.init else None}
        data["tokenizer"] = {"add_pieces": 0 if name == "nogrow" else args.pieces}
        train.update(init_from=base_ckpt, lr=args.lr, schedule="inverse_sqrt", warmup_steps=max(1, args.steps // 20))
    return {"name": name, "seed": args.seed, "output_dir": os.path.join(args.out, "runs"), "data": data, "model": model,
            "train": train, "decode": {"beam_size": args.beam, "max_len_a": 0, "max_len_b": args.max_len}}


def train_variant(raw: dict, log) -> dict:
    from nmt.config import config_from_dict
    from nmt.train import train

    t0 = time.perf_counter()
    result = train(config_from_dict(raw), quiet=True)
    with open(os.path.join(result["run_dir"], "train.log"), encoding="utf-8") as f:
        grown = [line.split(" ", 2)[2] for line in f if "add languages" in line or "add_pieces:" in line]
    log(f"{raw['name']}: {result['step']} steps in {time.perf_counter() - t0:.0f} s; " + " | ".join(grown))
    return {"seconds": time.perf_counter() - t0, "steps": result["step"], "grown": grown,
            "checkpoint": os.path.join(result["run_dir"], "checkpoints", "latest.pt")}


def evaluate(args, name: str, checkpoint: str, lang: str, langid: str) -> dict:
    """`nmt evaluate` of one model on one direction's test lines; its outputs kept in OUT/test/NAME.LANG."""
    from nmt.commands.evaluate import EvaluateOptions, evaluate_command

    src, ref = files(args.data, "test", lang)
    out_dir = os.path.join(args.out, "test")
    os.makedirs(out_dir, exist_ok=True)
    if args.test_lines:  # the first N lines (the gettext files are in a hash order: a random sample)
        for path in (src, ref):
            with open(os.path.join(out_dir, os.path.basename(path)), "w", encoding="utf-8") as f:
                f.write("\n".join(read(path, args.test_lines)) + "\n")
        src, ref = (os.path.join(out_dir, os.path.basename(p)) for p in (src, ref))
    stdout = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):
        opts = EvaluateOptions(None, ref, checkpoint=checkpoint, src=src, json_out=True, quiet=True,
                               save_hyps=os.path.join(out_dir, f"{name}.{lang}"), device=args.device, langid=langid,
                               overrides={"tgt_lang": CODES[lang], "beam_size": args.beam})
        evaluate_command(opts, stdout=stdout)
    report = json.loads(stdout.getvalue())
    off = report.get("off_target") or {}
    return {"bleu": report["bleu"]["score"], "chrf": report["chrf"]["score"], "off_target": off.get("share"),
            "lines": report["n_sentences"]}


def compare_export(args, checkpoint: str, directory: str, lang: str) -> dict:
    """transformers' greedy outputs of the exported directory against nmt's on the test lines of `lang`."""
    import torch
    import transformers

    from nmt import Translator

    lines = read(files(args.data, "test", lang)[0], args.test_lines or None)
    ours = Translator(checkpoint, device=args.device).translate(lines, tgt_lang=CODES[lang], beam_size=1)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval().to(args.device)
    theirs = []
    for i in range(0, len(lines), 32):
        batch = tok(lines[i:i + 32], return_tensors="pt", padding=True, truncation=True,
                    max_length=args.max_positions - 1)  # (longer lines: cut, and left out of "under the limit")
        with torch.no_grad():
            out = model.generate(**batch.to(args.device), num_beams=1,
                                 forced_bos_token_id=tok.convert_tokens_to_ids(CODES[lang]))
        theirs += tok.batch_decode(out, skip_special_tokens=True)
    under = [i for i, r in enumerate(ours) if r.finished and not r.truncated]
    return {"lines": len(lines), "equal": sum(r.text == t for r, t in zip(ours, theirs)),
            "under_limit": len(under), "equal_under_limit": sum(ours[i].text == theirs[i] for i in under)}


# --------------------------------------------------------------------------- tables

def tables(args, results: dict) -> str:
    scores = results["scores"]
    new = args.new
    rows = ["## New direction en -> " + new, "", "| model | BLEU | chrF | off-target |", "|---|---:|---:|---:|"]
    for name in ("imported",) + VARIANTS:
        s = scores.get(name, {}).get(new)
        if s:
            off = "-" if s["off_target"] is None else f"{s['off_target']:.1%}"
            rows.append(f"| {name} | {s['bleu']:.1f} | {s['chrf']:.1f} | {off} |")
    rows += ["", "## Old directions: BLEU (change from the imported model)", "",
             "| model | " + " | ".join(f"en -> {lang}" for lang in args.old) + " |",
             "|---|" + "---:|" * len(args.old)]
    for name in ("imported",) + VARIANTS:
        cells = []
        for lang in args.old:
            s, ref = scores.get(name, {}).get(lang), scores.get("imported", {}).get(lang)
            if s is None:
                cells.append("-")
            elif name == "imported" or ref is None:
                cells.append(f"{s['bleu']:.1f}")
            else:
                cells.append(f"{s['bleu']:.1f} ({s['bleu'] - ref['bleu']:+.1f})")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    if results.get("export"):
        rows += ["", "## Hugging Face export of grow: transformers' greedy outputs equal to nmt's", "",
                 "| direction | lines equal | under the length limit: equal |", "|---|---:|---:|"]
        rows += [f"| en -> {lang} | {e['equal']}/{e['lines']} | {e['equal_under_limit']}/{e['under_limit']} |"
                 for lang, e in results["export"].items()]
    runs = results.get("runs", {})
    if runs:
        rows += ["", "## Runs", "", "| run | steps | seconds |", "|---|---:|---:|"]
        rows += [f"| {name} | {r['steps']} | {r['seconds']:.0f} |" for name, r in runs.items()]
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- main

QUICK = dict(vocab=300, d_model=32, layers=1, heads=2, ffn=64, base_steps=30, base_batch=16, steps=8, pieces=20,
             batch_tokens=600, train_lines=200, valid_lines=8, test_lines=10, beam=1, max_len=48, max_positions=64)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="gettext corpus directory (scripts/prepare_gettext.py)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--old", default="es,de,fr", help="the base model's target languages (gettext codes)")
    p.add_argument("--new", default="it", help="the language to add (gettext code)")
    p.add_argument("--init", default="es", help="the old language whose token initialises the new one ('' = mean)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, from {', '.join(STAGES)}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--vocab", type=int, default=4000, help="SentencePiece pieces of the base (and scratch) model")
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--max-positions", type=int, default=256)
    p.add_argument("--max-len", type=int, default=128, help="longest sequence trained on and generated (tokens)")
    p.add_argument("--base-steps", type=int, default=4000, help="transformers training steps of the base model")
    p.add_argument("--base-batch", type=int, default=48, help="sentences per base training batch")
    p.add_argument("--base-lr", type=float, default=7e-4)
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps of every variant (the fixed budget)")
    p.add_argument("--batch-tokens", type=int, default=1536, help="data.batch_tokens of every variant")
    p.add_argument("--lr", type=float, default=5e-4, help="fine-tuning learning rate (grow, nogrow, noreplay)")
    p.add_argument("--scratch-lr", type=float, default=1e-3)
    p.add_argument("--pieces", type=int, default=250,
                   help="data.tokenizer.add_pieces of grow and noreplay (the full-size run of BENCHMARKS.md: 250 of "
                   "250 / 500 / 2000 did best)")
    p.add_argument("--replay-weight", type=float, default=0.33,
                   help="data.train weight of each old direction's corpus (grow, nogrow, scratch; the new one has 1): "
                        "below 1 gives the new direction a larger share of the steps")
    p.add_argument("--drop-identical", action="store_true",
                   help="data.drop_identical of every variant: training pairs whose target is the source left out")
    p.add_argument("--base-drop-identical", action="store_true",
                   help="the base model's training pairs whose target is the source left out too (a base that copies less)")
    p.add_argument("--train-lines", type=int, default=0, help="use the first N lines of each training corpus (0 = all)")
    p.add_argument("--valid-lines", type=int, default=200, help="validation lines per direction (0 = all)")
    p.add_argument("--test-lines", type=int, default=0, help="score the first N test lines per direction (0 = all)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny sizes and budgets (tests): " +
                   ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    args.old = [lang for lang in args.old.split(",") if lang]
    args.stages, args.variants = args.stages.split(","), args.variants.split(",")
    for lang in args.old + [args.new] + ([args.init] if args.init else []):
        if lang not in CODES:
            p.error(f"unknown language {lang!r} (known: {', '.join(CODES)})")
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    results = json.load(open(path, encoding="utf-8")) if os.path.isfile(path) else {}
    results.update(args={k: v for k, v in vars(args).items()})
    results.setdefault("runs", {})
    results.setdefault("scores", {})

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def save() -> None:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)

    base_dir, base_ckpt = os.path.join(args.out, "base-hf"), os.path.join(args.out, "base.pt")
    if "base" in args.stages:
        results["runs"]["base"] = train_base(args, base_dir, log)
        log(f"base: {results['runs']['base']}")
        save()
    if "import" in args.stages:
        from nmt.commands.import_model import ImportOptions, import_command

        with contextlib.redirect_stderr(io.StringIO()):
            import_command(ImportOptions(base_dir, base_ckpt, src_lang=CODES["en"], tgt_lang=CODES[args.old[0]],
                                         quiet=True))
        log(f"imported into {base_ckpt}")
    if "train" in args.stages:
        import torch

        model_section = torch.load(base_ckpt, map_location="cpu", weights_only=True)["config"]["model"]
        for name in args.variants:
            results["runs"][name] = train_variant(variant_config(args, name, base_ckpt, model_section), log)
            save()
    if "evaluate" in args.stages:
        langid = results["runs"].get("grow", {}).get("checkpoint")
        models = {"imported": base_ckpt, **{n: results["runs"][n]["checkpoint"] for n in args.variants
                                          if n in results["runs"]}}
        for name, checkpoint in models.items():
            for lang in args.old + [args.new]:
                if name == "imported" and lang == args.new:
                    continue  # the imported model has no token for it
                results["scores"].setdefault(name, {})[lang] = evaluate(args, name, checkpoint, lang, langid)
                log(f"{name} en -> {lang}: {results['scores'][name][lang]}")
            save()
    if "export" in args.stages and "grow" in results["runs"]:
        from nmt.commands.export import ExportOptions, export_command

        directory = os.path.join(args.out, "grow-hf")
        checkpoint = results["runs"]["grow"]["checkpoint"]
        export_command(ExportOptions(checkpoint, directory, format="hf", force=True, quiet=True))
        results["export"] = {lang: compare_export(args, checkpoint, directory, lang) for lang in args.old + [args.new]}
        log(f"export --format hf: {results['export']}")
        save()
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(tables(args, results))
    print(tables(args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One multilingual model against one bilingual model per direction, with the same total budget.

    python3 scripts/bench_multilingual.py --config configs/multilingual-gettext.yaml \
        --steps 2000 --out runs/bench-multilingual --zero-shot es-de,de-fr,fr-es,ja-zh_CN

The budget is counted in optimizer steps of the same batch size (data.batch_tokens), i.e. in
training tokens: the multilingual model trains --steps steps, each of the N bilingual models
--steps / N (`--bilingual-steps`). On a machine shared with other jobs a wall-clock budget
would give the runs different shares of the CPU; steps do not (and a step-keyed run is
reproducible). Wall-clock and CPU seconds of every run are recorded next to them.

Stages (`--stages`, default all, in this order):
  prepare   every run's tokenizer and encoded corpora (`build_tokenizer` + `load_data`, as
            `nmt train` makes them), timed and kept out of the budgets: a run then reuses them;
  train     `nmt train` of the multilingual config (train.max_steps = --steps, validated halfway
            and at the end) and of one bilingual config per training corpus (its direction only,
            its own tokenizer of --bilingual-vocab pieces, train.max_steps = --bilingual-steps,
            validated at the end), one after another;
  evaluate  `nmt evaluate --json` on test for each direction: the multilingual model with
            --tgt-lang, the bilingual ones with the multilingual checkpoint's language identifier
            (--langid), so that off-target rates are measured alike; the zero-shot directions with
            the multilingual model on the multi-way test files (test.multi.*).

Test files: each training corpus `.../train.X.Y` has `.../test.X.Y` (the gettext layout);
zero-shot SRC-TGT uses `test.multi.SRC` / `test.multi.TGT` next to them. `--test-lines N`
scores the first N lines of each (OUT/test/; the gettext files are in a hash order, so that is
a random sample); `--decode "--beam 1 ..."` adds decoding flags to every `nmt evaluate`.
Results: OUT/results.json and OUT/results.md (tables), printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

import yaml

from nmt.config import config_from_dict



def _nmt(*args: str) -> list[str]:
    return [sys.executable, "-m", "nmt", *args]


def _env() -> dict:
    return dict(os.environ)  # the children run the nmt this process imports (the installed package)


def _langs(d: dict, corpus: dict) -> tuple[str, str]:
    """(source, target) language of a raw corpus entry (its own, or the data section's)."""
    return corpus.get("src_lang", d["src_lang"]), corpus.get("tgt_lang", d["tgt_lang"])


def configs(raw: dict, out: str, steps: int, bi_steps: int | None, bi_vocab: int) -> dict[str, dict]:
    """{run name: raw config}: the multilingual one, then one bilingual one per training corpus."""
    d = raw["data"]
    bi_steps = bi_steps or steps // len(d["train"])
    multi = json.loads(json.dumps(raw))
    multi.update(output_dir=out)
    multi["train"].update(max_steps=steps, max_time=0, valid_every=steps // 2, valid_every_minutes=0)
    runs = {"multi": multi}
    valid = d["valid"] if isinstance(d["valid"], list) else [d["valid"]]
    for corpus in d["train"]:
        src, tgt = _langs(d, corpus)
        match = [v for v in valid if _langs(d, v) == (src, tgt)]
        bi = json.loads(json.dumps(raw))
        bi.update(name=f"{raw['name']}-{src}-{tgt}", output_dir=out)
        strip = lambda c: {k: v for k, v in c.items() if k not in ("src_lang", "tgt_lang")}  # noqa: E731
        bi["data"].update(src_lang=src, tgt_lang=tgt, train=strip(corpus), valid=strip(match[0]))
        bi["data"]["tokenizer"] = {**bi["data"].get("tokenizer", {}), "vocab_size": bi_vocab}
        bi["train"].update(max_steps=bi_steps, max_time=0, valid_every=0, valid_every_minutes=0)
        runs[f"{src}-{tgt}"] = bi
    return runs


def prepare(runs: dict[str, dict]) -> dict[str, float]:
    """Tokenizer and encoded corpora of every run, in its run directory; seconds per run."""
    from nmt.data.batches import load_data
    from nmt.text.tokenizer import build_tokenizer

    seconds = {}
    for name, raw in runs.items():
        cfg = config_from_dict(raw)
        t0 = time.perf_counter()
        os.makedirs(cfg.run_dir, exist_ok=True)
        tokenizer = build_tokenizer(cfg, cfg.run_dir, lambda m: None)
        load_data(cfg, tokenizer, cfg.run_dir, lambda m: None)
        seconds[name] = round(time.perf_counter() - t0, 1)
        print(f"prepared {name} in {seconds[name]} s", flush=True)
    return seconds


def train(runs: dict[str, dict], out: str) -> dict[str, dict]:
    """`nmt train -q` of each run (config written to OUT/configs/NAME.yaml); steps and seconds."""
    os.makedirs(os.path.join(out, "configs"), exist_ok=True)
    done = {}
    for name, raw in runs.items():
        path = os.path.join(out, "configs", f"{name}.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(raw, f, sort_keys=False, allow_unicode=True)
        cmd = _nmt("train", "--config", path, "-q")
        print("$ " + " ".join(cmd[1:]), flush=True)
        t0, cpu0 = time.perf_counter(), _child_cpu()
        subprocess.run(cmd, check=True, env=_env(), stderr=subprocess.DEVNULL)
        log = open(os.path.join(out, raw["name"], "train.log"), encoding="utf-8").read()
        stop = re.findall(r"stopped at step (\d+)", log)[-1]
        done[name] = {"seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(_child_cpu() - cpu0, 1),
                      "steps": int(stop), "load": round(os.getloadavg()[1], 2)}
        print(f"trained {name}: {done[name]}", flush=True)
    return done


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def evaluate(cmd: list[str]) -> dict:
    print("$ " + " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=True, env=_env(), capture_output=True, text=True)
    res = json.loads(r.stdout)
    off = res.get("off_target") or {}
    return {"bleu": round(res["bleu"]["score"], 2), "chrf": round(res["chrf"]["score"], 2),
            "tok": res["bleu"]["signature"].split("tok:")[1].split("|")[0],
            "off_target": off.get("share"), "ref_off_target": off.get("reference_share"),
            "lines": res["n_sentences"], "seconds": round(time.perf_counter() - t0, 1)}


def _head(path: str, out: str, lines: int | None) -> str:
    """`path`, or a copy of its first `lines` lines in OUT/test/."""
    if not lines:
        return path
    os.makedirs(os.path.join(out, "test"), exist_ok=True)
    copy = os.path.join(out, "test", os.path.basename(path))
    with open(path, encoding="utf-8") as f, open(copy, "w", encoding="utf-8") as g:
        g.writelines(line for _, line in zip(range(lines), f))
    return copy


def evaluate_all(runs: dict[str, dict], out: str, zero_shot: list[str], lines: int | None = None,
                 flags: list[str] = ()) -> dict:
    raw = runs["multi"]
    d = raw["data"]
    multi_ckpt = os.path.join(out, raw["name"], "checkpoints", "best.pt")
    results: dict = {"directions": {}, "zero_shot": {}}
    for corpus in d["train"]:
        src, tgt = _langs(d, corpus)
        s, t = (_head(corpus[k].replace("/train.", "/test."), out, lines) for k in ("src", "tgt"))
        bi_ckpt = os.path.join(out, runs[f"{src}-{tgt}"]["name"], "checkpoints", "best.pt")
        common = ["--src", s, "--ref", t, "--json", "-q", *flags]
        results["directions"][f"{src}-{tgt}"] = {
            "multi": evaluate(_nmt("evaluate", "-c", multi_ckpt, "--tgt-lang", tgt, *common)),
            "bilingual": evaluate(_nmt("evaluate", "-c", bi_ckpt, "--langid", multi_ckpt, *common))}
    folder = os.path.dirname(d["train"][0]["src"])
    for pair in zero_shot:
        src, tgt = pair.split("-", 1)
        s, t = (_head(os.path.join(folder, f"test.multi.{x}"), out, lines) for x in (src, tgt))
        results["zero_shot"][pair] = evaluate(_nmt("evaluate", "-c", multi_ckpt, "--tgt-lang", tgt, "--src", s,
                                                   "--ref", t, "--json", "-q", *flags))
    return results


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def tables(results: dict) -> str:
    lines = ["| direction | multilingual BLEU | chrF | off-target | bilingual BLEU | chrF | off-target | "
             "references off-target | BLEU tokenizer |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["directions"].items():
        m, b = r["multi"], r["bilingual"]
        lines.append(f"| {name} | {m['bleu']:.2f} | {m['chrf']:.2f} | {_pct(m['off_target'])} | {b['bleu']:.2f} | "
                     f"{b['chrf']:.2f} | {_pct(b['off_target'])} | {_pct(m['ref_off_target'])} | {m['tok']} |")
    rows = list(results["directions"].values())
    for key in ("multi", "bilingual"):
        results.setdefault("mean", {})[key] = {k: round(sum(r[key][k] for r in rows) / len(rows), 2)
                                              for k in ("bleu", "chrf")}
    mm, mb = results["mean"]["multi"], results["mean"]["bilingual"]
    lines.append(f"| mean | {mm['bleu']:.2f} | {mm['chrf']:.2f} | | {mb['bleu']:.2f} | {mb['chrf']:.2f} | | | |")
    if results["zero_shot"]:
        lines += ["", "| zero-shot direction | BLEU | chrF | off-target | references off-target | BLEU tokenizer |",
                  "|---|---|---|---|---|---|"]
        for name, z in results["zero_shot"].items():
            lines.append(f"| {name} | {z['bleu']:.2f} | {z['chrf']:.2f} | {_pct(z['off_target'])} | "
                         f"{_pct(z['ref_off_target'])} | {z['tok']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--out", default="runs/bench-multilingual")
    p.add_argument("--steps", type=int, default=2000, help="the multilingual model's train.max_steps")
    p.add_argument("--bilingual-steps", type=int, help="each bilingual model's (default: --steps / their number)")
    p.add_argument("--bilingual-vocab", type=int, default=8000)
    p.add_argument("--zero-shot", default="", help="comma-separated SRC-TGT directions, e.g. es-de,de-fr")
    p.add_argument("--stages", default="prepare,train,evaluate")
    p.add_argument("--test-lines", type=int, help="score the first N lines of each test file (default: all)")
    p.add_argument("--decode", default="", help="decoding flags for nmt evaluate, e.g. \"--beam 1\"")
    args = p.parse_args()
    with open(args.config, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    runs = configs(raw, args.out, args.steps, args.bilingual_steps, args.bilingual_vocab)
    state_path = os.path.join(args.out, "results.json")
    state = json.load(open(state_path)) if os.path.isfile(state_path) else {}
    stages = args.stages.split(",")
    os.makedirs(args.out, exist_ok=True)
    if "prepare" in stages:
        state["prepare_seconds"] = prepare(runs)
    if "train" in stages:
        state["train"] = train(runs, args.out)
    if "evaluate" in stages:
        state.update(evaluate_all(runs, args.out, [z for z in args.zero_shot.split(",") if z], args.test_lines,
                                  args.decode.split()))
        state["evaluation"] = {"test_lines": args.test_lines, "decode": args.decode}
        state["tables"] = tables(state)
        with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
            f.write(state["tables"] + "\n")
        print(state["tables"])
    with open(state_path, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

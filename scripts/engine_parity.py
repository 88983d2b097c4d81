"""Do the PyTorch and CTranslate2 engines give the same lines? One row per control.

    python scripts/engine_parity.py --checkpoint CK.pt --export CT2_DIR --src data/bible-es-en/test.es.gz \
        [--lines 0] [--json OUT] [--control NAME=KEY:VALUE,KEY:VALUE ...]

Each control is a set of decode options given to both engines (through `nmt.Translator`, fp32,
one worker); "checkpoint" is the checkpoint's own decode settings. The prefix control forces,
per line, the first 3 words of the PyTorch engine's output under the checkpoint's settings.
Reported: lines with identical outputs, and the seconds each engine took.
"""

from __future__ import annotations

import argparse
import time

from nmt.benchmarking import first_lines, run_script, write_json


CONTROLS = {
    "checkpoint": {},
    "greedy": {"beam_size": 1},
    "beam 5 gnmt 1.0, no blocking": {"beam_size": 5, "length_penalty_type": "gnmt", "length_penalty": 1.0,
                                     "no_repeat_ngram": 0},
    "beam 5 average 1.0, no-repeat 3": {"beam_size": 5, "length_penalty_type": "average", "length_penalty": 1.0,
                                        "no_repeat_ngram": 3},
    "beam 5 none, no-repeat 4": {"beam_size": 5, "length_penalty_type": "none", "no_repeat_ngram": 4},
    "beam 5, min_len 10": {"min_len": 10},
    "beam 5, nbest 3 (all 3)": {"nbest": 3},
    "prefixes (3 words)": "PREFIX",
}


def parse_control(text: str) -> tuple[str, dict]:
    """`NAME=KEY:VALUE,...` -> (NAME, {KEY: VALUE}); UserError for another form."""
    from nmt.errors import UserError

    name, _, opts = text.partition("=")
    pairs = [kv.split(":", 1) for kv in opts.split(",") if kv]
    if not name or any(len(kv) != 2 or not kv[0] for kv in pairs):
        raise UserError(f"--control {text!r}: expected NAME=KEY:VALUE,... (e.g. g=beam_size:1)")
    return name, dict(pairs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--export", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--lines", type=int, default=0)
    ap.add_argument("--control", nargs="*", help="NAME=KEY:VALUE,... instead of the default set")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    return run_script("engine_parity.py", lambda: compare(args))


def compare(args) -> int:
    from nmt import Translator
    from nmt import textio

    textio.check_paths({"--src": args.src, "--checkpoint": args.checkpoint, "--export": args.export},
                       {"--json": args.json} if args.json else {}, input_dirs=("--export",))
    src = first_lines(textio.read_lines(args.src), args.src, args.lines)
    controls = dict(parse_control(c) for c in args.control) if args.control else CONTROLS
    torch_tr = Translator(args.checkpoint, engine="torch", device="cpu", workers=1)
    ct2_tr = Translator(args.export, engine="ctranslate2", device="cpu", workers=1)
    results, plain = {}, None  # plain: the torch engine's output with the checkpoint's settings
    for name, options in controls.items():
        prefixes = None
        if options == "PREFIX":
            options = {}
            plain = plain or torch_tr.translate(src)
            prefixes = [" ".join(r.text.split()[:3]) for r in plain]
        t0 = time.perf_counter()
        a = torch_tr.translate(src, prefixes=prefixes, **options)
        if not options and prefixes is None:
            plain = a
        t1 = time.perf_counter()
        b = ct2_tr.translate(src, prefixes=prefixes, **options)
        t2 = time.perf_counter()
        same = sum([h.text for h in x.hypotheses] == [h.text for h in y.hypotheses] for x, y in zip(a, b))
        results[name] = {"options": options, "same": same, "lines": len(src), "torch_s": t1 - t0, "ct2_s": t2 - t1}
        print(f"{name:<34} {same}/{len(src)} lines the same ({100 * same / len(src):.2f}%); torch {t1 - t0:.0f} s, "
              f"ctranslate2 {t2 - t1:.0f} s", flush=True)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

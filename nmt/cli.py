"""Command line: `nmt train | translate | evaluate | score | tune | average | import | export | serve`.

Only argument parsing and dispatch live here: each command is an importable function taking one
options object (nmt/commands/). torch is imported lazily, inside the commands, so `nmt --help` stays
fast. Every error prints one line on stderr: exit code 2 for problems the user can fix (ConfigError,
UserError, bad flags, missing files), 1 for an OS error while it ran (disk full), 128 + N when stopped
by signal N: Ctrl-C (130) and SIGTERM (143) stop every command cleanly (outputs are atomic).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

from nmt import __version__

EXIT_FAILURE = 1  # the command could not finish: an OS error (disk full, I/O error) while it ran
EXIT_USAGE = 2  # bad input the user can fix: config, flags, files, data, checkpoints

# Flags of decode keys whose name is not simply --KEY-WITH-DASHES (that one works too).
DECODE_FLAGS = {"beam_size": ["--beam"], "max_batch_size": ["--batch-size"]}
SCORE_KEYS = ("batch_tokens", "max_batch_size", "workers", "src_lang", "tgt_lang", "protect", "protect_pattern")  # `nmt score`'s


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (`nmt translate: error: ...`), exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_decode_options(p: argparse.ArgumentParser, keys: tuple[str, ...] | None = None) -> None:
    """One flag per `decode` key (nmt/schema.py `decode_options`: a section's keys by their flat names), so
    every key can be set from the command line; values are validated by `config.decode_config`."""
    import typing

    from nmt.config import decode_options

    g = p.add_argument_group("search settings (default: the model's `decode` section; configs/README.md)")
    for name, f, tp in decode_options():
        if keys is not None and name not in keys:
            continue
        flags = DECODE_FLAGS.get(name, []) + ["--" + name.replace("_", "-")]
        help = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        if tp is bool:
            g.add_argument(*flags, dest=f"decode_{name}", action=argparse.BooleanOptionalAction, default=None, help=help)
            continue
        choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None
        metavar = "{" + ",".join(choices) + "}" if choices else name.split("_")[-1].upper()
        g.add_argument(*flags, dest=f"decode_{name}", metavar=metavar, default=None, help=help)
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N (default: auto)")


def _add_model_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--checkpoint", "-c", metavar="CKPT", help=f"checkpoint file (e.g. runs/NAME/checkpoints/best.pt) {what}, "
                   "or a directory written by `nmt export`")
    p.add_argument("--model", metavar="DIR", help="CTranslate2 model directory written by `nmt export` (same as "
                   "--engine ctranslate2 --checkpoint DIR)")
    from nmt.translation.engine import ENGINES  # no torch at import

    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="inference engine (default auto: ctranslate2 for an exported directory, else torch)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="nmt",
        description="Neural machine translation: train a Transformer from a YAML config, translate with greedy or beam search, score with sacreBLEU.",
        epilog="Run `nmt COMMAND --help` for the options of a command. Config keys: configs/README.md.",
    )
    parser.add_argument("--version", action="version", version=f"nmt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.set_defaults(command_parsers=sub.choices)  # {command: its parser}, for `parse_args`
    for add in (_train_parser, _translate_parser, _evaluate_parser, _score_parser, _tune_parser, _average_parser,
                _import_parser, _export_parser, _serve_parser):
        add(sub)
    return parser


def _train_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train a model from a YAML config",
        description="Train a Transformer from a YAML config. The run directory OUTPUT_DIR/NAME receives the resolved config, "
        "the SentencePiece model(s), checkpoints/, TensorBoard events and train.log.",
        epilog="Every config key, with its default, is listed in configs/README.md. "
        "Ctrl-C (or SIGTERM) finishes the current step, saves checkpoints/latest.pt and exits (during train.tune_decode: "
        "stops the tuning, best.pt keeps its trained settings); a second Ctrl-C exits at once. "
        "Multi-GPU: torchrun --nproc_per_node N -m nmt train --config X.yaml",
    )
    p.add_argument("--config", required=True, metavar="YAML", help="the config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=5e-4 --set model.layers=4 (repeatable; validated like the file)")
    p.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/NAME/checkpoints/latest.pt exactly where it stopped")
    p.add_argument("--device", default=None, help="override train.device: auto, cpu, cuda, cuda:N")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar; log lines only (for CI and batch jobs)")
    p.add_argument("--check", action="store_true", help="validate the config, print it resolved, and exit")


def _translate_parser(sub) -> None:
    p = sub.add_parser(
        "translate", help="translate text with a trained checkpoint",
        description="Translate one sentence per line, from a file or stdin, to a file or stdout. Output has exactly one line per input "
        "line (or NBEST lines with --nbest), in the input's order; empty lines stay empty.",
    )
    _add_model_options(p, "to translate with")
    p.add_argument("--input", "-i", metavar="FILE", help="input file, plain or gzip (default: stdin)")
    p.add_argument("--output", "-o", metavar="FILE", help="output file, written when complete (default: stdout)")
    p.add_argument("--prefix", metavar="FILE", help="target prefixes, one per input line (may be empty): each output "
                   "starts with its prefix, the search continues from it")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or warnings summary")
    _add_glossary_options(p, "each output holds the target term of every entry whose source term is in its line "
                          "(PyTorch engine)")
    _add_decode_options(p)


def _add_glossary_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--glossary", metavar="FILE", help=f"a TSV file, `source term<TAB>target term` per line: {what}")
    p.add_argument("--glossary-ignore-case", action="store_true", help="match the glossary's source terms (and "
                   "count its target terms) ignoring case")


def _evaluate_parser(sub) -> None:
    from nmt.evaluation.metrics import TOKENIZERS  # no torch, no sacrebleu at import

    p = sub.add_parser(
        "evaluate", help="score translations with sacreBLEU (BLEU, chrF, TER)",
        description="Score a hypothesis file against a reference with sacreBLEU (same scores as the `sacrebleu` command), "
        "or translate SRC with a checkpoint first and score the result.",
    )
    p.add_argument("--ref", "-r", required=True, metavar="FILE", help="reference translations, one per line")
    p.add_argument("--hyp", metavar="FILE", help="hypotheses to score, one per line (- = stdin)")
    p.add_argument("--compare", nargs="+", metavar="HYP", help="compare two or more hypothesis files with the first: "
                   "confidence intervals, paired significance tests, per-line wins and losses, degeneration")
    _add_model_options(p, "to translate --src with, then score")
    p.add_argument("--src", metavar="FILE", help="source sentences: translated with --checkpoint or --model; with --hyp "
                   "only used by the degeneration report (copied sources)")
    p.add_argument("--save-hyps", metavar="FILE", help="also write the hypotheses here (written when complete)")
    p.add_argument("--metrics", "-m", nargs="+", default=["bleu", "chrf"], choices=("bleu", "chrf", "ter"), help="metrics (default: bleu chrf)")
    p.add_argument("--tokenize", metavar="{" + ",".join(TOKENIZERS) + "}",
                   help="sacreBLEU's BLEU tokenizer (default: from the target language, --tgt-lang or a bilingual "
                   "model's: ja-mecab for Japanese (char without MeCab, with a warning), zh for Chinese, else 13a)")
    p.add_argument("--langid", metavar="CKPT", help="count off-target outputs with the language identifier of this "
                   "checkpoint or export (default: the --checkpoint's, if it has one); the language is --tgt-lang's")
    p.add_argument("--lowercase", "-lc", action="store_true", help="case-insensitive BLEU and chrF (the sacrebleu command's -lc --chrf-lowercase)")
    p.add_argument("--json", dest="json_out", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    _add_glossary_options(p, "with --src, report the share of matched terms the outputs hold and the scores of "
                          "lines with a term")
    _add_decode_options(p)


def _score_parser(sub) -> None:
    p = sub.add_parser(
        "score", help="score given translations with a model (forced decoding)",
        description="Print the model's log-probability of each target line given its source line: one line per "
        "pair, in order, `LOG_PROB<TAB>LOG_PROB_PER_TOKEN<TAB>TOKENS` (natural log; TOKENS counts the final EOS). "
        "For filtering back-translations and reranking n-best lists.",
    )
    _add_model_options(p, "to score with")
    p.add_argument("--src", required=True, metavar="FILE", help="source sentences, one per line")
    p.add_argument("--tgt", required=True, metavar="FILE", help="target sentences, line-aligned with --src")
    p.add_argument("--output", "-o", metavar="FILE", help="output file, written when complete (default: stdout)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or warnings")
    _add_decode_options(p, SCORE_KEYS)


def _tune_parser(sub) -> None:
    from nmt.translation.tune import MAX_LOOPS, MAX_TIME  # no torch, no sacrebleu at import

    p = sub.add_parser(
        "tune", help="choose a checkpoint's decode settings on a dev set",
        description="Search decode settings (beam size, length penalty, n-gram blocking) on a dev set within a "
        "time budget, print the table explored, and write the best into the decode section of a new checkpoint (-o) "
        "or of this one (--in-place). Settings whose outputs loop on more than --max-loops of the lines are refused.")
    p.add_argument("--checkpoint", "-c", required=True, metavar="CKPT", help="checkpoint to tune")
    p.add_argument("--src", required=True, metavar="FILE", help="dev source sentences")
    p.add_argument("--ref", required=True, metavar="FILE", help="dev reference translations")
    p.add_argument("--output", "-o", metavar="FILE", help="write a copy of the checkpoint with the chosen settings")
    p.add_argument("--in-place", action="store_true", help="write the chosen settings into CKPT itself (atomically)")
    p.add_argument("--max-time", type=float, default=MAX_TIME, metavar="SECONDS",
                   help=f"time budget (default {MAX_TIME:g}); the first round (100 lines per setting) always runs")
    p.add_argument("--metric", choices=("bleu", "chrf"), default="bleu", help="what to maximise (default bleu)")
    p.add_argument("--max-loops", type=float, default=MAX_LOOPS, metavar="SHARE",
                   help=f"largest share of looping output lines allowed (a word 3-gram 3+ times; default {MAX_LOOPS:g})")
    p.add_argument("--tgt-lang", metavar="L", help="a multilingual model's target language, that of --ref; the "
                   "settings chosen serve every target language (default: the model's default language)")
    p.add_argument("--src-lang", metavar="L", help="an imported M2M100/NLLB model's source language, that of --src "
                   "(default: the model's decode.src_lang, else its data.src_lang)")
    _add_glossary_options(p, "also choose the beam size and length penalty of the lines searched with their "
                          "terms (decode.glossary)")
    p.add_argument("--glossary-constrain", choices=("always", "missing"), help="with --glossary: which lines are "
                   "searched with their terms, written with the settings (default: the checkpoint's)")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N (default: auto)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the final table")


def _average_parser(sub) -> None:
    p = sub.add_parser("average", help="average the parameters of several checkpoints",
                       description="Average model parameters over checkpoints of the same run (as fairseq and Marian do); "
                       "the result is a checkpoint that translate and evaluate accept.")
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="checkpoints to average")
    p.add_argument("--output", "-o", required=True, metavar="FILE", help="where to write the averaged checkpoint (an existing file is "
                   "replaced, once the new one is complete)")


def _import_parser(sub) -> None:
    p = sub.add_parser("import", help="import a Hugging Face MarianMT / M2M100 / NLLB model as an nmt checkpoint",
                       description="Write an nmt checkpoint from a Hugging Face model (OPUS-MT's MarianMT, M2M100, NLLB): "
                       "a local directory (config.json, weights, tokenizer files) or a hub id, downloaded with "
                       "huggingface_hub. translate, evaluate, score, average, export and train.init_from take the result.")
    p.add_argument("source", metavar="SRC", help="model directory or hub id, e.g. Helsinki-NLP/opus-mt-es-en")
    p.add_argument("--output", "-o", required=True, metavar="OUT.pt", help="the checkpoint to write (an existing file "
                   "is replaced, once the new one is complete)")
    p.add_argument("--src-lang", metavar="L", help="source language (M2M100/NLLB: its language code, e.g. es or "
                   "spa_Latn; default: tokenizer_config.json's)")
    p.add_argument("--tgt-lang", metavar="L", help="target language (M2M100/NLLB: the default of translate's "
                   "--tgt-lang; default: tokenizer_config.json's or generation_config.json's forced one)")
    p.add_argument("--config", metavar="YAML", help="also write a fine-tuning config for the checkpoint (its model "
                   "and decode sections, train.init_from; fill in data.train and data.valid); a new file: an existing "
                   "one is not overwritten")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary line")


def _export_parser(sub) -> None:
    from nmt.commands.export import FORMATS  # the formats registered with the export command
    from nmt.interop.ct2_export import QUANTIZATIONS  # no torch, no ctranslate2 at import

    p = sub.add_parser("export", help="export a checkpoint for CTranslate2, transformers, ONNX or the browser",
                       description="Write a CTranslate2 model directory from a checkpoint (needs `pip install -e \".[ct2]\"`), "
                       "or with --format hf a Hugging Face directory (MarianMT or M2M100) that transformers' "
                       "AutoModelForSeq2SeqLM and AutoTokenizer load, with --format onnx the ONNX directory that "
                       "onnxruntime, optimum and transformers.js load, with --format web a page that translates in "
                       "the browser (both need `pip install -e \".[onnx]\"`; web also npm: docs/onnx.md).")
    p.add_argument("--checkpoint", "-c", required=True, metavar="CKPT", help="checkpoint to export")
    p.add_argument("--format", default="ctranslate2", choices=tuple(FORMATS),
                   help="ctranslate2 (default), hf (transformers), onnx (onnxruntime, optimum, transformers.js) or "
                   "web (a page that translates in the browser)")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="output directory")
    p.add_argument("--quantization", choices=QUANTIZATIONS,
                   help="weight quantization (default: float32; onnx and web: int8 only)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output directory (an earlier export, "
                   "never one that holds the checkpoint)")


def _serve_parser(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve a model over HTTP (POST /translate, GET /health, GET /metrics, a web page at /)",
        description="Translate over HTTP: POST /translate {\"text\": [...], \"options\": {decode keys}} (\"stream\": "
        "true: JSON lines), GET /health, GET /metrics (Prometheus) and a page to try the model at /. Requests that "
        "arrive together share batches; each answer equals what `nmt translate` gives for the same lines and "
        "options. Needs `pip install -e \".[serve]\"`.",
        epilog="SIGTERM or Ctrl-C: new requests get 503, accepted ones are answered, then exit 0 (a second signal "
        "stops at once). The search settings above are the server's defaults; a request may change them except "
        "--batch-tokens, --batch-size, --workers and --protect-pattern.")
    _add_model_options(p, "to translate with")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only; "
                   "0.0.0.0 or ::, every interface)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 = a free one, printed at start)")
    p.add_argument("--allow-origin", dest="allow_origins", action="append", default=[], metavar="ORIGIN",
                   help="let web pages of ORIGIN (e.g. https://example.com; * = any) call POST /translate, with CORS "
                   "headers (default: none; pages of other sites get 403). Repeatable")
    p.add_argument("--allow-host", dest="allow_hosts", action="append", default=[], metavar="NAME",
                   help="accept requests whose Host header is NAME (* = any; default: the --host address, and this "
                   "machine's names for a loopback one; any name when listening on every interface). Repeatable")
    g = p.add_argument_group("limits and batching")
    g.add_argument("--max-lines", type=int, default=256, metavar="N", help="sentences per request (more: 413; default: 256)")
    g.add_argument("--max-chars", type=int, default=100_000, metavar="N",
                   help="characters of text and prefixes per request (more: 413; default: 100000)")
    g.add_argument("--max-beam", type=int, default=16, metavar="N",
                   help="the largest beam_size, nbest and glossary_beam_size a request may ask for (more: 400; default: 16)")
    g.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="requests waiting for the model (more: 503 with Retry-After; default: 256)")
    g.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds from a request's arrival to its answer, its upload included (more: 504, or 408 for "
                   "a body still arriving; the request's work stops; default: 60)")
    g.add_argument("--batch-window-ms", type=float, default=5.0, metavar="MS",
                   help="after a request arrives, how long to wait for others to translate with it (default: 5; "
                   "with call scheduling longer after a long call, at most 1 s)")
    g.add_argument("--batch-lines", type=int, default=1024, metavar="N",
                   help="lines gathered into one translation call (step scheduling: being translated at once, all "
                   "calls together), at most (default: 1024)")
    g.add_argument("--batching", action=argparse.BooleanOptionalAction, default=True,
                   help="translate requests that arrive together in one call (default: on; --no-batching: one "
                   "request per call)")
    g.add_argument("--scheduling", choices=("step", "call"), default="step",
                   help="step: calls run at once, new sentences joining the running decoding steps, so a short "
                   "request is not held up by a long one (default); call: one call at a time")
    g.add_argument("--max-batch-tokens", type=int, default=32768, metavar="N",
                   help="source tokens being translated at once, all calls together (step scheduling; a larger "
                   "request runs alone; default: 32768)")
    p.add_argument("--access-log", action="store_true", help="log every request, one line each, on stdout")
    _add_decode_options(p)


def _model(args: argparse.Namespace, needed: bool = True) -> dict:
    """The model and its search settings: {"checkpoint": path, "engine": ..., "overrides": {decode key: value
    given on the command line}}, from --checkpoint / --model / --engine and the search flags."""
    from nmt.errors import UserError

    if args.checkpoint and args.model:
        raise UserError("give --checkpoint or --model, not both")
    path = args.checkpoint or args.model
    if needed and not path:
        raise UserError(f"{args.command} needs --checkpoint CKPT (or --model DIR for a CTranslate2 export)")
    overrides = {k[len("decode_"):]: v for k, v in vars(args).items() if k.startswith("decode_") and v is not None}
    return {"checkpoint": path, "engine": "ctranslate2" if args.model and args.engine == "auto" else args.engine,
            "overrides": overrides}


def _options(cls, args: argparse.Namespace, **given):
    """A command's options object (a frozen dataclass next to the command): each field from `given` or the
    parsed flag of its name (lists as tuples); the fields without either keep their defaults."""
    import dataclasses

    values = {f.name: given[f.name] if f.name in given else getattr(args, f.name)
              for f in dataclasses.fields(cls) if f.name in given or hasattr(args, f.name)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def _cmd_train(args: argparse.Namespace) -> int:
    from nmt.commands.train import TrainOptions, train_command

    return train_command(_options(TrainOptions, args))


def _cmd_translate(args: argparse.Namespace) -> int:
    from nmt.commands.translate import TranslateOptions, translate_command

    return translate_command(_options(TranslateOptions, args, **_model(args)))


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from nmt.commands.evaluate import EvaluateOptions, compare_command, evaluate_command
    from nmt.errors import UserError

    opts = _options(EvaluateOptions, args, **_model(args, needed=False))
    if opts.compare is not None:
        if opts.hyp is not None or opts.checkpoint is not None:
            raise UserError("--compare scores existing hypothesis files: give it without --hyp and --checkpoint")
        if opts.langid is not None:
            raise UserError("--compare does not count off-target outputs: give it without --langid")
        if opts.glossary is not None:
            raise UserError("--compare does not report term use: evaluate each file with --hyp FILE --glossary")
        if opts.save_hyps is not None:
            raise UserError("--compare scores existing files, it translates nothing: give it without --save-hyps")
        return compare_command(opts)
    if opts.hyp is None and opts.checkpoint is None:  # (the rest: evaluate_command)
        raise UserError("evaluate needs either --hyp FILE, or --checkpoint CKPT (or --model DIR) with --src FILE")
    return evaluate_command(opts)


def _cmd_score(args: argparse.Namespace) -> int:
    from nmt.commands.score import ScoreOptions, score_command

    return score_command(_options(ScoreOptions, args, **_model(args)))


def _cmd_tune(args: argparse.Namespace) -> int:
    from nmt.commands.tune import TuneOptions, tune_command

    return tune_command(_options(TuneOptions, args))


def _cmd_serve(args: argparse.Namespace) -> int:
    from nmt.commands.serve import ServeOptions, serve_command

    return serve_command(_options(ServeOptions, args, **_model(args)))


def _cmd_average(args: argparse.Namespace) -> int:
    from nmt.commands.average import AverageOptions, average_command

    return average_command(_options(AverageOptions, args))


def _cmd_import(args: argparse.Namespace) -> int:
    from nmt.commands.import_model import ImportOptions, import_command

    return import_command(_options(ImportOptions, args))


def _cmd_export(args: argparse.Namespace) -> int:
    from nmt.commands.export import ExportOptions, export_command

    return export_command(_options(ExportOptions, args))


@contextlib.contextmanager
def _sigterm_like_ctrl_c(command: str):
    """Every command but `train` (which saves a checkpoint on SIGTERM itself): SIGTERM raises
    `Terminated` in the main thread, as Ctrl-C raises KeyboardInterrupt, so the same cleanup runs."""
    if command == "train" or threading.current_thread() is not threading.main_thread():
        yield
        return
    from nmt.errors import Terminated

    def handler(signum, frame):
        raise Terminated(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


COMMANDS = {"train": _cmd_train, "translate": _cmd_translate, "evaluate": _cmd_evaluate, "score": _cmd_score,
            "tune": _cmd_tune, "average": _cmd_average, "import": _cmd_import, "export": _cmd_export,
            "serve": _cmd_serve}


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parser.parse_args, but an unknown argument is reported by the command's parser
    (`nmt translate: error: unrecognized arguments: ...`), not by the top-level `nmt`."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = args.command_parsers.get(args.command, parser) if args.command else parser
        command.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


OPENMP_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")  # the user's own choice of waiting


def openmp_defaults(environ=os.environ) -> None:
    """OMP_WAIT_POLICY=PASSIVE unless the user chose how OpenMP threads wait (any of OPENMP_CHOICES):
    torch's OpenMP threads spin after each parallel region, taking the CPU from threads with work
    when another process is busy on the cores (BENCHMARKS.md "OpenMP threads on a shared machine").
    The runtime reads the variable when it loads: this must run before torch is imported."""
    if not any(name in environ for name in OPENMP_CHOICES):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


def main(argv: list[str] | None = None) -> int:
    openmp_defaults()  # before anything imports torch
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from nmt.config import ConfigError
    from nmt.errors import UserError

    if args.command in ("train", "translate", "evaluate", "score", "tune", "serve"):
        from nmt.device import tune_malloc

        tune_malloc(inference=args.command != "train")  # before the command allocates its tensors; see nmt/device.py
    try:
        with _sigterm_like_ctrl_c(args.command):
            return COMMANDS[args.command](args)
    except ConfigError as e:
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank reads the config: report once
            for msg in e.errors:
                print(f"nmt {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except UserError as e:
        print(f"nmt {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        print(f"nmt {args.command}: error: {_os_error(e)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. `nmt translate ... | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Terminated)
        signum = getattr(e, "signum", signal.SIGINT)
        what = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
        print(f"nmt {args.command}: {what}", file=sys.stderr)
        return 128 + signum
    except OSError as e:  # disk full, I/O errors: nothing half-written is left (outputs are atomic)
        print(f"nmt {args.command}: error: {_os_error(e)}", file=sys.stderr)
        return EXIT_FAILURE


def _os_error(e: OSError) -> str:
    """One line for an OSError: what and where."""
    what = e.strerror or " ".join(str(e).split()) or type(e).__name__
    return f"{what}: {e.filename}" if e.filename else what


if __name__ == "__main__":
    raise SystemExit(main())

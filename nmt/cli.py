"""Command line: `nmt train | translate | evaluate | average | export`.

Only argument parsing and dispatch live here; every command is an importable
function. torch is imported lazily, inside the commands, so `nmt --help`
stays fast. Errors the user can fix (ConfigError, UserError, unreadable
files) print one line on stderr and exit with code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from nmt import __version__

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _add_decode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search (default: the checkpoint's `decode` section)")
    g.add_argument("--beam", type=int, metavar="K", help="beam size; 1 runs greedy search")
    g.add_argument("--nbest", type=int, metavar="N", help="hypotheses per input line (n-best output format: `INDEX ||| TEXT ||| SCORE`)")
    g.add_argument("--batch-tokens", type=int, metavar="N", help="padded source tokens per batch")
    g.add_argument("--batch-size", type=int, metavar="N", help="at most N sentences per batch (default: decode.max_batch_size)")
    g.add_argument("--length-penalty", type=float, metavar="ALPHA", help="length penalty alpha")
    g.add_argument("--max-len-a", type=float, metavar="A", help="maximum output length = A * source_length + B")
    g.add_argument("--max-len-b", type=int, metavar="B", help="see --max-len-a")
    g.add_argument("--min-len", type=int, metavar="N", help="minimum output length in tokens")
    g.add_argument("--workers", type=int, metavar="N", help="CPU: decode N batches at once, each with THREADS/N "
                   "threads (default: decode.workers; 0 = auto: 2 on a CPU with 2+ threads, else 1)")
    g.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N (default: auto)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nmt",
        description="Neural machine translation: train a Transformer from a YAML config, translate with greedy or beam search, score with sacreBLEU.",
        epilog="Run `nmt COMMAND --help` for the options of a command. Config keys: configs/README.md.",
    )
    parser.add_argument("--version", action="version", version=f"nmt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "train", help="train a model from a YAML config",
        description="Train a Transformer from a YAML config. The run directory OUTPUT_DIR/NAME receives the resolved config, "
        "the SentencePiece model(s), checkpoints/, TensorBoard events and train.log.",
        epilog="Every config key, with its default, is listed in configs/README.md. "
        "Ctrl-C (or SIGTERM) finishes the current step, saves checkpoints/latest.pt and exits; a second Ctrl-C exits at once. "
        "Multi-GPU: torchrun --nproc_per_node N -m nmt train --config X.yaml",
    )
    p.add_argument("--config", required=True, metavar="YAML", help="the config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=5e-4 --set model.layers=4 (repeatable; validated like the file)")
    p.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/NAME/checkpoints/latest.pt exactly where it stopped")
    p.add_argument("--device", default=None, help="override train.device: auto, cpu, cuda, cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bar; log lines only (for CI and batch jobs)")
    p.add_argument("--check", action="store_true", help="validate the config, print it resolved, and exit")

    p = sub.add_parser(
        "translate", help="translate text with a trained checkpoint",
        description="Translate one sentence per line, from a file or stdin, to a file or stdout. Output has exactly one line per input "
        "line (or NBEST lines with --nbest), in the input's order; empty lines stay empty.",
    )
    p.add_argument("--checkpoint", "-c", metavar="CKPT", help="checkpoint file (e.g. runs/NAME/checkpoints/best.pt)")
    p.add_argument("--input", "-i", metavar="FILE", help="input file (default: stdin)")
    p.add_argument("--output", "-o", metavar="FILE", help="output file (default: stdout)")
    p.add_argument("--engine", choices=("torch", "ctranslate2"), default="torch", help="inference engine (ctranslate2 needs a model exported with `nmt export`)")
    p.add_argument("--model", metavar="DIR", help="CTranslate2 model directory (with --engine ctranslate2)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or warnings summary")
    _add_decode_options(p)

    p = sub.add_parser(
        "evaluate", help="score translations with sacreBLEU (BLEU, chrF, TER)",
        description="Score a hypothesis file against a reference with sacreBLEU (same scores as the `sacrebleu` command), "
        "or translate SRC with a checkpoint first and score the result.",
    )
    p.add_argument("--ref", "-r", required=True, metavar="FILE", help="reference translations, one per line")
    p.add_argument("--hyp", metavar="FILE", help="hypotheses to score, one per line")
    p.add_argument("--checkpoint", "-c", metavar="CKPT", help="translate --src with this checkpoint, then score")
    p.add_argument("--src", metavar="FILE", help="source sentences (with --checkpoint)")
    p.add_argument("--save-hyps", metavar="FILE", help="write the hypotheses produced with --checkpoint here")
    p.add_argument("--metrics", "-m", nargs="+", default=["bleu", "chrf"], choices=("bleu", "chrf", "ter"), help="metrics (default: bleu chrf)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    _add_decode_options(p)

    p = sub.add_parser("average", help="average the parameters of several checkpoints",
                       description="Average model parameters over checkpoints of the same run (as fairseq and Marian do); "
                       "the result is a checkpoint that translate and evaluate accept.")
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="checkpoints to average")
    p.add_argument("--output", "-o", required=True, metavar="FILE", help="where to write the averaged checkpoint")

    p = sub.add_parser("export", help="export a checkpoint for another inference engine (CTranslate2)",
                       description="Write a CTranslate2 model directory from a checkpoint (needs `pip install -e \".[ct2]\"`).")
    p.add_argument("--checkpoint", "-c", required=True, metavar="CKPT", help="checkpoint to export")
    p.add_argument("--format", default="ctranslate2", choices=("ctranslate2",), help="export format (default: ctranslate2)")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="output directory")
    p.add_argument("--quantization", choices=("int8", "int8_float16", "int8_float32", "int16", "float16", "bfloat16", "float32"),
                   help="weight quantization (default: float32)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output directory")
    return parser


def _decode_kwargs(args: argparse.Namespace) -> dict:
    return dict(beam=args.beam, nbest=args.nbest, batch_tokens=args.batch_tokens, batch_size=args.batch_size, device=args.device,
                max_len_a=args.max_len_a, max_len_b=args.max_len_b, min_len=args.min_len,
                length_penalty=args.length_penalty, workers=args.workers)


def _cmd_train(args: argparse.Namespace) -> int:
    from nmt.config import dump_config, load_config

    cfg = load_config(args.config, args.overrides)
    if args.check:
        sys.stdout.write(dump_config(cfg))
        return 0
    from nmt.train import train

    result = train(cfg, resume=args.resume, device=args.device, quiet=args.quiet)
    # Stopped by SIGINT/SIGTERM after saving latest.pt: the shell's convention, 128 + signal.
    return 128 + result["signal"] if result.get("signal") else 0


def _cmd_translate(args: argparse.Namespace) -> int:
    from nmt.errors import UserError

    if args.engine == "ctranslate2" or args.model:
        model_dir = args.model or args.checkpoint
        if not model_dir:
            raise UserError("--engine ctranslate2 needs --model DIR (a directory written by `nmt export`)")
        from nmt.export import translate_ct2_command

        return translate_ct2_command(model_dir, args.input, args.output, quiet=args.quiet, **_decode_kwargs(args))
    if not args.checkpoint:
        raise UserError("translate needs --checkpoint CKPT")
    if os.path.isdir(args.checkpoint) and os.path.isfile(os.path.join(args.checkpoint, "model.bin")):
        from nmt.export import translate_ct2_command  # an exported CTranslate2 directory

        return translate_ct2_command(args.checkpoint, args.input, args.output, quiet=args.quiet, **_decode_kwargs(args))
    from nmt.translate import translate_command

    return translate_command(args.checkpoint, args.input, args.output, quiet=args.quiet, **_decode_kwargs(args))


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from nmt.errors import UserError
    from nmt.evaluate import evaluate_command

    if (args.hyp is None) == (args.checkpoint is None):
        raise UserError("evaluate needs either --hyp FILE, or --checkpoint CKPT with --src FILE")
    if args.checkpoint is not None and args.src is None:
        raise UserError("--checkpoint needs --src FILE (the source sentences to translate)")
    kw = _decode_kwargs(args)
    return evaluate_command(args.hyp, args.ref, checkpoint=args.checkpoint, src=args.src, save_hyps=args.save_hyps,
                            metrics=tuple(args.metrics), json_out=args.json, quiet=args.quiet,
                            device=kw.pop("device"), **{k: v for k, v in kw.items() if k not in ("nbest", "batch_size")})


def _cmd_average(args: argparse.Namespace) -> int:
    from nmt.translate import average_command

    return average_command(args.checkpoints, args.output)


def _cmd_export(args: argparse.Namespace) -> int:
    from nmt.export import export_command

    return export_command(args.checkpoint, args.output, format=args.format, quantization=args.quantization, force=args.force)


COMMANDS = {"train": _cmd_train, "translate": _cmd_translate, "evaluate": _cmd_evaluate,
            "average": _cmd_average, "export": _cmd_export}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from nmt.config import ConfigError
    from nmt.errors import UserError

    if args.command in ("train", "translate", "evaluate"):
        from nmt.runtime import tune_malloc

        tune_malloc()  # before the command allocates its tensors; see nmt/runtime.py
    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank reads the config: report once
            for msg in e.errors:
                print(f"nmt {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except UserError as e:
        print(f"nmt {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"nmt {args.command}: error: {e.strerror}: {e.filename}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. `nmt translate ... | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except KeyboardInterrupt:
        print(f"nmt {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())

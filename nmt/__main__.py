"""`python -m nmt`: the command line (nmt/cli.py)."""

from nmt.cli import main

code = main()
# A KeyboardInterrupt that leaves code run by exec() or eval() of a string (CPython makes namedtuple and dataclass
# methods that way, so a Ctrl-C while a command imports torch often lands there) sets CPython's "unhandled Ctrl-C"
# mark even when main() catches it, and `python -m` then ends the process by SIGINT instead of exiting with main's
# code (130). Every exec of a string clears the mark (CPython 3.8 and later: Python/pythonrun.c run_eval_code_obj).
exec("")
raise SystemExit(code)

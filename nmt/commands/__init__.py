"""The commands: one module per `nmt` subcommand, each with its `*_command` function and the helpers only
it uses (argument checks, reading and writing files, progress bars, the reports it prints). nmt/cli.py
parses the command line and calls them. They stand above the facades (`nmt.Translator`, `nmt.train.train`)
and the library, and may import anything below; nothing below imports them (tests/test_architecture.py).
"""

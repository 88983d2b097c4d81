"""The commands: one module per `nmt` subcommand, each with its `*_command` function, the frozen options
object it takes (`TranslateOptions`, ...: one field per flag) and the helpers only it uses. nmt/cli.py
parses the command line, builds the options object and calls the command. Commands stand above the
facades (`nmt.Translator`, `nmt.train.train`) and the library, and may import anything below; nothing
below imports them (tests/test_architecture.py).
"""

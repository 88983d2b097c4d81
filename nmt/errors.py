"""Errors a user can cause and fix (bad files, bad data, bad checkpoints).

The CLI prints `str(error)` as one line on stderr and exits with code 2.
Configuration problems raise `nmt.config.ConfigError` instead (same treatment).
"""


class UserError(Exception):
    """A problem with the user's input; the message is one line that says what and where."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, SLURM, `docker stop`) raised in the main thread, where Ctrl-C raises
    KeyboardInterrupt: a subclass, so every cleanup that handles Ctrl-C handles it the same way
    (temporary outputs removed, thread pools drained). The CLI exits with 128 + `signum`."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Cancelled(Exception):
    """A translation stopped because its caller's `cancel()` said so (`nmt.Translator.translate`:
    checked at every decoding step); nothing of the call is returned. `nmt serve` cancels the work
    of a request whose time limit passed or whose client went away."""

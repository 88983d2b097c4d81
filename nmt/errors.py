"""Errors a user can cause and fix (bad files, bad data, bad checkpoints).

The CLI prints `str(error)` as one line on stderr and exits with code 2.
Configuration problems raise `nmt.config.ConfigError` instead (same treatment).
"""


class UserError(Exception):
    """A problem with the user's input; the message is one line that says what and where."""

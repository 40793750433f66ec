"""Error types shared by every layer.

`UserError` is bad input or an environment the user must fix: the CLI prints its
message as one line and exits with code 2 (no traceback unless --debug).
"""


class UserError(Exception):
    """Bad input: one line that says what is wrong and how to fix it. Exit code 2."""

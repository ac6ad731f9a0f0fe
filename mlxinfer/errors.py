"""The one exception type for problems a user can fix.

The CLI turns an ``MlxinferError`` into one line on stderr and exit code 2; any
other exception is a bug and keeps its traceback.
"""


class MlxinferError(Exception):
    """A problem with the user's input: the message names it and the fix."""

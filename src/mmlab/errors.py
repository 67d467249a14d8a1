"""The one exception type the CLI turns into a one-line error and exit 2."""


class MmlabError(Exception):
    """A user-facing error: bad input, a missing tool, a refused change.

    The message names the key, value or file at fault and fits on one line.
    """


class Interrupted(Exception):
    """Ctrl-C or SIGTERM, raised from the signal handler so that every
    `finally` (restores, store commits) runs on the way out."""

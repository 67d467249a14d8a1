"""The one exception type the CLI turns into a one-line error and exit 2."""

from __future__ import annotations


class MmlabError(Exception):
    """A user-facing error: bad input, a missing tool, a refused change.

    The message names the key, value or file at fault and fits on one line.
    """


class Interrupted(Exception):
    """Ctrl-C or SIGTERM, raised from the signal handler so that every
    `finally` (restores, store commits) runs on the way out."""

    received = False        # the handler ran: see raise_if_received

    @classmethod
    def arrived(cls) -> Interrupted:
        """The exception the signal handler raises, noted as received first."""
        cls.received = True
        return cls()

    @classmethod
    def raise_if_received(cls) -> None:
        """Raise again a Ctrl-C whose exception was lost.  Python runs its
        fork hooks (logging's locks) around a fork with a preexec_fn, and an
        exception a signal handler raises inside one is printed and dropped:
        a Ctrl-C that landed there let the run go on (about one in five in
        a test that stops a run as its third trial starts)."""
        if cls.received:
            raise cls

"""The one family of errors gputui reports to its user, and the exit statuses they map to (docs/commands.md).

Every error a command may end with is a :class:`GputuiError`: its message says what failed and why, its
``status`` is the command's exit status. The CLI catches this one class; the app shows the message.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """The exit statuses of the ``gputui`` command."""

    OK = 0
    FAILED = 1  # the operation failed (the message says why)
    USAGE = 2  # a bad argument or setting; no terminal to confirm on
    UNREACHABLE = 3  # the host did not answer
    REFUSED = 4  # the host refused us: auth, host key, missing python3/tmux, an unsafe remote_dir
    NOT_FOUND = 5  # no such job
    INTERRUPTED = 130  # Ctrl-C
    PIPE = 141  # the reader closed stdout, as a shell reports a coreutils tool killed by SIGPIPE


class GputuiError(Exception):
    """An error for the user: the message says what failed and why; ``status`` is the exit status."""

    status: ExitStatus = ExitStatus.FAILED


class UsageError(GputuiError):
    """A bad argument, setting or request: the user changes what they asked for."""

    status = ExitStatus.USAGE


class Unreachable(GputuiError):
    """The host did not answer (refused, timed out, link lost); trying again later may work."""

    status = ExitStatus.UNREACHABLE

"""The error hierarchy and the exit codes it maps to (docs/cli.md).

- `UsageError`: bad input from the user (arguments, configuration, an entry that cannot be loaded).
  One line on stderr, exit code 2. The message names what the user wrote, never a command-line flag
  they may not have passed: the CLI layer adds the flag (`kernalin_ci.cli`).
- `InternalError`: a bug in kernalin-ci (an unexpected exception here or in a worker child). Exit
  code 3; the traceback goes to a log file (or to stderr with --debug), stderr gets a one-line pointer.
  Any exception that is neither of these is treated as an internal error too.

A kernel that crashes, hangs or raises is neither: it is a finding (kernalin_ci.findings).
"""

from __future__ import annotations

import os
import tempfile
import traceback

from kernalin_ci import __version__

EXIT_OK = 0  # checked and passed, or nothing to check
EXIT_FAILED = 1  # a finding, or a failed gate
EXIT_USAGE = 2  # usage, configuration or load error
EXIT_INTERNAL = 3  # a bug in kernalin-ci


class KernalinError(Exception):
    """Base of the errors kernalin-ci raises on purpose."""

    exit_code = EXIT_INTERNAL


class UsageError(KernalinError):
    """Bad input from the user: printed as one line on stderr, exit code 2.

    `setting`: the setting the message is about, by its neutral name (`dtype`, `case`, `budget_s`),
    when the message starts with that name. The value may come from a configuration file, the
    Action's inputs or the daemon as well as a flag; the CLI writes the flag instead (`--dtype`)
    when the user passed it."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


class InternalError(KernalinError):
    """A bug in kernalin-ci: exit code 3. `detail` holds what the one line leaves out (a worker
    child's traceback), written to the log with the parent's own traceback."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


def describe(e: BaseException) -> str:
    """One line for any exception: an InternalError's own message, else `Type: message`."""
    text = str(e) if isinstance(e, KernalinError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())[:300]


def log_text(e: BaseException, argv: list[str] | None = None) -> str:
    """What an internal error leaves behind: the command, the version, the traceback, and the
    worker child's traceback when the error came from one."""

    lines = [f"kernalin-ci {__version__}: internal error"]
    if argv:
        lines.append(f"command: {' '.join(argv)}")
    lines += ["", "".join(traceback.format_exception(type(e), e, e.__traceback__))]
    detail = getattr(e, "detail", "")
    if detail:
        lines += ["in the worker child:", detail]
    return "\n".join(lines).rstrip() + "\n"


def write_log(text: str) -> str:
    """An internal error's log goes to a fresh file in the temporary directory; returns its path."""
    fd, path = tempfile.mkstemp(prefix="kernalin-ci-error-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path

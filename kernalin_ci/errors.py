"""The one error type that maps to exit code 2 (usage, configuration or load error)."""


class UsageError(Exception):
    """Bad input from the user: printed as one line on stderr, exit code 2."""

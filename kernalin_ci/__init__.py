"""kernalin-ci: a CI gate for LLM decode-path kernels."""

__version__ = "0.1.0"


def current_params() -> dict:
    """The op params of the check that is running (for entries that need them)."""
    import json
    import os

    return json.loads(os.environ.get("KERNALIN_PARAMS", "{}"))

"""kernalin-ci: a CI gate for LLM decode-path kernels."""

__version__ = "0.1.0"

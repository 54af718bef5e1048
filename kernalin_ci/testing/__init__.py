"""Test-only helpers: the GitHub stand-in server (`github_standin.py`, `openapi.py`, its pytest
fixtures), webhook payloads, the daemon's local test world (`daemon_world.py`) and the stand-in gate
command (`fake_gate.py`).

Not in the wheel (pyproject.toml excludes it) and imported by nothing a user installs
(tests/test_layers.py); tests and benchmarks import it from the source tree.
"""

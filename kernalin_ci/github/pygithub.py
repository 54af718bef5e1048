"""The third-party names the GitHub modules use, or one clear line (exit 2) saying how to get them.

PyGithub (with PyJWT and cryptography, for GitHub App tokens) comes with the `github` extra: a
local `kernalin-ci run` never needs it (the Actions environment, actions.py, is plain Python);
posting to GitHub does.
"""

from kernalin_ci.errors import UsageError

try:
    import github
    import requests
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from github import Auth, Github, GithubIntegration
    from github.GithubException import GithubException
except ImportError as e:
    raise UsageError(
        f"GitHub support needs PyGithub ({e.name} is missing): pip install 'kernalin-ci[github]'"
    ) from None

__all__ = ["github", "requests", "load_pem_private_key", "Auth", "Github", "GithubIntegration", "GithubException"]

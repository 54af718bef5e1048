"""pytest fixtures for the GitHub stand-in. Import them into a test module (or conftest.py):

    from kernalin_ci.testing.pytest_fixtures import github_standin, make_github_standin  # noqa: F401

`github_standin` is a started stand-in at the root prefix (api.github.com style);
`make_github_standin(prefix="/api/v3")` makes more (Enterprise style). Every stand-in
is stopped at teardown, and the test fails there if it saw an invalid request or
answered off GitHub's description (`problems`).
"""

from __future__ import annotations

import pytest

from kernalin_ci.testing.github_standin import GitHubStandIn


def _stop_and_check(standins: list[GitHubStandIn]) -> None:
    problems = []
    for s in standins:
        s.stop()
        problems += s.problems
    if problems:
        pytest.fail("the GitHub stand-in saw problems:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture
def make_github_standin():
    made: list[GitHubStandIn] = []

    def make(prefix: str = "") -> GitHubStandIn:
        s = GitHubStandIn(prefix=prefix).start()
        made.append(s)
        return s

    yield make
    _stop_and_check(made)


@pytest.fixture
def github_standin():
    s = GitHubStandIn().start()
    yield s
    _stop_and_check([s])

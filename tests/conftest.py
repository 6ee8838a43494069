"""Shared fixtures: real models, a tiny real corpus, bundle, student and server, built once per session."""

pytest_plugins = [
    "tests.fixtures.corpus",
    "tests.fixtures.bundle",
    "tests.fixtures.student",
    "tests.fixtures.server",
    "tests.fixtures.browser",
]

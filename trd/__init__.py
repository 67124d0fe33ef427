"""tokenrouterd: token-level routing between models that share a tokenizer."""

from importlib.metadata import version as _version


def version() -> str:
    """The installed package's version, as pyproject.toml gives it."""
    return _version("tokenrouterd")

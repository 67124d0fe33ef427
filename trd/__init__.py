"""tokenrouterd: token-level routing between models that share a tokenizer."""

import tomllib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from pathlib import Path


def version() -> str:
    """The installed package's version, as pyproject.toml gives it. A source checkout run
    without installing (PYTHONPATH=checkout, as the GPU check runs on a device machine)
    reads its own pyproject.toml."""
    try:
        return _version("tokenrouterd")
    except PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown (not installed)"

"""The package version, in one place (pyproject.toml reads it; `rloo --version` prints it)."""

__version__ = "0.1.0"

"""Errors for bad input. Raised before any state changes, so a rejected call changes nothing."""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    OUT_OF_RANGE = "OUT_OF_RANGE"


class BursarError(Exception):
    """Root of every error Bursar raises on purpose."""


class RequestError(BursarError):
    """A request the engine refuses to consider: state and journal are left untouched.

    ``code`` maps one to one onto a gRPC status; ``field`` names the offending input.
    """

    def __init__(self, code: ErrorCode, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.code = code
        self.field = field
        self.message = message


class ConfigError(BursarError):
    """A configuration file that cannot be used; names the file, the key and what is allowed."""

    def __init__(self, path: str, key: str, message: str) -> None:
        super().__init__(f"{path}: {key}: {message}")
        self.path = path
        self.key = key
        self.message = message


class JournalError(BursarError):
    """The journal cannot be opened, is corrupt, or disagrees with the engine."""


DISTRIBUTION = "bursar-broker"
"""The name Bursar is installed under (``bursar`` on the public index is another project);
the import name and the console script stay ``bursar``."""


class MissingExtra(BursarError, ModuleNotFoundError):
    """A feature's optional dependency is not installed. Its message is one line ending in
    the command that installs it; a ``ModuleNotFoundError`` still, so callers that fall back
    when an import fails keep doing so."""

    def __init__(self, feature: str, module: str, extra: str) -> None:
        super().__init__(
            f"{feature} needs {module}, which is not installed: "
            f"pip install '{DISTRIBUTION}[{extra}]'",
            name=module,
        )
        self.feature = feature
        self.extra = extra


def require(*modules: str, extra: str, feature: str) -> None:
    """Import ``modules`` (the first one missing raises :class:`MissingExtra` naming
    ``extra``). Called where a feature starts, before its own imports, so the user sees the
    install hint instead of an import error from deep inside."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # Name what is actually absent: dask.distributed fails on "distributed" when
            # only dask is there, and the extra installs both.
            raise MissingExtra(feature, exc.name or module, extra) from None

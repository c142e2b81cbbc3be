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

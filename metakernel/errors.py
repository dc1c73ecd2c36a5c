"""Errors a user can act on.

The CLI turns a `UserError` into one line (`metakernel: <where>: <cause>`) and exit code 2; anything else is a bug
in metakernel and keeps its traceback (shown in full with `--debug`).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: an unknown problem, a malformed file, a broken problem reference."""

    def __init__(self, cause: str, where: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}: {self.cause}" if self.where else self.cause

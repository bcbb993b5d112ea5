"""Errors of the generator, each pointing at the manifest line it comes from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List


@dataclass(frozen=True)
class Location:
    """Where a manifest value was written: file, line and the key path inside it."""

    file: str
    line: int
    path: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} {self.path}" if self.path else where

    def child(self, key: str, line: int | None = None) -> "Location":
        path = f"{self.path}.{key}" if self.path else key
        return Location(self.file, self.line if line is None else line, path)


class ManifestError(Exception):
    """A defect in a manifest, located at ``file:line op.key.path``."""

    def __init__(self, location: Location, message: str) -> None:
        super().__init__(f"{location}: {message}")
        self.location = location
        self.message = message


class ManifestErrors(Exception):
    """Several located defects found in one pass."""

    def __init__(self, errors: Iterable[ManifestError]) -> None:
        self.errors: List[ManifestError] = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


class RuleSyntaxError(ValueError):
    """A shape rule outside the grammar; the caller adds the manifest location."""

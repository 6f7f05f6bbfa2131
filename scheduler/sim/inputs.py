"""Reading the simulator's input files so that a wrong file is refused, not half-used.

A trace of the wrong format would otherwise fail deep in a parser (a `KeyError` on some
column) or, worse, parse into no jobs and print a plausible result. The loaders raise
`InputFileError` instead, naming the file as the user gave it and what is wrong with it;
the command line turns it into one error line, and library callers can catch it as a
`ValueError`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class InputFileError(ValueError):
    """An input file the simulator cannot use; the message names the file (and the line)."""


@contextmanager
def read_csv(path: str | Path, columns: Sequence[str], kind: str) -> Iterator[csv.DictReader[str]]:
    """Rows of a CSV file whose header has all of `columns` (`kind` says what the file should
    be, as in "an openb node list"). Header names are stripped of spaces, and the missing fields
    of a short row read as "", so a bad value surfaces as a `ValueError` of its parser, which
    is refused with the file and the line it is on."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f, restval="")
        try:
            header = [name.strip() for name in rows.fieldnames or []]
            missing = [name for name in columns if name not in header]
            if missing:
                noun = "column" if len(missing) == 1 else "columns"
                raise InputFileError(
                    f"{path} is not {kind}: it has no {noun} {', '.join(missing)}"
                    f" (needed: {', '.join(columns)})"
                )
            rows.fieldnames = header
            yield rows
        except InputFileError:
            raise
        except UnicodeDecodeError as error:
            raise InputFileError(f"{path} is not a UTF-8 text file (a CSV file is needed)") from error
        except (ValueError, csv.Error) as error:
            raise InputFileError(f"{path}, line {rows.line_num}: {error}") from error

"""Reading the simulator's input files so that a wrong file is refused, not half-used.

A trace of the wrong format would otherwise fail deep in a parser (a `KeyError` on some
column) or, worse, parse into no jobs and print a plausible result. The loaders raise
`InputFileError` instead, naming the file as the user gave it and what is wrong with it;
the command line turns it into one error line, and library callers can catch it as a
`ValueError`.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from scheduler.core import Profile, load_profile


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


def read_profile(name_or_path: str) -> Profile:
    """`load_profile`, with an unknown name or a file that is not a valid profile refused as
    `InputFileError` (its message already names the file and the key that is wrong)."""
    try:
        return load_profile(name_or_path)
    except ValueError as error:  # an unknown name, not JSON, or not a valid profile
        raise InputFileError(str(error)) from error


def number_option(least: float, *, above: bool = False, whole: bool = False) -> Callable[[str], float]:
    """An argparse `type=` for a numeric option: a value below `least` (or equal to it, with
    `above`) makes no sense for the run and would otherwise be used silently."""
    bound = f"above {least:g}" if above else f"of {least:g} or more"
    kind = "a whole number" if whole else "a number"

    def parse(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < least or (above and value == least):
            raise argparse.ArgumentTypeError(f"must be {kind} {bound}, not {text!r}")
        return value

    return parse


@contextmanager
def refused_by(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Input files that cannot be used, read inside the block, end the command with one error
    line: a bad input file is no usage mistake, so without the usage text."""
    try:
        yield
    except InputFileError as error:
        fail(parser, str(error))
    except OSError as error:
        fail(
            parser,
            str(error) if error.filename is None else f"cannot read {error.filename}: {error.strerror}",
        )


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.exit(2, f"{parser.prog}: error: {message}\n")

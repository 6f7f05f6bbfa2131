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
from scheduler.core.profile import PROFILES_DIR


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
    """`load_profile`, with a name that is neither shipped nor a file refused as the user
    typed it (`load_profile` would name the shipped path it tried), and a file that is not a
    valid profile refused as `InputFileError`."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists() and not (PROFILES_DIR / f"{name_or_path}.json").is_file():
        shipped = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
        raise InputFileError(f"unknown profile {name_or_path!r}: give one of {shipped}, or a JSON file")
    try:
        return load_profile(name_or_path)
    except ValueError as error:  # not JSON, or not a valid profile
        raise InputFileError(f"profile {name_or_path} is not valid: {error}") from error


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


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """A bad input file is no usage mistake: one line, without the usage text."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def unreadable(error: OSError) -> str:
    if error.filename is None:
        return str(error)
    return f"cannot read {error.filename}: {error.strerror}"

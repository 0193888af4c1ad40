"""Reading the project's JSON/YAML documents (profiles, specs, plans, cluster files, manifests) with
one-line errors that name the file and what is wrong, and the checks every document's fields share:
unknown fields (with a "did you mean"), required fields and typed values."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from poolpipe_common.errors import InputError


def read_text(path: str | Path, what: str) -> str:
    """The file's text: UTF-8 without NUL bytes, else a one-line error (a binary file passed by mistake)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read {what} {p}: {e.strerror or e}") from None
    if b"\0" in data[:65536]:
        raise InputError(f"{what} {p} is a binary file, not a JSON/YAML text document")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputError(f"{what} {p} is not UTF-8 text (byte {e.start}, line {line})") from None


def parse_text(text: str, source: str, yaml_ok: bool = False) -> Any:
    """JSON (or YAML when ``yaml_ok``); a syntax error names the line and column."""
    try:
        return yaml.safe_load(text) if yaml_ok else json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{source} does not parse: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{source} does not parse: {where}invalid YAML: {problem}") from None


def read_document(path: str | Path, what: str, yaml_ok: bool = False) -> Any:
    """Parsed content of ``path`` (JSON; YAML too when ``yaml_ok`` and the suffix is not .json)."""
    p = Path(path)
    return parse_text(read_text(p, what), f"{what} {p}", yaml_ok and p.suffix != ".json")


# --- fields ----------------------------------------------------------------------------------------------

def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_fields(d: Any, allowed: Iterable[str], where: str) -> dict:
    """``d`` itself when it is a mapping with no field outside ``allowed``; else an error naming the first
    unknown field and the closest known one."""
    known = list(allowed)
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object with fields {', '.join(known)}; got {type(d).__name__}")
    for key in d:
        if key not in known:
            raise InputError(f"{where}: unknown field {str(key)!r}{did_you_mean(key, known)}; "
                             f"known fields: {', '.join(known)}")
    return d


def need(d: Any, key: str, where: str) -> Any:
    """The required field ``key`` of the mapping ``d``."""
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise InputError(f"{where}: missing field '{key}'")
    return d[key]


def as_int(x: Any, where: str, lo: int | None = None) -> int:
    """A whole number (an integral float is accepted) of at least ``lo``."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise InputError(f"{where}: expected a number, got {x!r}")
    if not math.isfinite(x) or int(x) != x:
        raise InputError(f"{where}: expected a whole number, got {x!r}")
    if lo is not None and x < lo:
        raise InputError(f"{where}: must be >= {lo}, got {x!r}")
    return int(x)


def as_float(x: Any, where: str, lo: float | None = None, finite: bool = True) -> float:
    """A number (finite unless ``finite`` is False: NaN records "not measured") of at least ``lo``."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise InputError(f"{where}: expected a number, got {x!r}")
    if finite and not math.isfinite(x):
        raise InputError(f"{where}: expected a finite number, got {x!r}")
    if lo is not None and x < lo:
        raise InputError(f"{where}: must be >= {lo:g}, got {x!r}")
    return float(x)


def as_str(x: Any, where: str) -> str:
    """A non-empty string."""
    if not isinstance(x, str) or not x:
        raise InputError(f"{where}: expected a non-empty string, got {x!r}")
    return x

"""argparse value types shared by the command lines (a bad value is a one-line usage error naming the flag)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def non_negative(kind: type) -> Callable[[str], float]:
    """A finite number >= 0 of ``kind`` (int or float)."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value >= 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0")
        return value
    return parse

"""Reading the project's JSON/YAML documents (profiles, specs, plans, cluster files, manifests) with
one-line errors that name the file and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from poolpipe_common.errors import InputError


def read_document(path: str | Path, what: str, yaml_ok: bool = False) -> Any:
    """Parsed content of ``path`` (JSON; YAML too when ``yaml_ok`` and the suffix is not .json)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"cannot read {what} {p}: {e.strerror or e}") from None
    try:
        return yaml.safe_load(text) if yaml_ok and p.suffix != ".json" else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise InputError(f"{what} {p} does not parse: {str(e).splitlines()[0]}") from None

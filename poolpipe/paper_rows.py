"""A live_paper row kept in its work directory, so a long run (``--models all``: 24 rows, hours) resumes where it
stopped, reusing only rows measured with the same run settings on the same code."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import time
from pathlib import Path

from poolpipe.paper_experiment import PaperRun, SystemResult

ROW_FORMAT = "poolpipe.live_paper_row/1"
ROW_FILE = "row.json"
SYSTEMS = ("fixed", "ppipe", "np", "triton-native", "sim-ppipe")
# Tracked files that cannot change what a row measures: prose and the test suite
_NOT_CODE = ("docs/", "tests/", ".ci/")


def code_fingerprint(root: Path) -> str | None:
    """A hash of every tracked file of the checkout at ``root`` that can change a measurement, as the files are
    now (uncommitted edits count); None outside a git checkout, where no row can be trusted to be reusable."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    h = hashlib.sha256()
    for name in sorted(p for p in out.stdout.decode().split("\0") if p):
        if name.startswith(_NOT_CODE) or name.endswith(".md"):
            continue
        path = root / name
        h.update(name.encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
    return h.hexdigest()


def _settings(run: PaperRun) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(run), default=str))


def save_row(work: Path, run: PaperRun, result: dict, fingerprint: str | None, seconds: float) -> str:
    """Write one finished row (run_all's result) beside its deployments and logs; returns when it finished (UTC)."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc = {"format": ROW_FORMAT, "code": fingerprint, "run": _settings(run), "measured_at": at,
           "seconds": round(seconds, 1),
           "rate": result["rate"], "promise": result["promise"],
           "systems": {k: {"max_lf": result[k].max_lf, "same_as": result[k].same_as,
                           "points": {str(lf): a for lf, a in result[k].points.items()}} for k in SYSTEMS}}
    work.mkdir(parents=True, exist_ok=True)
    path = work / ROW_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)  # a run stopped mid-write leaves the old row or none, never half of one
    return at


def load_row(work: Path, run: PaperRun, fingerprint: str | None) -> tuple[dict | None, str]:
    """The row kept in ``work`` as run_all's result and when it finished (UTC), or None and why it cannot be
    reused."""
    path = work / ROW_FILE
    if fingerprint is None:
        return None, "not a git checkout: rows are not reused"
    if not path.is_file():
        return None, "no finished row"
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != ROW_FORMAT:
            return None, f"{path}: format {doc.get('format')!r}, not {ROW_FORMAT}"
        if doc["code"] != fingerprint:
            return None, f"measured on other code ({doc['measured_at']})"
        if doc["run"] != _settings(run):
            return None, "measured with other settings"
        if set(doc["systems"]) != set(SYSTEMS):
            return None, f"{path}: systems {sorted(doc['systems'])}, not {sorted(SYSTEMS)}"
        return result_of(doc), doc["measured_at"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"{path} unreadable ({e}): measuring again"


def result_of(doc: dict) -> dict:
    """A row.json document as run_all's result: SystemResults by name, ``rate`` and ``promise`` (KeyError,
    ValueError or TypeError where it lacks them)."""
    systems = {k: SystemResult(k, float(v["max_lf"]), {float(lf): a for lf, a in v["points"].items()},
                               same_as=v["same_as"]) for k, v in doc["systems"].items()}
    promise = None if doc["promise"] is None else float(doc["promise"])
    return {**systems, "rate": float(doc["rate"]), "promise": promise}


def held(row: dict, system: str) -> float:
    """req/s the system held in a row (run_all's result): its knee's load factor x the row's nominal rate."""
    return row[system].max_lf * row["rate"]

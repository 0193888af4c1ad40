"""The documentation's commands, run as written, so that the docs and the code cannot drift.

The executable pages, docs/walkthrough.md and README.md's quick start, are run: every ```console block of the
page in order in one scratch directory (``$ `` lines are commands, ``\\`` continues one, the lines under a command
are its expected output); ```yaml blocks whose first line is ``# NAME.yaml`` are written to NAME.yaml first.
``poolpipe`` and ``python`` are this checkout's. A command ending in `` &`` runs in the background until the end
(stopped by its process group) and the test waits for its expected output. Outputs are compared by shape: each
expected line, with numbers masked and runs of spaces and table rules collapsed (and cpu-fast/cpu-slow alike), must
appear in order within the actual output (``…`` skips). The sidecar's default ports 8000-8002 are replaced by free
ones. Every other page's console commands (paper-scale plans that take minutes, real GPU clusters) are only
parsed by the real argument parser.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from poolpipe.cli import build_parser
from poolpipe_common.net import free_ports
from tests.conftest import ROOT

DOCS = ROOT / "docs"
EXECUTABLE = (DOCS / "walkthrough.md", ROOT / "README.md")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?")
_BOUND = re.compile(r"bound (?:N|none), gap (?:N%|n/a)")
_RULES = re.compile(r"[━─═┅]+")
_DEVICE = re.compile(r"\bcpu-(fast|slow)\b")


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    lang: str
    body: str


def page_blocks(text: str) -> list[Block]:
    return [Block(m["lang"], m["body"]) for m in re.finditer(r"```(?P<lang>\w+)\n(?P<body>.*?)\n```", text, re.S)]


def commands(body: str) -> list[Command]:
    out: list[Command] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            text = lines[i][2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            out.append(Command(text.split("  # ")[0].strip() if "  # " in text else text))
        elif out:
            out[-1].expected.append(lines[i])
        i += 1
    return out


def shape(line: str) -> str:
    """A line as compared: numbers masked, the two emulated device classes alike (which one a plan puts first
    depends on the measured profile), a solver's bound and gap alike whether given or not (a plan whose idle GPUs
    the sustained objective filled has none, and the measured profile decides whether it fills), table rules and
    runs of spaces collapsed."""
    line = _BOUND.sub("bound N, gap N", _NUMBER.sub("N", _DEVICE.sub("cpu-*", line)))
    return " ".join(_RULES.sub("━", line).split())


# Table rows and their rules: how many rows a plan or a sweep prints depends on the profile this machine just
# measured (a plan may split the model or not), so tables are compared by their header (the columns) only.
_TABLE_BODY = ("│", "├", "└")


def missing_line(expected: list[str], actual: str) -> str | None:
    """The first expected line that does not appear (by shape, in order) in ``actual``; None when all do."""
    got = [shape(x) for x in actual.replace("\r", "\n").splitlines()]
    pos = 0
    for line in expected:
        want = shape(line)
        if not want or want == "…" or want[0] in _TABLE_BODY:
            continue
        while pos < len(got) and want not in got[pos]:
            pos += 1
        if pos == len(got):
            return line
        pos += 1
    return None


class Session:
    """A scratch directory with this checkout's ``poolpipe`` first on the PATH, and the background jobs."""

    def __init__(self, work: Path) -> None:
        self.work = work
        bin_dir = work / ".bin"
        bin_dir.mkdir()
        for name, cmd in (("poolpipe", f"{sys.executable} -m poolpipe"), ("python", sys.executable)):
            (bin_dir / name).write_text(f'#!/bin/sh\nexec {cmd} "$@"\n')
            (bin_dir / name).chmod(0o755)
        (work / "data").symlink_to(ROOT / "data")
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
                    "COLUMNS": "120", "NO_COLOR": "1"}
        # the sidecar's ports (8000-8002 in the docs), picked when a command first names them: by then the
        # deployment's tritonservers, whose ports generate picked free at random too, are bound and avoided
        self.ports: dict[str, str] = {}
        self.jobs: list[tuple[subprocess.Popen, Path]] = []

    def _port(self, doc_port: str) -> str:
        if doc_port not in self.ports:
            self.ports[doc_port] = str(free_ports(1, {int(p) for p in self.ports.values()})[0])
        return self.ports[doc_port]

    def run(self, cmd: Command) -> None:
        text = re.sub(r"\b800[012]\b", lambda m: self._port(m[0]), cmd.text)
        if text.endswith("&"):
            self._background(text[:-1], cmd)
            return
        r = subprocess.run(["bash", "-c", text], cwd=self.work, env=self.env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, f"$ {cmd.text}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        line = missing_line(cmd.expected, r.stdout + "\n" + r.stderr)
        assert line is None, f"$ {cmd.text}\nthe docs show {line!r}; the command printed:\n{r.stdout}\n{r.stderr}"

    def _background(self, text: str, cmd: Command, timeout_s: float = 180.0) -> None:
        log = self.work / f".job{len(self.jobs)}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(["bash", "-c", f"exec {text}"], cwd=self.work, env=self.env, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.jobs.append((proc, log))
        deadline = time.monotonic() + timeout_s
        # Which servers a launch lists depends on the plan this machine's profile gave; its last line (ready)
        # is the signal, and the one compared.
        ready = [line for line in cmd.expected if shape(line)][-1:]
        while missing_line(ready, log.read_text(errors="replace")) is not None:
            assert proc.poll() is None, f"$ {cmd.text} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"$ {cmd.text}: no {ready} after {timeout_s:.0f} s"
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM each background job's process group, newest first (the sidecar before its servers)."""
        for proc, _ in reversed(self.jobs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def parse_only(cmd: Command, page: Path) -> None:
    argv = shlex.split(cmd.text)
    if argv and argv[0] == "poolpipe":
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as e:
            pytest.fail(f"{page.relative_to(ROOT)}: command does not parse ({e.code}): $ {cmd.text}")


def run_page(page: Path, work: Path) -> int:
    """Run every console block of ``page`` in order in ``work``; how many commands ran."""
    session = Session(work)
    ran = 0
    try:
        for b in page_blocks(page.read_text()):
            named = re.match(r"# ([\w.-]+\.yaml)\b", b.body)
            if b.lang == "yaml" and named:
                (work / named[1]).write_text(b.body + "\n")
            elif b.lang == "console":
                for cmd in commands(b.body):
                    session.run(cmd)
                    ran += 1
    finally:
        session.stop()
    return ran


@pytest.mark.triton
@pytest.mark.e2e
def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    ran = run_page(DOCS / "walkthrough.md", tmp_path)
    assert ran >= 12, f"only {ran} walkthrough commands ran"


@pytest.mark.triton
@pytest.mark.e2e
def test_the_readme_quick_start_runs_as_written(tmp_path: Path) -> None:
    ran = run_page(ROOT / "README.md", tmp_path)
    assert ran >= 6, f"only {ran} quick-start commands ran"


def test_every_other_documented_command_parses() -> None:
    pages = [p for p in sorted(DOCS.glob("*.md")) if p not in EXECUTABLE]
    parsed = 0
    for page in pages:
        for b in page_blocks(page.read_text()):
            if b.lang == "console":
                for cmd in commands(b.body):
                    parse_only(cmd, page)
                    parsed += cmd.text.startswith("poolpipe ")
    assert parsed >= 10, f"only {parsed} poolpipe commands found in {len(pages)} pages"

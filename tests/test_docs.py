"""The reference pages against the code: docs/configuration.md names exactly the fields each document's reader
accepts, docs/cli.md exactly the flags of each subcommand, and every relative link of the docs resolves.

A table of docs/configuration.md preceded by ``<!-- fields: KEY -->`` lists, one per row in its first column, the
fields of FIELD_LISTS[KEY]: the same constants the validation passes to ``check_fields`` (or the dataclass whose
fields it checks). The partition backend runs inside tritonserver and cannot be imported here, so its
``PARAMETERS`` are read from its source.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_repository_gen import app_manifest, cluster_file, manifest
from model_repository_gen.triton_config import BackendSettings, EmulatedSettings
from plans import plan_json as plan
from plans.spec import applications as app_spec
from plans.spec import planning_spec as spec
from plans.spec import vgpu_sizes
from poolpipe.cli import build_parser
from poolpipe_common import overheads
from profiling import block_memory, interference, latency_quantiles, profile
from scheduler.server.control import replanner
from tests.conftest import ROOT

DOCS = ROOT / "docs"
BACKEND = ROOT / "backends" / "partition" / "model.py"


def backend_parameters() -> tuple[str, ...]:
    """``PARAMETERS`` of the partition backend, read from its source (it imports Triton's stub module)."""
    for node in ast.parse(BACKEND.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PARAMETERS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"{BACKEND} has no PARAMETERS")


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


FIELD_LISTS: dict[str, tuple[str, ...]] = {
    "spec": spec.SPEC_FIELDS,
    "spec.cluster": spec.CLUSTER_FIELDS,
    "spec.cluster.vgpu_sizes": vgpu_sizes.SPLIT_KINDS,
    "spec.models": spec.MODEL_FIELDS,
    "spec.applications": app_spec.APP_FIELDS,
    "spec.applications.modules": app_spec.MODULE_FIELDS,
    "spec.applications.edges": app_spec.EDGE_FIELDS,
    "cluster": cluster_file.CLUSTER_FILE_FIELDS,
    "cluster.hosts": _fields(cluster_file.ClusterHost),
    "profile": profile.PROFILE_FIELDS,
    "profile.blocks": profile.BLOCK_FIELDS,
    "profile.devices": profile.TIMING_FIELDS,
    "profile.latency_quantiles": latency_quantiles.QUANTILES_FIELDS,
    "profile.memory": block_memory.MEMORY_FIELDS,
    "profile.interference": interference.INTERFERENCE_FIELDS,
    "plan": plan.PLAN_FIELDS,
    "plan.models": plan.MODEL_FIELDS,
    "plan.pipelines": plan.PIPELINE_FIELDS,
    "plan.partitions": plan.PARTITION_FIELDS,
    "plan.gpu_splits": plan.GPU_SPLIT_FIELDS,
    "manifest": manifest.MANIFEST_FIELDS,
    "manifest.hosts": _fields(manifest.HostInfo),
    "manifest.vgpus": _fields(manifest.VGpuInfo),
    "manifest.models": manifest.MODEL_FIELDS,
    "manifest.pipelines": manifest.PIPELINE_FIELDS,
    "manifest.stages": manifest.STAGE_FIELDS,
    "manifest.tensors": manifest.TENSOR_FIELDS,
    "application": app_manifest.APP_FIELDS,
    "application.modules": app_manifest.MODULE_FIELDS,
    "application.edges": app_manifest.EDGE_FIELDS,
    "replan": replanner.FIELDS,
    "overheads": overheads.OVERHEADS_FIELDS,
    "backend": backend_parameters(),
}


def documented_fields(text: str) -> dict[str, list[str]]:
    """KEY -> the backticked names in the first column of the table after ``<!-- fields: KEY -->``."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"<!-- fields: ([\w.]+) -->\n((?:\|.*\n?)+)", text):
        rows = m[2].strip().splitlines()[2:]  # after the header and its rule
        out[m[1]] = [re.search(r"`([^`]+)`", r.split("|")[1])[1] for r in rows]
    return out


def test_the_configuration_reference_names_exactly_the_validated_fields() -> None:
    documented = documented_fields((DOCS / "configuration.md").read_text())
    assert sorted(documented) == sorted(FIELD_LISTS), "field tables and FIELD_LISTS name different documents"
    problems = []
    for key, fields in FIELD_LISTS.items():
        doc = documented[key]
        if len(set(doc)) != len(doc):
            problems.append(f"{key}: a field is listed twice: {doc}")
        undocumented = sorted(set(fields) - set(doc))
        unknown = sorted(set(doc) - set(fields))
        if undocumented:
            problems.append(f"{key}: validated but not documented: {', '.join(undocumented)}")
        if unknown:
            problems.append(f"{key}: documented but not accepted by the code: {', '.join(unknown)}")
    assert not problems, "docs/configuration.md drifted from the code:\n" + "\n".join(problems)


def test_generate_writes_only_parameters_the_backend_reads() -> None:
    emulated = EmulatedSettings(((1, 10.0),), 0, quantiles_us=((0.0, 1.0), ((1, (9.0, 11.0)),)))
    written = set(BackendSettings().parameters()) | set(BackendSettings(emulated=emulated).parameters())
    assert written <= set(backend_parameters()), sorted(written - set(backend_parameters()))


def _subcommands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{path} {name}")


def cli_sections(text: str) -> dict[str, str]:
    """``poolpipe X`` -> the text of its section of docs/cli.md."""
    parts = re.split(r"^## `(poolpipe[^`]*)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_cli_reference_names_exactly_the_parsers_flags() -> None:
    sections = cli_sections((DOCS / "cli.md").read_text())
    commands = dict(_subcommands(build_parser(), "poolpipe"))
    del commands["poolpipe"]
    assert sorted(sections) == sorted(commands), "docs/cli.md's sections and the subcommands differ"
    problems = []
    for name, parser in commands.items():
        flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        table = [row for row in sections[name].splitlines() if row.startswith("| `")]
        documented = {f for row in table for f in re.findall(r"`(--[\w-]+)", row.split("|")[1])}
        if flags - documented:
            problems.append(f"{name}: flags not documented: {', '.join(sorted(flags - documented))}")
        if documented - flags:
            problems.append(f"{name}: documented flags it does not have: {', '.join(sorted(documented - flags))}")
    assert not problems, "docs/cli.md drifted from the parser:\n" + "\n".join(problems)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)

"""Loaders of the shared data model: profiles, specs and plans (round trips and validation)."""

from __future__ import annotations

import json

import pytest

from planner.ppipe.reference_plans import (
    load_reference_plans,
    plan_from_reference,
    spec_from_reference,
)
from plans.plan_json import plan_from_dict
from poolpipe_common.errors import InputError
from profiling.profile import load_profile, profile_from_dict
from profiling.reference import import_ppipe_profile
from tests.conftest import run_cli


def test_import_ppipe_reads_reference_layout(ref_dir):
    p = import_ppipe_profile(ref_dir, "colorization-v2")
    assert p.num_blocks == 10
    assert p.levels("T4") == [1, 2, 3, 4] and p.levels("P4") == [1]
    assert p.batch_sizes("L4", 2) == (1, 2, 3, 4)
    assert p.latency_us("L4", 1, 1, 0, 1) == 1359.0  # first cell of colorization-v2-L4-1.csv
    assert p.boundary_bytes(1) == 16777216


def test_profile_round_trip_and_field_errors(ref_dir, tmp_path):
    p = import_ppipe_profile(ref_dir, "repvgg-b3")
    p.save(tmp_path / "p.json")
    q = load_profile(tmp_path / "p.json")
    assert q.latency_us("T4", 2, 4) == p.latency_us("T4", 2, 4)
    d = p.to_dict()
    d["devices"]["T4"]["2"]["latency_us"][3] = [1.0]
    with pytest.raises(InputError, match=r"devices\.T4\.2\.latency_us"):
        profile_from_dict(d)
    d = p.to_dict()
    del d["blocks"][0]["output_bytes"]
    with pytest.raises(InputError, match=r"blocks\[0\]: missing field 'output_bytes'"):
        profile_from_dict(d)


def test_reference_plan_round_trips_through_plan_json(ref_dir):
    entry = next(e for e in load_reference_plans() if e["suite"] == "maf19" and e["planner"] == "ppipe")
    plan = plan_from_reference(entry, spec_from_reference(entry))
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert [m.throughput_rps for m in again.models] == [m["throughput_rps"] for m in entry["models"]]
    assert again.physical_gpus_used()["L4"] <= 25 + 1e-6


def test_cli_import_ppipe(tmp_path):
    r = run_cli("profile", "import-ppipe", "--dir", "data/ppipe", "--model", "atss_r101_fpn_1x_coco",
                "--out", tmp_path / "atss.json")
    assert r.returncode == 0, r.stderr
    assert load_profile(tmp_path / "atss.json").model == "atss_r101_fpn_1x_coco"
    r = run_cli("profile", "import-ppipe", "--dir", "data/ppipe", "--model", "nope", "--out", tmp_path / "x.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nope" in r.stderr

"""live_paper's finished rows: kept in the row's work directory and reused by ``--resume`` only on the same code and
settings, so a run of hours goes on where it stopped and never mixes in a row measured on other code."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from poolpipe.paper_experiment import PaperRun, SystemResult
from poolpipe.paper_rows import ROW_FILE, SYSTEMS, code_fingerprint, load_row, save_row

ROOT = Path(__file__).resolve().parents[1]
RUN = PaperRun("googlenet-v3-pytorch", 2.5, 4, 12, duration_s=6.0, native_front=True)


def result() -> dict:
    out = {k: SystemResult(k, 0.5 + 0.1 * i, {0.5: 0.995, 0.6: 0.97}) for i, k in enumerate(SYSTEMS)}
    out["np"].same_as = "ppipe"
    return {**out, "rate": 800.0, "promise": 434.4}


def test_a_saved_row_comes_back_as_run_all_gave_it(tmp_path):
    at = save_row(tmp_path, RUN, result(), "abc", 370.0)
    kept, when = load_row(tmp_path, RUN, "abc")
    assert when == at
    assert kept["rate"] == 800.0 and kept["promise"] == 434.4
    assert {k: (kept[k].max_lf, kept[k].same_as, kept[k].points) for k in SYSTEMS} == \
        {k: (v.max_lf, v.same_as, v.points) for k, v in result().items() if k in SYSTEMS}
    assert not list(tmp_path.glob("*.tmp"))


def test_a_row_of_other_code_other_settings_or_none_is_measured_again(tmp_path):
    save_row(tmp_path, RUN, result(), "abc", 370.0)
    assert load_row(tmp_path, RUN, "def")[0] is None
    assert "other code" in load_row(tmp_path, RUN, "def")[1]
    assert "other settings" in load_row(tmp_path, replace(RUN, duration_s=4.0), "abc")[1]
    assert "not a git checkout" in load_row(tmp_path, RUN, None)[1]
    assert "no finished row" in load_row(tmp_path / "elsewhere", RUN, "abc")[1]


def test_a_damaged_row_is_measured_again_not_a_crash(tmp_path):
    save_row(tmp_path, RUN, result(), "abc", 370.0)
    doc = json.loads((tmp_path / ROW_FILE).read_text())
    del doc["systems"]["np"]
    (tmp_path / ROW_FILE).write_text(json.dumps(doc))
    kept, why = load_row(tmp_path, RUN, "abc")
    assert kept is None and "systems" in why
    (tmp_path / ROW_FILE).write_text('{"format": "poolpipe.live_paper_row/1", "code": "abc"')
    kept, why = load_row(tmp_path, RUN, "abc")
    assert kept is None and "unreadable" in why


def _repo(path: Path) -> Path:
    for name, text in (("planner/a.py", "x = 1\n"), ("docs/a.md", "prose\n"), ("tests/test_a.py", "y = 1\n")):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "."], check=True)
    return path


def test_the_fingerprint_follows_code_and_uncommitted_edits_not_prose_or_tests(tmp_path):
    repo = _repo(tmp_path / "repo")
    first = code_fingerprint(repo)
    assert first is not None and first == code_fingerprint(repo)
    (repo / "docs/a.md").write_text("other prose\n")
    (repo / "tests/test_a.py").write_text("y = 2\n")
    assert code_fingerprint(repo) == first
    (repo / "planner/a.py").write_text("x = 2\n")  # not committed: still counts
    assert code_fingerprint(repo) != first
    assert code_fingerprint(tmp_path / "not-a-repo") is None


def test_resume_without_a_work_directory_is_a_usage_error():
    out = subprocess.run([sys.executable, "-P", "benchmarks/live_paper.py", "--resume"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--resume needs --work DIR" in out.stderr


def test_a_run_whose_rows_are_all_kept_measures_nothing_and_counts_the_targets(tmp_path):
    from backends import native_front

    run = replace(RUN, native_front=native_front.library() is not None)  # as live_paper builds it on this machine
    row = result()  # (a) 480 req/s; np the same plan; Triton's batcher 640; (a0) held nothing
    row["np"] = replace(row["np"], max_lf=row["ppipe"].max_lf)
    row["fixed"] = replace(row["fixed"], max_lf=0.0)
    row["promise"] = 450.0
    save_row(tmp_path / "googlenet-v3-pytorch-2.5-poisson", run, row, code_fingerprint(ROOT), 370.0)
    out = subprocess.run([sys.executable, "-P", "benchmarks/live_paper.py", "--models", "googlenet-v3-pytorch@2.5",
                          "--traces", "poisson", "--work", str(tmp_path), "--resume"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "kept: the row finished at" in out.stdout and "0 rows measured, 1 kept" in out.stdout
    assert "live/promise within 0.9-1.1: 1 of 1 rows; a/b >= 0.97: 1 of 1 rows; a/c >= 1.1: 0 of 1 rows" in out.stdout
    assert "n/a" in out.stdout  # a/a0 where (a0) held nothing

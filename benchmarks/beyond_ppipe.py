"""Planning beyond PPipe, every comparison of issue 16 in one run (simulated or analytic unless a section says
emulated): PARIS's heterogeneous instance sizes vs the best single size, InSS-style co-location vs dedicated
placement, Harpagon's toy cases and application-level cost vs a uniform SLO split, and an application served through
the sidecar vs its Triton ensemble. Each section is its own script beside this one and runs alone too::

    python -P benchmarks/beyond_ppipe.py                 # all sections
    python -P benchmarks/beyond_ppipe.py paris apps      # some of them
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

SECTIONS = {
    "paris": "unequal vGPU sizes: PARIS sizing vs the best single size",
    "inss": "co-location with interference vs dedicated placement",
    "apps": "applications: Harpagon's toy cases and SLO splitting",
    "appserve": "an application through the sidecar vs its Triton ensemble",
}


def main(argv: list[str]) -> int:
    chosen = argv or list(SECTIONS)
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        print(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    here = Path(__file__).resolve().parent
    for name in chosen:
        script = here / f"beyond_ppipe_{name}.py"
        if not script.is_file():
            print(f"\n=== {name}: {SECTIONS[name]} === not built yet ({script.name} is missing)", flush=True)
            continue
        print(f"\n=== {name}: {SECTIONS[name]} ===", flush=True)
        t0 = time.perf_counter()
        saved = sys.argv
        sys.argv = [str(script)]
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                print(f"section {name} failed with status {e.code}", file=sys.stderr)
                return 1
        finally:
            sys.argv = saved
        print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Start-up cost of the commands that do not run the engine: CPU seconds and wall seconds of
`docqa --help`, `docs`, `show`, `show --page` and an evidence-only `ask`, each in a fresh
process, repeated; minimum and median. Beside them, in the same run: a bare interpreter,
`import torch` (what every command paid before issue 17), and the evidence-only ask's own
work measured in-process (its `timings.total_s`), so "beyond its own work" is a difference of
two figures from this run.

Goals: `--help` <= 0.35 s CPU (issue 31; 0.5 s in issue 17); evidence-only `ask` <= 1 s beyond
its own work (issue 17).
CPU time (user + sys of the child) is the figure to read on a shared machine: wall time
includes waiting for a core.

    .venv/bin/python bench/startup.py [--repeat 7] [--out bench/results/startup.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
DOCQA = [str(Path(PY).with_name("docqa"))]  # the installed console script, as users run it
FIXTURE = ROOT / "fixtures" / "sample_contract.pdf"
QUESTION = "What is the notice period for termination for convenience?"


def timed(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(CPU s, wall s, stdout) of one run of cmd in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="docqa-startup-"))
    env = {**os.environ, "DOCQA_DB": str(tmp / "d.db"), "XDG_CACHE_HOME": str(tmp / "cache")}
    env.pop("DOCQA_DEBUG", None)
    _, _, out = timed(DOCQA + ["ingest", str(FIXTURE), "--json"], env)
    doc = json.loads(out)[0]["doc_id"]

    cases = {
        "python -c pass (interpreter alone)": [PY, "-c", "pass"],
        "python -c 'import torch' (reference: paid by every command before)": [PY, "-c", "import torch"],
        "docqa --help": DOCQA + ["--help"],
        "docqa docs": DOCQA + ["docs"],
        "docqa show DOC": DOCQA + ["show", doc],
        "docqa show DOC --page 2": DOCQA + ["show", doc, "--page", "2"],
        "docqa ask DOC Q --evidence-only": DOCQA + ["ask", doc, QUESTION, "--evidence-only", "--json"],
    }
    rows, own_work = [], []
    for name, cmd in cases.items():
        cpu, wall = [], []
        for _ in range(args.repeat):
            c, w, out = timed(cmd, env)
            cpu.append(c)
            wall.append(w)
            if "--evidence-only" in cmd:
                own_work.append(json.loads(out)["timings"]["total_s"])
        rows.append((name, min(cpu), statistics.median(cpu), min(wall), statistics.median(wall)))
        print(f"{name:<70} CPU min {min(cpu):.2f} med {statistics.median(cpu):.2f} s   "
              f"wall min {min(wall):.2f} med {statistics.median(wall):.2f} s", flush=True)

    ask_cpu = rows[-1][2]
    work = statistics.median(own_work)
    help_cpu = rows[2][1:3]
    lines = [
        "# Start-up cost of commands that do not run the engine",
        "",
        f"Command: `.venv/bin/python bench/startup.py --repeat {args.repeat}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs visible (shared with other work; "
        f"load average at the end {os.getloadavg()[0]:.1f}), Python {platform.python_version()}. "
        f"Each command in a fresh process, {args.repeat} runs; CPU = user + sys of the child.",
        "",
        "| command | CPU min (s) | CPU median (s) | wall min (s) | wall median (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
        *[f"| `{n}` | {a:.2f} | {b:.2f} | {c:.2f} | {d:.2f} |" for n, a, b, c, d in rows],
        "",
        f"- `docqa --help`: {help_cpu[0]:.2f} s CPU min, {help_cpu[1]:.2f} s median (goal <= 0.35 s); "
        f"`import torch` alone costs {rows[1][1]:.2f} s min.",
        f"- evidence-only `ask`: {ask_cpu:.2f} s CPU median for the whole process, of which its own work "
        f"(retrieval, verification, storing the run; `timings.total_s`, median) is {work:.2f} s: "
        f"{ask_cpu - work:.2f} s beyond its own work (goal <= 1 s).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

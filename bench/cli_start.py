"""CLI start on the local host, as a user runs it: `gputui status --json` and `gputui jobs --json` (0 jobs)
through the installed `gputui` script of the README's editable install (`python3 -m venv .venv &&
.venv/bin/pip install -e .`) and of a plain wheel install, beside `python3 -c pass`, interleaved in one run.

Run: python bench/cli_start.py [--runs 15] [--venvs DIR]. The two venvs are made in DIR (default: a temp dir,
removed after; a DIR given is kept and reused, as the venvs take a while to install): `editable` with
`pip install -e` of this checkout, `wheel` with `pip wheel --no-deps` of a copy of it installed into a fresh venv (pip
brings the dependencies from the package index or its cache). Each command runs once first (bytecode written,
agent unpacked) from a throwaway HOME with one local host. Prints medians and the ratio to `python3 -c pass` of
a fresh venv (no .pth of ours: the wheel venv's python); the floor of any asyncio command
(`python -c "import asyncio"`); and the modules of `status --json` that take longest to import. No asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "pip"), "-q", "--disable-pip-version-check", *args], check=True,
                   stdout=subprocess.DEVNULL)


def make_venvs(where: Path) -> tuple[Path, Path]:
    """(editable venv, wheel venv) in ``where``; each made once (a venv there already is reused)."""
    editable, wheel = where / "editable", where / "wheel"
    if not (editable / "bin" / "gputui").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(editable)], check=True)
        pip(editable, "install", "-e", str(ROOT))
    if not (wheel / "bin" / "gputui").exists():
        dist, src = where / "dist", where / "src"  # built from a copy: no build/ left in the checkout
        shutil.rmtree(dist, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "gputui", "remote_agent", "themes"):
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(ROOT / name, src / name)
        pip(editable, "wheel", "--no-deps", "-w", str(dist), str(src))
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(wheel)], check=True)
        pip(wheel, "install", *map(str, dist.glob("gputui-*.whl")))
    return editable, wheel


def slowest_imports(python: Path, script: Path, env: dict[str, str]) -> str:
    """The top-level imports of ``script status --json`` that take longest (``-X importtime``)."""
    res = subprocess.run([str(python), "-X", "importtime", str(script), "status", "--json"],
                         env=env, capture_output=True, text=True, check=True)
    rows = [line.split("|") for line in res.stderr.splitlines() if line.startswith("import time:")]
    depth = {r[2].rstrip(): int(r[1]) for r in rows if r[1].strip().isdigit()}
    top = sorted((us, m.strip()) for m, us in depth.items() if m.startswith("   ") and not m.startswith("     "))
    return ", ".join(f"{m} {us / 1000:.1f} ms" for us, m in reversed(top[-8:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--venvs", type=Path, help="make (or reuse) the two venvs here and keep them")
    args = ap.parse_args()
    where = args.venvs or Path(tempfile.mkdtemp(prefix="gputui-bench-venvs-"))
    try:
        editable, wheel = make_venvs(where)
        run(editable, wheel, args.runs)
    finally:
        if args.venvs is None:
            shutil.rmtree(where, ignore_errors=True)


def run(editable: Path, wheel: Path, runs: int) -> None:
    with tempfile.TemporaryDirectory() as home:
        config = Path(home) / ".config" / "gputui" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home}/state"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "GPUTUI_", "PYTHON"))}
        env.update(HOME=home, GPUTUI_DIRECT="1")  # the whole command each time (bench/service_status.py: served)
        py, ed = str(wheel / "bin" / "python"), str(editable / "bin" / "python")
        commands = {
            "python3 -c pass": [py, "-c", "pass"],
            "  ... import asyncio": [py, "-c", "import asyncio"],
            "editable: python -c pass": [ed, "-c", "pass"],
            "editable: status --json": [str(editable / "bin" / "gputui"), "status", "--json"],
            "editable: jobs --json": [str(editable / "bin" / "gputui"), "jobs", "--json"],
            "wheel: status --json": [str(wheel / "bin" / "gputui"), "status", "--json"],
            "wheel: jobs --json": [str(wheel / "bin" / "gputui"), "jobs", "--json"],
        }
        for argv in commands.values():
            timed(argv, env)  # bytecode written, agent unpacked
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, argv in commands.items():
                times[name].append(timed(argv, env))
        imports = slowest_imports(wheel / "bin" / "python", wheel / "bin" / "gputui", env)
    floor = statistics.median(times["python3 -c pass"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:26s} median {med * 1000:6.1f} ms  min {min(ts) * 1000:6.1f} ms  {med / floor:4.1f}x")
    print(f"wheel: status --json, slowest imports: {imports}")
    print(f"runs: {runs}, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

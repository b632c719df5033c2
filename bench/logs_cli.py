"""``gputui logs`` and ``gputui pull`` of a big ended job's log as a user runs them, beside OpenSSH, same run.

    python bench/logs_cli.py [--mb 120] [--runs 5]

Starts a throwaway sshd on 127.0.0.1 (bench/sshbox.py: a HOME whose config holds one SSH host ``box`` beside
the built-in ``local``), runs a job there that prints ``--mb`` MB of training-log lines and ends, then times
the whole command, connect and agent start included, each beside its OpenSSH peer over the same sshd,
interleaved, medians:

- ``gputui logs box JOB > /dev/null`` and ``> file`` beside ``ssh box cat LOG`` to the same place;
- ``gputui logs -f box JOB > /dev/null`` (the ended job) beside ``ssh box cat LOG > /dev/null``;
- ``gputui pull box LOG DIR/`` (listing, raw stream, sha256 on both sides) beside ``scp -O`` and
  ``ssh box cat LOG > file``;
- ``gputui status --json``-free connect share: ``gputui logs box JOB --tail 0`` (connect, agent start, one
  request, no bytes) beside ``ssh box true``, so the ratio with a faster connect can be predicted.

gputui runs as ``python -c 'from gputui.launch import main; main()'`` with this checkout on PYTHONPATH (the
installed script's entry point, from this tree; PYTHONDONTWRITEBYTECODE dropped so it runs from its ``.pyc``
as an installed one does). No asserts: loopback numbers are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshbox import GPUTUI, ROOT, Box, ssh_box  # noqa: E402

LINE = "epoch {e:3d} step {s:6d}/{n} loss={l:.5f} lr=3.0e-04 grad_norm={g:.3f} tokens/s=123456.7 \x1b[32mok\x1b[0m\n"


def write_log(path: Path, mb: int) -> None:
    """About ``mb`` MB of training-log lines (with a colour sequence each, as real logs have)."""
    with path.open("w") as f:
        i = 0
        while f.tell() < mb * 1_000_000:
            f.write("".join(LINE.format(e=j // 1000, s=j, n=10**6, l=1 / (j + 1), g=j % 7 / 3)
                            for j in range(i, i + 10_000)))
            i += 10_000


def ended_job(box: Box, src: Path) -> tuple[str, Path]:
    """Run ``cat SRC`` as a job on box and wait for its end (``logs -f``); (job id, its log on the host)."""
    run = subprocess.run([*GPUTUI, "run", "box", "--", "cat", str(src)], env=box.env, capture_output=True,
                         check=True, text=True)
    job = run.stdout.strip()
    box.timed([*GPUTUI, "logs", "-f", "box", job])
    jobs = json.loads(subprocess.run([*GPUTUI, "jobs", "box", "--json"], env=box.env, capture_output=True,
                                     check=True, text=True).stdout)
    state = next(j["state"] for j in jobs if j["id"] == job)
    logs = list((box.root / "remote").rglob(f"jobs/{job}/output.log"))
    if len(logs) != 1:
        raise SystemExit(f"job {job} ({state}): its log is not under {box.root / 'remote'}")
    return job, logs[0]


@contextlib.contextmanager
def ended_log_box(mb: int) -> Iterator[tuple[Box, str, Path]]:
    """bench/sshbox.py's box with an ended job whose log is about ``mb`` MB of training-log lines: (the box, the
    job's id, its log on the host)."""
    with ssh_box() as box:
        box.env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed gputui runs from its .pyc, as here
        src = box.root / "train.log"
        write_log(src, mb)
        job, log = ended_job(box, src)
        yield box, job, log


class Clock:
    """Each command's wall time and its client's CPU time (user + sys of the child: less noisy on a busy box)."""

    def __init__(self, box: Box, labels: list[str]) -> None:
        self.box = box
        self.wall: dict[str, list[float]] = {k: [] for k in labels}
        self.cpu: dict[str, list[float]] = {k: [] for k in labels}

    def __call__(self, label: str, argv: list[str], dest: Path | None = None) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        took = to_file(self.box, argv, dest) if dest is not None else self.box.timed(argv)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.wall[label].append(took)
        self.cpu[label].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return took


def to_file(box: Box, argv: list[str], dest: Path) -> float:
    with dest.open("wb") as out:
        took = box.timed(argv, stdout=out.fileno())
    size = dest.stat().st_size
    dest.unlink()
    if size == 0:
        raise SystemExit(f"{argv[-3:]} wrote nothing")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=120)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if not shutil.which("scp"):
        raise SystemExit("scp is not installed")
    pairs = [
        ("logs > /dev/null", "ssh cat > /dev/null"),
        ("logs > file", "ssh cat > file"),
        ("logs -f > /dev/null", "ssh cat > /dev/null (2)"),
        ("pull", "scp -O"),
        ("pull ", "ssh cat > file (2)"),
        ("logs --tail 0 (connect)", "ssh true (connect)"),
    ]
    with ended_log_box(args.mb) as (box, job, log):
        size = log.stat().st_size
        out, pulled = box.root / "out.bin", box.root / "pulled"
        g, ssh = [*GPUTUI], box.ssh
        clock = Clock(box, [k for pair in pairs for k in pair])
        scp = ["scp", "-O", "-q", "-P", ssh[2], *ssh[3:-1], f"{ssh[-1]}:{log}", str(out)]
        for _ in range(args.runs):
            clock("logs > /dev/null", [*g, "logs", "box", job])
            clock("ssh cat > /dev/null", [*ssh, "cat", str(log)])
            clock("logs > file", [*g, "logs", "box", job], out)
            clock("ssh cat > file", [*ssh, "cat", str(log)], out)
            clock("logs -f > /dev/null", [*g, "logs", "-f", "box", job])
            clock("ssh cat > /dev/null (2)", [*ssh, "cat", str(log)])
            shutil.rmtree(pulled, ignore_errors=True)
            clock("pull", [*g, "pull", "box", str(log), f"{pulled}/"])
            if (pulled / "output.log").stat().st_size != size:
                raise SystemExit("pull brought a file of another size")
            clock.wall["pull "].append(clock.wall["pull"][-1])
            clock.cpu["pull "].append(clock.cpu["pull"][-1])
            clock("scp -O", scp)
            out.unlink()
            clock("ssh cat > file (2)", [*ssh, "cat", str(log)], out)
            clock("logs --tail 0 (connect)", [*g, "logs", "--tail", "0", "box", job])
            clock("ssh true (connect)", [*ssh, "true"])
    med = statistics.median
    print(
        f"gputui (python -c 'from gputui.launch import main; main()', PYTHONPATH={ROOT}) vs OpenSSH, one ended"
    )
    print(f"job's log of {size / 1e6:.0f} MB on a loopback sshd, {args.runs} runs interleaved, medians (min), "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; CPU: the client's user+sys")
    print(
        f"{'gputui':<24} {'wall s':>12} {'CPU s':>6}   {'peer':<24} {'wall s':>12} {'CPU s':>6}   peer/gputui"
    )
    for ours, theirs in pairs:
        a, b = med(clock.wall[ours]), med(clock.wall[theirs])
        print(
            f"{ours:<24} {a:5.2f} ({min(clock.wall[ours]):4.2f}) {med(clock.cpu[ours]):6.2f}   "
            f"{theirs:<24} {b:5.2f} ({min(clock.wall[theirs]):4.2f}) {med(clock.cpu[theirs]):6.2f}   {b / a:5.2f}x"
        )


if __name__ == "__main__":
    main()

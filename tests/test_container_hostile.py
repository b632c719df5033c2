"""cgroup and /proc files are data: a huge number, a huge file or a FIFO in their place is no reading, never a
traceback or a hang of the host probe."""

from __future__ import annotations

import os
from pathlib import Path

from test_container import tree

from remote_agent.host import container
from remote_agent.host.procfs import READ_LIMIT, read_text
from remote_agent.host.stats import HostStats


def _pod(tmp_path: Path, files: dict[str, str]) -> tuple[str, str]:
    proc = tree(tmp_path / "proc", {"self/cgroup": "0::/pod\n", "meminfo": "MemTotal: 1000 kB\n", "stat": "cpu 1 0 1 100 0 0 0 0\n"})
    cg = tree(tmp_path / "cg", {"cgroup.controllers": "cpu memory\n", **{f"pod/{k}": v for k, v in files.items()}})
    return str(proc), str(cg)


def test_huge_numbers_in_cgroup_files_are_no_reading(tmp_path: Path) -> None:
    huge = "9" * 5000
    proc, cg = _pod(tmp_path, {
        "memory.max": "1" + "0" * 30 + "\n", "memory.current": huge + "\n",
        "cpu.max": f"{huge} 100000\n", "cpu.stat": f"usage_usec {huge}\n",
    })
    assert container.memory_limit(proc, cg) is None
    assert container.cpu_limit(proc, cg) is None
    assert container.cpu_usage_s(proc, cg) is None
    HostStats(str(tmp_path), proc=proc, cgroup_root=cg).sample()  # the host line is made without them


def test_a_fifo_or_a_huge_file_in_place_of_a_cgroup_file_is_not_read(tmp_path: Path) -> None:
    proc, cg = _pod(tmp_path, {"memory.current": "1\n", "cpu.stat": "usage_usec 7\n"})
    os.mkfifo(Path(cg) / "pod" / "memory.max")  # no writer: a blocking open would wait for ever
    (Path(cg) / "pod" / "cpu.max").write_text("150000 100000 " + "x" * (2 * READ_LIMIT))
    assert read_text(str(Path(cg) / "pod" / "memory.max")) is None
    assert container.memory_limit(proc, cg) is None
    assert len(read_text(str(Path(cg) / "pod" / "cpu.max")) or "") == READ_LIMIT
    assert container.cpu_limit(proc, cg) == 1.5  # its first words are still read
    assert container.cpu_usage_s(proc, cg) == 7e-6

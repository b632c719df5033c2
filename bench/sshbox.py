"""A throwaway loopback sshd and a HOME whose gputui config holds one SSH host, for the whole-command benches.

    with ssh_box() as box:
        box.timed([*GPUTUI, "status", "--json"])       # the CLI as the installed script runs it, from this tree
        box.timed([*box.ssh, "cat", "/etc/hostname"])  # OpenSSH over the same sshd: the peer

The host is ``box`` (beside the built-in ``local``); the agent's remote_dir lies under the run's temp dir, and
every agent the run started is ended when the block exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from sshd import Sshd, start_with_client  # noqa: E402

GPUTUI = [sys.executable, "-c", "from gputui.launch import main; main()"]


@dataclass
class Box:
    root: Path
    server: Sshd
    home: Path
    env: dict[str, str]
    ssh: list[str]  # OpenSSH to the same host: ssh -p PORT -i KEY ... user@127.0.0.1

    def timed(self, argv: list[str], stdout: int | None = subprocess.DEVNULL) -> float:
        """Seconds the command took; a failure ends the bench with its stderr."""
        t0 = time.perf_counter()
        res = subprocess.run(
            argv, env=self.env, stdout=stdout, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        took = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(
                f"{argv[-4:]} failed ({res.returncode}): {res.stderr[-2000:].decode(errors='replace')}"
            )
        return took


def stop_agents(root: Path) -> None:
    """End the agents this run started (their command lines name its dirs), by pid."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in argv and int(pid) != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def ssh_box(extra_config: str = "") -> Iterator[Box]:
    """Start the sshd, write the config (``extra_config`` appended as TOML), yield the Box, clean up."""
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    server, key, known = start_with_client(root)
    home = root / "home"
    settings = {"host": "127.0.0.1", "port": server.port, "user": server.user, "identity_file": str(key),
                "known_hosts": str(known), "remote_dir": str(root / "remote")}
    (home / ".config" / "gputui").mkdir(parents=True)
    (home / ".config" / "gputui" / "config.toml").write_text(
        "[hosts.box]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()) + extra_config
    )
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT), "GPUTUI_DIRECT": "1"}  # each command whole
    env.pop("XDG_CONFIG_HOME", None)
    env["XDG_RUNTIME_DIR"] = str(root / "run")  # bench/service_status.py's session service, without GPUTUI_DIRECT
    (root / "run").mkdir(mode=0o700)
    ssh = [
        "ssh",
        "-p",
        str(server.port),
        "-i",
        str(key),
        "-o",
        f"UserKnownHostsFile={known}",
        "-o",
        "BatchMode=yes",
    ]
    try:
        yield Box(root, server, home, env, [*ssh, f"{server.user}@127.0.0.1"])
    finally:
        server.stop()
        stop_agents(root)
        shutil.rmtree(root, ignore_errors=True)


CAPTURE = ROOT / "tests" / "fixtures" / "gpu" / "h100-80gb-hbm3_590.48.01_capture.txt"


def smi_stand_in(box: Box) -> None:
    """Put the recorded-CSV stand-in of nvidia-smi the tests use (an H100 capture) first on the host's PATH."""
    smi = box.root / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{CAPTURE.parent / "fake_nvidia_smi.py"}" '
                   f'--capture "{CAPTURE}" --state idle "$@"\n')
    smi.chmod(0o755)
    authorized = box.server.authorized  # the key's sessions get PATH=...: the stand-in comes first
    authorized.write_text(authorized.read_text().replace('"PATH=', f'"PATH={smi.parent}:', 1))


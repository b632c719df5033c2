"""Artifacts over the real sshd: release lists what changed on the host since the last pull, pulls it first
(--pull), refuses --yes alone while something would be lost, and releases without it only when told."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SshHome

from gputui.core.config import file as cfg


def test_release_pulls_changed_artifacts_first_or_refuses(ssh_home: SshHome, tmp_path: Path) -> None:
    marker = tmp_path / "released"
    ssh_home.configure(artifacts=["ckpt/"], release_remote=["touch", str(marker)])
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "runs").mkdir()
    (work / "ckpt" / "a.pt").write_bytes(os.urandom(300_000))
    (work / "runs" / "log.txt").write_text("loss 0.1\n")
    (work / "other.txt").write_text("not an artifact")
    job = ssh_home.cli(
        "run", "box", "--cwd", str(work), "--artifacts", "runs/", "--", "true", check=True
    ).stdout.strip()
    record = json.loads(ssh_home.remote_job_dir(job).joinpath("job.json").read_text())
    assert record["artifacts"] == ["runs/"]
    [run] = json.loads(ssh_home.cli("history", "box", "--json", check=True).stdout)
    assert run["artifacts"] == ["runs/"]

    # --yes alone: refused, nothing run on the host, both artifacts named.
    res = ssh_home.cli("release", "box", "--yes")
    assert res.returncode == 1 and "--pull" in res.stderr and "--no-pull" in res.stderr, res.stderr
    assert f"{job}/ckpt/a.pt" in res.stderr and f"{job}/runs/log.txt" in res.stderr
    assert "other.txt" not in res.stderr and not marker.exists()

    # --pull: fetched (sha256-checked) into DIR/HOST/JOB/..., then released.
    dest = tmp_path / "saved"
    res = ssh_home.cli("release", "box", "--yes", "--pull", "--to", str(dest))
    assert res.returncode == 0, res.stderr
    assert (dest / "box" / job / "ckpt" / "a.pt").read_bytes() == (work / "ckpt" / "a.pt").read_bytes()
    assert (dest / "box" / job / "runs" / "log.txt").read_text() == "loss 0.1\n"
    assert marker.exists() and "box: released" in res.stdout
    marker.unlink()

    # A file changed on the host after that pull is at risk again; the others are not.
    (work / "ckpt" / "a.pt").write_bytes(b"newer weights")
    future = time.time() + 60
    os.utime(work / "ckpt" / "a.pt", (future, future))
    res = ssh_home.cli("release", "box", "--yes")
    assert res.returncode == 1 and "1 artifact file" in res.stderr and "log.txt" not in res.stderr, res.stderr
    assert not marker.exists()

    # A plain `gputui pull` of it counts too (the pull record is by host path, not by destination).
    ssh_home.cli("pull", "box", f"{job}:ckpt/a.pt", str(tmp_path / "mine.pt"), check=True)
    record = json.loads((ssh_home.root / ".local/state/gputui/pulled/box.json").read_text())
    assert record[str(work / "ckpt" / "a.pt")]["local"] == str(tmp_path / "mine.pt")
    res = ssh_home.cli("release", "box", "--yes")
    assert res.returncode == 0 and marker.exists(), res.stderr
    marker.unlink()

    # --no-pull: the user said so; released with changes left behind.
    (work / "runs" / "log.txt").write_text("loss 0.05\n")
    res = ssh_home.cli("release", "box", "--yes", "--no-pull")
    assert res.returncode == 0 and marker.exists(), res.stderr

    res = ssh_home.cli("release", "box", "--yes", "--pull", "--no-pull")
    assert res.returncode == 2 and "not allowed with" in res.stderr


def test_release_refuses_when_a_newer_local_copy_would_be_overwritten(ssh_home: SshHome, tmp_path: Path) -> None:
    marker = tmp_path / "released"
    ssh_home.configure(artifacts=["out.bin"], release_remote=["touch", str(marker)])
    work = tmp_path / "work"
    work.mkdir()
    (work / "out.bin").write_bytes(b"host copy")
    job = ssh_home.cli("run", "box", "--cwd", str(work), "--", "true", check=True).stdout.strip()
    mine = tmp_path / "saved" / "box" / job / "out.bin"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"my edits")
    future = time.time() + 3600
    os.utime(mine, (future, future))
    res = ssh_home.cli("release", "box", "--yes", "--pull", "--to", str(tmp_path / "saved"))
    assert res.returncode == 1 and "newer" in res.stderr and not marker.exists(), res.stderr
    assert mine.read_bytes() == b"my edits"


def test_artifacts_setting_and_flag_are_checked(ssh_home: SshHome, tmp_path: Path) -> None:
    for bad in ('"ckpt/"', "[1]", '[""]'):
        with pytest.raises(cfg.ConfigError, match=r"x.toml:3: hosts.a.artifacts: must be a list of paths"):
            cfg.parse(f'[hosts.a]\nhost = "h"\nartifacts = {bad}\n', Path("x.toml"))
    assert cfg.parse('[defaults]\nartifacts = ["ckpt/", "/data/out"]\n[hosts.a]\n', Path("x.toml")).hosts[
        "a"
    ].artifacts == ("ckpt/", "/data/out")
    res = ssh_home.cli("run", "box", "--artifacts", "a\x1bb", "--", "true")
    assert res.returncode == 2 and "--artifacts" in res.stderr and "Traceback" not in res.stderr


def _answer_prompts(home: SshHome, args: list[str], answers: dict[str, str]) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, answering each prompt that ends with one of ``answers``' keys."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputui", *args], env=home.env, stdin=sub, stdout=sub, stderr=sub
    )
    os.close(sub)
    out, deadline = b"", time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            out += chunk
            for prompt, reply in answers.items():
                if out.rstrip().endswith(prompt.encode()):
                    os.write(main, reply.encode() + b"\n")
        return proc.wait(timeout=30), out.decode("utf-8", "replace")
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()


def test_release_on_a_terminal_offers_to_pull_first(ssh_home: SshHome, tmp_path: Path) -> None:
    marker = tmp_path / "released"
    ssh_home.configure(artifacts=["ckpt/"], release_remote=["touch", str(marker)])
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "ckpt" / "a.pt").write_bytes(b"weights")
    job = ssh_home.cli("run", "box", "--cwd", str(work), "--", "true", check=True).stdout.strip()
    dest = tmp_path / "saved"

    # "n" to the pull, "n" to releasing without them: nothing happens.
    args = ["release", "box", "--to", str(dest)]
    code, out = _answer_prompts(ssh_home, args, {"first? [y/N]": "n", "lost. [y/N]": "n"})
    assert code == 1 and "not released" in out and not marker.exists() and not dest.exists(), out
    # "y" to the pull, then "y" to the release.
    code, out = _answer_prompts(ssh_home, args, {"first? [y/N]": "y", "instance. [y/N]": "y"})
    assert code == 0 and marker.exists(), out
    assert (dest / "box" / job / "ckpt" / "a.pt").read_bytes() == b"weights"


def test_two_host_files_with_one_local_name_are_refused_not_overwritten(ssh_home: SshHome, tmp_path: Path) -> None:
    """``runs/*/ckpt.pt`` matches two files that both land at JOB/ckpt.pt: pulling one over the other would
    lose it here while the pull record calls both fetched, and the release would then lose it for good."""
    marker = tmp_path / "released"
    ssh_home.configure(artifacts=["runs/*/ckpt.pt"], release_remote=["touch", str(marker)])
    work = tmp_path / "work"
    for name, age in (("a", 600), ("b", 0)):
        (work / "runs" / name).mkdir(parents=True)
        (work / "runs" / name / "ckpt.pt").write_bytes(f"weights {name}".encode())
        os.utime(work / "runs" / name / "ckpt.pt", (time.time() - age, time.time() - age))
    job = ssh_home.cli("run", "box", "--cwd", str(work), "--", "true", check=True).stdout.strip()
    dest = tmp_path / "saved"
    res = ssh_home.cli("release", "box", "--yes", "--pull", "--to", str(dest))
    assert res.returncode == 1 and not marker.exists(), res.stderr
    assert "runs/a/ckpt.pt" in res.stderr and "runs/b/ckpt.pt" in res.stderr and "Traceback" not in res.stderr
    assert not (dest / "box" / job / "ckpt.pt").exists()  # nothing pulled: not one over the other
    # Still at risk: a release without --pull is refused as before.
    res = ssh_home.cli("release", "box", "--yes")
    assert res.returncode == 1 and "2 artifact files" in res.stderr and not marker.exists(), res.stderr

    # A plain pull of the same glob says so too, instead of leaving one of them.
    res = ssh_home.cli("pull", "box", f"{job}:runs/*/ckpt.pt", str(tmp_path / "here"))
    assert res.returncode != 0 and "runs/a/ckpt.pt" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "here" / "ckpt.pt").exists()

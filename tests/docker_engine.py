"""A real Docker engine for tests: Debian's ``dockerd`` (docker.io) on its own socket and data root.

Run as root (scripts/test.sh installs docker.io and busybox-static): ``--storage-driver=vfs`` (no overlay
needed), ``--bridge=none --iptables=false`` (containers get the host's network or none, which is all gputui
uses). No registry is reachable, so the one test image is made here: ``docker import`` of a root filesystem
holding a static busybox (``sh``, ``sleep``, ``id``, ...), a couple of MB, built once per engine.
The engine runs without the suite's run mark: its daemons are not the suite's processes; ``stop`` ends them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

DOCKERD = "/usr/sbin/dockerd"
BUSYBOX = "/bin/busybox"
IMAGE = "gputui-test/busybox:1"
APPLETS = ("sh", "sleep", "echo", "cat", "id", "env", "touch", "ls", "kill", "ps", "test", "true", "false")


def docker_available() -> str | None:
    """Why the test engine cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the test Docker engine runs as root (run the tests as root, as CI does)"
    for path, package in ((DOCKERD, "docker.io"), (BUSYBOX, "busybox-static")):
        if not os.path.exists(path):
            return f"{path} is missing (apt install {package}; scripts/test.sh does)"
    if shutil.which("docker") is None:
        return "the docker CLI is missing (apt install docker.io)"
    return None


class DockerEngine:
    """``dockerd`` under ``root``; ``env`` is what a client needs (DOCKER_HOST)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.env = dict(os.environ, DOCKER_HOST=self.host)
        self.proc: subprocess.Popen[bytes] | None = None

    def docker(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} -> {res.returncode}: {res.stderr}")
        return res

    def start(self, timeout: float = 60.0) -> DockerEngine:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}  # not the suite's mark
        env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin"
        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            [DOCKERD, "--host", self.host, "--data-root", str(self.root / "data"), "--exec-root",
             str(self.root / "exec"), "--pidfile", str(self.root / "dockerd.pid"), "--storage-driver=vfs",
             "--bridge=none", "--iptables=false", "--ip6tables=false"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while self.docker("info", check=False, timeout=10).returncode != 0:  # a readiness check
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("dockerd did not start: " + (self.root / "dockerd.log").read_text()[-2000:])
            time.sleep(0.1)
        self.import_image()
        return self

    def import_image(self, tag: str = IMAGE, links: dict[str, str] | None = None) -> str:
        """A busybox test image (made once; ``links``: top-level symlinks to add, name -> target); its ID."""
        found = self.docker("image", "inspect", "--format", "{{.Id}}", tag, check=False)
        if found.returncode == 0:
            return found.stdout.strip()
        rootfs = self.root / "rootfs.tar"
        with tarfile.open(rootfs, mode="w") as tar:
            for folder in ("bin", "tmp", "etc", "usr"):
                info = tarfile.TarInfo(folder)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
                tar.addfile(info)
            tar.add(BUSYBOX, "bin/busybox")
            for name, target in [(f"bin/{applet}", "busybox") for applet in APPLETS] + list((links or {}).items()):
                link = tarfile.TarInfo(name)
                link.type, link.linkname = tarfile.SYMTYPE, target
                tar.addfile(link)
        self.docker("import", "--change", "ENV PATH=/bin", str(rootfs), tag)
        return self.import_image(tag)

    def host_python(self) -> tuple[str, list[str]]:
        """An image that runs this machine's Python and its venv (torch included) read-only from the host, for
        the MNIST example in a container: (image, the --docker-arg options that mount what it needs). No
        registry is reachable, and a copy of torch per container (vfs) would cost a GB each."""
        links = {name: os.readlink(f"/{name}") for name in ("lib", "lib64", "lib32", "libx32")
                 if os.path.islink(f"/{name}")}
        image = "gputui-test/host-python:1"
        self.import_image(image, links)
        mounts = ["/usr", "/etc/ld.so.cache", sys.base_prefix, sys.prefix]
        mounts += [f"/{name}" for name in ("lib", "lib64") if os.path.isdir(f"/{name}") and name not in links]
        return image, [f"--volume={m}:{m}:ro" for m in dict.fromkeys(mounts) if os.path.exists(m)]

    def containers(self, *filters: str) -> list[str]:
        """Names of the containers (running or not) matching ``filters`` (``label=...``, ``name=...``)."""
        args = [a for f in filters for a in ("--filter", f)]
        return self.docker("ps", "-a", *args, "--format", "{{.Names}}").stdout.split()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(Exception):
            ids = self.docker("ps", "-aq", timeout=20).stdout.split()
            if ids:
                self.docker("rm", "--force", *ids, timeout=60, check=False)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for point in self.mounts():  # dockerd leaves its network namespace bind-mounted (exec/netns/default)
            subprocess.run(["umount", "--lazy", point], capture_output=True)

    def mounts(self) -> list[str]:
        """Mount points under the engine's root, deepest first."""
        points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        return sorted((p for p in points if p.startswith(f"{self.root}/")), reverse=True)

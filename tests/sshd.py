"""A real OpenSSH sshd on 127.0.0.1 for tests: keys, authorized_keys and the remote user's environment.

The ssh user is whoever runs the tests (root in CI). Each client key gets its own forced environment through
``environment="..."`` in authorized_keys (``PermitUserEnvironment``), so one sshd serves a normal
host, a host without tmux and a host without python3: the test picks the key. The suite's own variables
(``FORWARDED``: its tmux dir and run mark) reach the sessions too, so nothing they start escapes the suite.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"  # sshd insists on an absolute path
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
FORWARDED = ("TMUX_TMPDIR", "PYTEST_GPUTUI_RUN")  # from the test process's environment, when set


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path


def restricted_bin(dest: Path, without: tuple[str, ...]) -> Path:
    """A PATH directory with every command of /usr/bin and /bin except names starting with ``without``."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in ("/usr/local/bin", "/usr/bin", "/bin"):
        if not os.path.isdir(src):
            continue
        for name in os.listdir(src):
            link = dest / name
            if name.startswith(without) or link.exists() or link.is_symlink():
                continue
            link.symlink_to(os.path.join(src, name))
    return dest


class Sshd:
    """One sshd with its own host key, authorized_keys and a clean remote HOME."""

    def __init__(
        self, root: Path, tcp_forwarding: str = "no", address: str = "127.0.0.1", pod: bool = False
    ) -> None:
        self.root = root
        # ``pod``: sshd is PID 1 of its own PID namespace (and /proc), as a pod's container is: when it dies (``kill``),
        # every process of the namespace dies with it, the files stay (the pod's volume). Root only (unshare).
        self.pod = pod
        self.address = address  # any of 127/8: a second "host" on this machine listens on 127.0.0.2
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.user = getpass.getuser()
        self.remote_home = root / "remote-home"
        self.remote_home.mkdir(exist_ok=True)
        self.host_key = keygen(root / "ssh_host_ed25519_key")
        self.authorized = root / "authorized_keys"
        self.authorized.write_text("")
        self.log = root / "sshd.log"
        self.config = root / "sshd_config"
        self.proc: subprocess.Popen[bytes] | None = None
        self.keys: dict[str, Path] = {}  # client keys by name (file ``id_<name>``)
        self.config.write_text(
            f"Port {self.port}\nListenAddress {address}\nHostKey {self.host_key}\nPidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized}\n"
            "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
            f"PermitUserEnvironment HOME,PATH,DOCKER_HOST,RUNPOD_*,{','.join(FORWARDED)}\n"
            f"AllowAgentForwarding no\nAllowTcpForwarding {tcp_forwarding}\nX11Forwarding no\nPrintMotd no\n"
            "MaxStartups 50:30:100\nLogLevel INFO\n"
        )

    # --- keys -------------------------------------------------------------------------------------------------
    def client_key(
        self, name: str, path: str = SYSTEM_PATH, authorize: bool = True, env: dict[str, str] | None = None
    ) -> Path:
        """A client key ``id_<name>``; when authorized, its sessions get HOME=remote_home, PATH=``path`` and
        ``env`` (e.g. DOCKER_HOST: the test engine's socket)."""
        key = self.keys[name] = keygen(self.root / f"id_{name}")
        if authorize:
            pub = key.with_name(key.name + ".pub").read_text().strip()
            forwarded = {k: os.environ[k] for k in FORWARDED if k in os.environ}
            settings = {"HOME": str(self.remote_home), "PATH": path, **forwarded, **(env or {})}
            env = ",".join(f'environment="{k}={v}"' for k, v in settings.items())
            with self.authorized.open("a") as f:
                f.write(f"{env} {pub}\n")
        return key

    def host_key_line(self, pattern: str | None = None) -> str:
        """The known_hosts line for this server, e.g. ``[127.0.0.1]:2222 ssh-ed25519 AAAA...``."""
        kind, data = (self.root / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"{pattern or f'[{self.address}]:{self.port}'} {kind} {data}\n"

    def fingerprint(self) -> str:
        out = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.host_key) + ".pub"],
            capture_output=True, text=True, check=True,
        ).stdout
        return out.split()[1]  # SHA256:...

    # --- process ----------------------------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> Sshd:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir, needed as root
        check = subprocess.run([SSHD, "-t", "-f", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd rejects its test config: {check.stderr}")
        argv = [SSHD, "-D", "-e", "-f", str(self.config)]
        if self.pod:
            argv = ["unshare", "--pid", "--mount-proc", "--kill-child", *argv]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self.wait_ready(timeout)
        return self

    def move(self, port: int) -> None:
        """Listen on ``port`` from the next ``start`` (a pod started again gets new port mappings)."""
        self.config.write_text(self.config.read_text().replace(f"Port {self.port}\n", f"Port {port}\n", 1))
        self.port = port

    def kill(self) -> None:
        """Gone at once, with no word to anyone (a pod's stop: its namespace's every process with it)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def wait_ready(self, timeout: float) -> None:
        """Ready once a TCP connection gets the SSH banner (a readiness check, not a sleep)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-2.0-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd not ready on port {self.port}: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def ssh_available() -> str | None:
    """Why the SSH tests cannot run here, or None when they can."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is missing (apt install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is missing (apt install openssh-client)"
    if os.geteuid() != 0 and not os.access("/run/sshd", os.W_OK):
        return "sshd needs /run/sshd (run the tests as root, as CI does)"
    return None


def start_with_client(root: Path, name: str = "bench") -> tuple[Sshd, Path, Path]:
    """A started sshd under ``root``, a client key it accepts, and a known_hosts file that trusts it."""
    server = Sshd(root / "sshd")
    key = server.client_key(name)
    known = root / "known_hosts"
    known.write_text(server.host_key_line())
    server.start()
    return server, key, known

"""One job over several SSH hosts (``gputui run h1,h2 ...``): each host runs one part, rank 0's host the hub.

The client checks every host first and then starts one part per host, each an ordinary job of its host's agent
with a ``group`` (its rank, every host's name, the rendezvous) and the environment of the Slurm path:
MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES, WORLD_SIZE and GPUTUI_GROUP_JOB (with torchrun, gputui writes the
torchrun line instead). From then on the parts need no client, none of them:

- rank 0's runner starts the group's **hub**, a small detached process listening on ``hub_port`` of rank 0's
  host (the network the job's own rendezvous uses); every part's runner talks to it over TCP, one line of JSON
  each way, every message authenticated with the job's key (HMAC-SHA256; the key travels in the start request
  and rests only in the part's private job dir, ``group.key``, mode 0600);
- start is all or nothing: a part runs its command only once the hub has heard every rank ready; a rank that
  has not joined within ``START_S`` (its start failed, its host is gone) ends every part unstarted;
- a part that fails (exit not 0, killed) or goes silent for ``lost_s`` (its host rebooted, its link is gone)
  fails the job: the hub tells the others to stop, each stops its command (SIGTERM, SIGKILL after
  ``KILL_GRACE_S``) and records why; a part that cannot reach the hub for ``lost_s`` stops itself the same way.
  A survivor runs on at most ``lost_s + HEARTBEAT_S + KILL_GRACE_S`` after another part's host is lost, and
  about ``2 * HEARTBEAT_S + KILL_GRACE_S`` after another part failed;
- the hub exits once every part has ended, or ``lost_s`` after it decided to stop the job.

Stdlib only, Python 3.8+.
"""

import errno
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..fsutil import read_json, write_atomic

#: Seconds between a part's heartbeats.
HEARTBEAT_S = 2.0
#: A part silent this long (default) is lost; the client may ask for another (5 s to 10 min).
LOST_S = 30.0
#: Every rank must have joined within this after the hub started, else no part runs.
START_S = 120.0
#: Between SIGTERM and SIGKILL when a part is stopped because another failed.
KILL_GRACE_S = 10.0
#: The longest line either side sends; most ranks a group may have.
MAX_LINE, MAX_NODES = 4096, 256
KEY_FILE, HUB_LOG = "group.key", "group-hub.log"
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
ADDRESS = re.compile(r"^[A-Za-z0-9.:%_-]{1,255}$")  # a hostname, an IPv4 or IPv6 address
_KEY = re.compile(r"^[0-9a-f]{64}$")
#: The job's environment a group sets (the client refuses them in --env).
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "WORLD_SIZE", "GPUTUI_GROUP_JOB")
LAUNCHERS = ("torchrun",)


class GroupError(ValueError):
    """A group request the agent refuses (the message names the field)."""


# --- the request ------------------------------------------------------------------------------------------------
def check_request(req: Any) -> Dict[str, Any]:
    """A checked ``group`` of ``jobs.start`` (the key included); GroupError naming what is wrong."""
    if not isinstance(req, dict):
        raise GroupError("group must be an object")
    hosts = req.get("hosts")
    if (
        not isinstance(hosts, list)
        or not 2 <= len(hosts) <= MAX_NODES
        or not all(isinstance(h, str) and _HOST_NAME.match(h) for h in hosts)
    ):
        raise GroupError("group.hosts: 2 to %d host names" % MAX_NODES)
    out: Dict[str, Any] = {"hosts": list(hosts)}
    for name, low, high in (("rank", 0, len(hosts) - 1), ("nproc_per_node", 1, 1024), ("master_port", 1, 65535),
                            ("hub_port", 1, 65535)):
        value = req.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise GroupError("group.%s: a whole number from %d to %d" % (name, low, high))
        out[name] = value
    for name, pattern in (("id", _ID), ("master_addr", ADDRESS), ("key", _KEY)):
        value = req.get(name)
        if not isinstance(value, str) or not pattern.match(value):
            raise GroupError("group.%s: malformed" % name)
        out[name] = value
    lost = req.get("lost_s", LOST_S)
    if not isinstance(lost, (int, float)) or isinstance(lost, bool) or not 5.0 <= lost <= 600.0:
        raise GroupError("group.lost_s: seconds from 5 to 600")
    out["lost_s"] = float(lost)
    launcher = req.get("launcher")
    if launcher is not None and launcher not in LAUNCHERS:
        raise GroupError("group.launcher: one of %s" % ", ".join(LAUNCHERS))
    out["launcher"] = launcher
    return out


def keep(job_dir: str, group: Dict[str, Any]) -> Dict[str, Any]:
    """Write the group's key to the job dir (0600) and return what the record keeps: the group without it."""
    write_atomic(os.path.join(job_dir, KEY_FILE), group["key"].encode("ascii"))
    return {k: v for k, v in group.items() if k != "key"}


def key_of(job_dir: str) -> bytes:
    with open(os.path.join(job_dir, KEY_FILE), "rb") as f:
        return bytes.fromhex(f.read(200).decode("ascii").strip())


def env(group: Dict[str, Any]) -> Dict[str, str]:
    """The variables every part's command gets (the Slurm path's contract, plus the group's id)."""
    nodes = len(group["hosts"])
    return {"MASTER_ADDR": group["master_addr"], "MASTER_PORT": str(group["master_port"]),
            "NODE_RANK": str(group["rank"]), "NNODES": str(nodes),
            "WORLD_SIZE": str(nodes * group["nproc_per_node"]), "GPUTUI_GROUP_JOB": group["id"]}


def torchrun_line(nodes: int, rank: int, nproc: int, addr: str, port: int, command: List[str]) -> List[str]:
    """torchrun for one node (static rendezvous on addr:port, the first node); a command that is not a script
    (``python train.py``, a wrapper) runs with ``--no-python``. The Slurm path writes the same line."""
    argv = ["torchrun", "--nnodes=%d" % nodes, "--node_rank=%d" % rank, "--nproc_per_node=%d" % nproc,
            "--master_addr=" + addr, "--master_port=%d" % port]
    if not (command[0].endswith(".py") or command[0] == "-m"):
        argv.append("--no-python")
    return argv + list(command)


def run_argv(job: Dict[str, Any]) -> List[str]:
    """What a part's runner runs: the torchrun line, or the command itself."""
    group = job["group"]
    if group.get("launcher") == "torchrun":
        return torchrun_line(len(group["hosts"]), group["rank"], group["nproc_per_node"], group["master_addr"],
                             group["master_port"], job["argv"])
    return list(job["argv"])


# --- the client's check, on each host ---------------------------------------------------------------------------
def ssh_address() -> Optional[str]:
    """This host's address as the SSH client reached it (SSH_CONNECTION's server side); None when not over SSH."""
    words = os.environ.get("SSH_CONNECTION", "").split()
    return words[2] if len(words) == 4 and ADDRESS.match(words[2]) else None


def route_source(peer: str) -> Optional[str]:
    """The address this host sends from to reach ``peer`` (its routes decide; a UDP connect sends nothing)."""
    try:
        family = socket.AF_INET6 if ":" in peer else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.settimeout(2.0)
            s.connect((peer, 9))
            return str(s.getsockname()[0])
    except (OSError, ValueError):
        return None


def free_ports(count: int) -> List[int]:
    """``count`` distinct TCP ports free on this host now (each held until all are picked)."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket()
            held.append(s)
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def check_host(args: Dict[str, Any], gpu_count: int) -> Dict[str, Any]:
    """What the client checks on each host before any part starts: the command (or torchrun) and a script
    on the job's PATH and in its dir, the address, and on rank 0 the free ports and routes to the others."""
    path = args.get("path") if isinstance(args.get("path"), str) else os.environ.get("PATH", "")
    cwd = os.path.abspath(os.path.expanduser(str(args.get("cwd") or "~")))
    command = [str(a) for a in (args.get("argv") or [])][:2]
    problems = []
    if not os.path.isdir(cwd):
        problems.append("no directory %s" % cwd)
    elif command:
        launcher = args.get("launcher")
        program = "torchrun" if launcher == "torchrun" else command[0]
        if "/" in program:
            found = os.path.join(cwd, program) if os.access(os.path.join(cwd, program), os.X_OK) else None
        else:
            found = shutil.which(program, path=path)
        if found is None:
            where = "PATH" if "/" not in program else cwd
            problems.append("%s not found (on the job's %s: give --env PATH=... or install it)" % (program, where)
                            if program == "torchrun" else "%s not found in %s" % (program, where))
        script = command[0] if launcher == "torchrun" and command[0].endswith(".py") else None
        if script and not os.path.isfile(os.path.join(cwd, script)):
            problems.append("no %s in %s (sync the code to every host: --sync)" % (script, cwd))
    out: Dict[str, Any] = {"address": ssh_address(), "gpu_count": gpu_count, "problems": problems}
    if args.get("ports"):
        out["ports"] = free_ports(2)
        peers = [str(p) for p in (args.get("peers") or [])][:MAX_NODES]
        out["routes"] = {p: route_source(p) for p in peers if ADDRESS.match(p)}
    return out


# --- the wire: one authenticated line of JSON each way ----------------------------------------------------------
def _mac(key: bytes, message: Dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in message.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


def seal(key: bytes, message: Dict[str, Any]) -> bytes:
    return (json.dumps(dict(message, mac=_mac(key, message)), sort_keys=True) + "\n").encode("utf-8")


def opened(key: bytes, line: bytes, side: str) -> Optional[Dict[str, Any]]:
    """The message of ``line`` when it is one of ``side`` ("hub"/"part") sealed with ``key``; else None."""
    if len(line) > MAX_LINE:
        return None
    try:
        message = json.loads(line.decode("utf-8"))
    except ValueError:
        return None
    if (
        not isinstance(message, dict)
        or message.get("from") != side
        or not isinstance(message.get("mac"), str)
    ):
        return None
    return message if hmac.compare_digest(message["mac"], _mac(key, message)) else None


# --- the hub ----------------------------------------------------------------------------------------------------
def _ended_words(code: Any) -> str:
    if isinstance(code, int) and code > 128:
        return "was killed (exit %d)" % code
    return "failed (exit %s)" % code


def decide(parts: List[Dict[str, Any]], hosts: List[str], now: float, started: float, lost_s: float,
           start_s: float = START_S) -> Optional[str]:
    """Why the whole job must stop now, or None. ``parts[rank]``: ``seen`` (last word), ``state``
    (ready/running/ended) and ``code`` (its exit, once ended)."""
    for rank, part in enumerate(parts):
        if part.get("state") == "ended" and part.get("code") != 0:
            return "%s (rank %d) %s" % (hosts[rank], rank, _ended_words(part.get("code")))
    for rank, part in enumerate(parts):
        seen = part.get("seen")
        if seen is None and now - started > start_s:
            return "%s (rank %d) never joined (within %d s)" % (hosts[rank], rank, start_s)
        if seen is not None and part.get("state") != "ended" and now - seen > lost_s:
            return "%s (rank %d) lost: no word from it for %d s" % (hosts[rank], rank, lost_s)
    return None


class Hub:
    """The group's state on rank 0's host: who joined, who runs, who ended; the one decision to stop."""

    def __init__(self, group: Dict[str, Any], key: bytes, log: Callable[[str], None], attempt: int = 1) -> None:
        self.group, self.key, self.log, self.attempt = group, key, log, attempt
        self.hosts: List[str] = group["hosts"]
        self.parts: List[Dict[str, Any]] = [{"seen": None, "state": None, "code": None, "seq": -1}
                                            for _ in self.hosts]
        self.started = time.time()
        self.stop: Optional[str] = None
        self.stopped_at: Optional[float] = None
        self.lock = threading.Lock()

    def answer(self, message: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The hub's reply to one part's message (None: not one of this group's, or a replay)."""
        rank, seq, state = message.get("rank"), message.get("seq"), message.get("state")
        if (
            message.get("g") != self.group["id"]
            or not isinstance(rank, int)
            or not 0 <= rank < len(self.parts)
        ):
            return None
        if not isinstance(seq, int) or state not in ("ready", "running", "ended"):
            return None
        if message.get("attempt", 1) != self.attempt:  # (restart policies) this hub is for one attempt
            if isinstance(message.get("attempt"), int) and message["attempt"] > self.attempt:
                with self.lock:  # a part runs the next attempt: this one is over (its hub makes way)
                    if self.stop is None:
                        self.stop, self.stopped_at = "the job's next attempt started", time.time()
            return None
        with self.lock:
            part = self.parts[rank]
            if seq <= part["seq"]:
                return None  # a replayed (or stale) message
            part.update(seq=seq, seen=time.time())
            if part["state"] != "ended":
                part["state"] = state
                if state == "ended":
                    part["code"] = message.get("code")
                    self.log("%s (rank %d) ended: exit %s" % (self.hosts[rank], rank, part["code"]))
            self.tick()
            go = all(p["state"] is not None for p in self.parts)
            return {
                "from": "hub",
                "g": self.group["id"],
                "rank": rank,
                "seq": seq,
                "go": go,
                "stop": self.stop,
            }

    def tick(self) -> None:
        """Decide (under the lock) whether the job stops now."""
        if self.stop is None:
            self.stop = decide(self.parts, self.hosts, time.time(), self.started, self.group["lost_s"])
            if self.stop is not None:
                self.stopped_at = time.time()
                self.log("stopping every part: " + self.stop)

    def done(self) -> bool:
        with self.lock:
            self.tick()
            if all(p["state"] == "ended" for p in self.parts):
                return True
            if self.stopped_at is not None:
                return time.time() - self.stopped_at > self.group["lost_s"] + KILL_GRACE_S
            return False


def serve_hub(job_dir: str, attempt: int = 1) -> int:
    """``group-hub JOB_DIR ATTEMPT``: the hub of rank 0's part, until every part has ended (or was given up)."""
    with open(os.path.join(job_dir, HUB_LOG), "a", encoding="utf-8") as log_file:

        def log(line: str) -> None:
            log_file.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), line))
            log_file.flush()

        return _serve(job_dir, log, attempt)


def _serve(job_dir: str, log: Callable[[str], None], attempt: int) -> int:
    group = (read_json(os.path.join(job_dir, "job.json")) or {}).get("group") or {}
    try:
        hub = Hub(group, key_of(job_dir), log, attempt)
    except (OSError, KeyError, ValueError) as exc:
        log("cannot start: %s" % exc)
        return 1

    class Handler(socketserver.StreamRequestHandler):
        timeout = 5 * HEARTBEAT_S  # a part speaks every HEARTBEAT_S: an idle connection holds no thread long

        def handle(self) -> None:
            try:
                while True:
                    line = self.rfile.readline(MAX_LINE + 1)
                    if not line or len(line) > MAX_LINE:
                        return
                    message = opened(hub.key, line, "part")
                    reply = hub.answer(message) if message is not None else None
                    if reply is None:
                        return  # not one of ours: no answer at all
                    self.wfile.write(seal(hub.key, reply))
            except OSError:
                return

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

        def verify_request(self, request: Any, client_address: Any) -> bool:
            return threading.active_count() < 4 * len(hub.hosts) + 8  # bounded: a flood gets no thread

    server = None
    deadline = time.time() + START_S  # the last attempt's hub may hold the port a while yet
    while server is None and time.time() < deadline:
        for bind in (group["master_addr"], ""):  # the address the others reach (else every one: NAT)
            try:
                server = Server((bind, group["hub_port"]), Handler)
                break
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    time.sleep(0.5)
                    break
                log("cannot listen on %s:%d: %s" % (bind or "*", group["hub_port"], exc))
        else:
            return 1
    if server is None:
        log("cannot listen on port %d: in use for %d s" % (group["hub_port"], START_S))
        return 1
    log("listening on %s:%d for %d parts" % (server.server_address[0], group["hub_port"], len(hub.hosts)))
    threading.Thread(target=server.serve_forever, name="group-hub", daemon=True).start()
    while not hub.done():
        time.sleep(0.5)
    log("done: %s" % (hub.stop or "every part ended"))
    server.shutdown()
    return 0


def start_hub(job_dir: str, launcher: List[str], attempt: int) -> None:
    """Rank 0's runner starts the hub of its attempt, detached (a kill of the part's group never reaches it)."""
    subprocess.Popen(launcher + ["group-hub", job_dir, str(attempt)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


# --- a part -----------------------------------------------------------------------------------------------------
class Member:
    """A part's side: join (wait for every rank), heartbeat while the command runs, say how it ended."""

    def __init__(self, group: Dict[str, Any], key: bytes, attempt: int = 1) -> None:
        self.group, self.key, self.attempt = group, key, attempt
        self.rank: int = group["rank"]
        self.hub_host = group["hosts"][0]
        self.seq = int(time.time() * 1000)  # rises across a runner's restart too
        self.sock: Optional[socket.socket] = None
        self.buffer = b""

    def _close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock, self.buffer = None, b""

    def ask(self, state: str, code: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """One message and the hub's reply; None when the hub cannot be reached or answers wrongly."""
        self.seq += 1
        message = {"from": "part", "g": self.group["id"], "rank": self.rank, "seq": self.seq, "state": state,
                   "code": code, "attempt": self.attempt}
        try:
            if self.sock is None:
                self.sock = socket.create_connection(
                    (self.group["master_addr"], self.group["hub_port"]), timeout=5
                )
            self.sock.settimeout(5.0)
            self.sock.sendall(seal(self.key, message))
            while b"\n" not in self.buffer:
                data = self.sock.recv(MAX_LINE)
                if not data or len(self.buffer) > MAX_LINE:
                    raise OSError("the hub closed the connection")
                self.buffer += data
            line, _, self.buffer = self.buffer.partition(b"\n")
        except OSError:
            self._close()
            return None
        reply = opened(self.key, line, "hub")
        if reply is None or reply.get("seq") != self.seq or reply.get("rank") != self.rank:
            self._close()
            return None
        return reply

    def join(self, timeout: float = START_S) -> Optional[str]:
        """Wait until every rank is ready; None to go, else why this part must not run."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            reply = self.ask("ready")
            if reply is not None and reply.get("stop"):
                return str(reply["stop"])[:500]
            if reply is not None and reply.get("go"):
                return None
            time.sleep(0.5 if reply is not None else 1.0)
        return "the group's other parts did not all join within %d s (hub on %s)" % (timeout, self.hub_host)

    def watch(self, ended: threading.Event, stop: Callable[[str], None]) -> None:
        """Heartbeat until ``ended``; call ``stop`` once with the reason when this part must stop."""
        last_ok = time.time()
        while not ended.wait(HEARTBEAT_S):
            reply = self.ask("running")
            now = time.time()
            if reply is not None:
                last_ok = now
                if reply.get("stop"):
                    stop(str(reply["stop"])[:500])
                    return
            elif now - last_ok > self.group["lost_s"]:
                stop("lost the group's hub on %s (rank 0's host): no answer for %d s"
                     % (self.hub_host, self.group["lost_s"]))
                return

    def finish(self, code: Optional[int], timeout: float = 10.0) -> None:
        """Tell the hub how this part ended (tried for at most ``timeout``)."""
        deadline = time.time() + timeout
        while time.time() < deadline and self.ask("ended", code) is None:
            time.sleep(0.5)
        self._close()


def join(job_dir: str, group: Dict[str, Any], attempt: int, launcher: List[str]) -> "Tuple[Optional[Member], Optional[str]]":
    """A part's start: rank 0 starts this attempt's hub, then every part waits until all have joined.
    (its member, None) to run; (None, why) when it must not."""
    try:
        if group["rank"] == 0:
            start_hub(job_dir, launcher, attempt)
        member = Member(group, key_of(job_dir), attempt)
        why = member.join()
    except (OSError, ValueError, KeyError) as exc:
        return None, "the group's hub: %s" % exc
    return (member, None) if why is None else (None, why)


def stopper(send: Callable[[int], None], ended: threading.Event, on_stop: Callable[[str], None]) -> Callable[[str], None]:
    """What a part does when told to stop: note why, SIGTERM its command (``send``), SIGKILL after the grace
    unless it ``ended`` by then."""

    def stop(reason: str) -> None:
        on_stop(reason)
        send(signal.SIGTERM)
        if not ended.wait(KILL_GRACE_S):
            send(signal.SIGKILL)

    return stop

"""Jobs in container images (``gputui run HOST --image IMAGE``): the engine's ``run`` in place of the command.

The job's runner (remote_agent/jobs/runner.py) runs ``docker run`` (or Podman's, the same CLI) in the job's tmux
pane, so its log, attach, exit code (the container's), restarts, the queue and history stay a bare job's:

- the container is named ``gputui-<tag>-<job id>-<attempt>`` and labelled with the state dir's tag and the job's
  id: the agent finds its own (kill, a runner that died) and never touches a container it did not start;
- ``--init`` puts an init at PID 1 that passes signals on: ``kill`` sends SIGINT, SIGTERM, then SIGKILL to the
  container with the engine's ``kill --signal`` (the engine's CLI, on a terminal, proxies none);
- the job's dir is bind-mounted at the same path and is the workdir; the container runs as the login user, so
  what the job writes there is the user's; nothing else of the host is mounted unless asked (``--docker-arg``);
- the host's network and IPC namespace, as a bare job has them (PyTorch's DataLoader workers need more shared
  memory than an engine's default 64 MB);
- the GPUs the job was given go to the engine (``--gpus device=0,1``: inside they are numbered from 0), never as
  CUDA_VISIBLE_DEVICES; all of them when it was given none, none on a host without the NVIDIA driver;
- the container sees only the variables the job was given (``--env``, ``--secret``, GPUTUI_*), never the host's.

``--build [DOCKERFILE]`` (``build`` in the request) builds the image on the host from the job's dir first, in the
job's pane (``image-run``: the build's output is the start of the job's log, a failed build is the job's exit),
tagged ``gputui-build/<tag>:<tree hash>``: an unchanged tree is not built again.

Stdlib only, Python 3.8+.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from typing import Any, Dict, List, Optional

from ..fsutil import read_json, write_json
from . import group as job_group

ENGINES = ("docker", "podman")
#: Most extra engine options a job may carry, and the longest one.
MAX_ARGS, MAX_ARG = 64, 4096
MAX_IMAGE = 512
#: An image reference: registry/name:tag@digest or an image ID; never an option, a space or a shell character.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_IMAGE_ID = re.compile(r"(sha256:)?[0-9a-f]{12,64}")  # Docker's ``sha256:<hex>``, Podman's bare hex
#: Options that would break what gputui promises about the container (its name, that the runner waits on it,
#: its GPUs); the GPUs are asked with gputui's own --gpus.
_OURS = {"--name", "-d", "--detach", "--gpus", "--cidfile", "-a", "--attach", "--rm", "--init", "--label", "-l"}
#: How long an engine command may take (a busy daemon answers ``info`` in well under a second).
ENGINE_TIMEOUT_S = 20.0
#: Variables the container gets besides the job's own (when the runner has them).
_PASSED = ("PYTHONUNBUFFERED", "TERM", "GPUTUI_ATTEMPT", "GPUTUI_RESUME_FROM")
FILE = "container.json"  # the job's container: name, ID, resolved image ID (written by the runner)
BUILT = "gputui-build"  # the repository of images built with --build (tagged <state tag>-<tree hash>)
#: Most entries of a build context hashed to tag its image; a bigger tree is built every time.
MAX_CONTEXT_FILES = 200000
_NVIDIA_DRIVER = "/dev/nvidiactl"
_CDI_SPECS = ("/etc/cdi", "/var/run/cdi")


class ImageError(ValueError):
    """A container request that cannot run: the message says what to change or install."""


def check_request(request: Any) -> Dict[str, Any]:
    """A start request's ``container`` ({image, args, engine}), checked: ImageError saying what is wrong."""
    if not isinstance(request, dict):
        raise ImageError("container must be an object with an image")
    build = request.get("build")
    if build is not None:
        return dict(check_request(dict(request, build=None, image=BUILT)), build=_check_build(build))
    image = request.get("image")
    if not isinstance(image, str) or not image or len(image) > MAX_IMAGE or not _IMAGE.fullmatch(image):
        raise ImageError("image %r: expected a name like pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime or an image "
                         "ID (letters, digits and ._/:@+-, not starting with -)" % str(image)[:100])
    args = request.get("args") or []
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        raise ImageError("engine options must be a list of at most %d strings" % MAX_ARGS)
    for arg in args:
        check_arg(arg)
    engine = request.get("engine") or "auto"
    if engine not in ("auto",) + ENGINES:
        raise ImageError("container engine %r: use auto, docker or podman" % str(engine)[:40])
    return {"image": image, "args": list(args), "engine": engine}


def _check_build(build: Any) -> Dict[str, str]:
    """``build``: {dockerfile}: a path inside the job's dir (the build context)."""
    dockerfile = build.get("dockerfile") if isinstance(build, dict) else None
    if not isinstance(dockerfile, str) or not dockerfile or len(dockerfile) > MAX_ARG or "\x00" in dockerfile:
        raise ImageError("build: expected the Dockerfile's path inside the job's dir")
    parts = dockerfile.replace("\\", "/").split("/")
    if dockerfile.startswith(("/", "~")) or ".." in parts:
        raise ImageError("Dockerfile %r is outside the job's dir (the build context): give a path inside it, "
                         "e.g. Dockerfile or docker/train.Dockerfile" % dockerfile[:200])
    return {"dockerfile": os.path.normpath(dockerfile)}


def check_arg(arg: Any) -> None:
    """One ``--docker-arg``: a single option, its value joined with ``=``; never one of gputui's own."""
    if not isinstance(arg, str) or not arg or len(arg) > MAX_ARG or "\x00" in arg or "\n" in arg:
        raise ImageError("engine option %r: expected one option of at most %d characters" % (str(arg)[:100], MAX_ARG))
    name = arg.split("=", 1)[0]
    if not arg.startswith("-") or name in ("-", "--"):
        raise ImageError("engine option %r: give each option with its value joined by =, e.g. --docker-arg="
                         "--volume=/data:/data (a word on its own would be read as the image)" % arg[:100])
    if not name.startswith("--") and len(name) != 2:
        raise ImageError("engine option %r: one short option per --docker-arg (-v=/data:/data), or its long "
                         "name" % arg[:100])
    if name in _OURS:
        raise ImageError("engine option %s is gputui's own: it names, labels and waits on the container (for GPUs "
                         "use gputui's --gpus)" % name)


def find_engine(choice: str) -> str:
    """The engine's path: ``docker``, else ``podman`` for ``auto``; ImageError naming what to install."""
    for name in ENGINES if choice == "auto" else (choice,):
        path = shutil.which(name)
        if path:
            return path
    want = "Docker or Podman" if choice == "auto" else choice
    raise ImageError("no %s on the host: install it (e.g. apt install docker.io, or podman) to run jobs in images, "
                     "or run without --image" % want)


def _engine(path: str, *args: str, timeout: float = ENGINE_TIMEOUT_S) -> "subprocess.CompletedProcess[str]":
    try:
        return subprocess.run([path, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, universal_newlines=True,
                              errors="replace")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([path, *args], 124, "", "no answer in %.0f s" % timeout)
    except OSError as exc:
        return subprocess.CompletedProcess([path, *args], 127, "", exc.strerror or str(exc))


def engine_info(path: str) -> Dict[str, Any]:
    """``info`` of the engine as a dict; ImageError when the engine does not answer (daemon down, no access)."""
    done = _engine(path, "info", "--format", "{{json .}}")
    if done.returncode != 0:
        err = " ".join(done.stderr.split())[:300] or "exit %d" % done.returncode
        fix = ("" if "permission denied" not in err.lower() else
               ": add the login user to the docker group (sudo usermod -aG docker $USER, then log in again)")
        raise ImageError("%s cannot be used: %s%s" % (os.path.basename(path), err, fix))
    try:
        info = json.loads(done.stdout)
    except ValueError:
        info = None
    return info if isinstance(info, dict) else {}


def nvidia_ready(info: Dict[str, Any], cdi_dirs: "tuple[str, ...]" = _CDI_SPECS) -> bool:
    """Whether the engine can give a container NVIDIA GPUs: an ``nvidia`` runtime registered (the NVIDIA
    Container Toolkit), its hook on PATH (what Docker's ``--gpus`` calls), or a CDI spec for nvidia.com/gpu."""
    runtimes = info.get("Runtimes")
    if isinstance(runtimes, dict) and "nvidia" in runtimes:
        return True
    if shutil.which("nvidia-container-runtime-hook") or shutil.which("nvidia-container-toolkit"):
        return True
    for folder in cdi_dirs:
        try:
            if any(n.startswith("nvidia") for n in os.listdir(folder)):
                return True
        except OSError:
            continue
    return False


def host_has_gpus() -> bool:
    """Whether the NVIDIA driver is loaded (its control device exists)."""
    return os.path.exists(_NVIDIA_DRIVER)


def prepare(request: Dict[str, Any], gpus: Optional[str], state_dir: str) -> Dict[str, Any]:
    """A checked request made ready to run: the engine found and answering, GPUs possible when the job wants
    them; the ``container`` field of job.json. ``gpus``: the job's selection (None: all the host has)."""
    path = find_engine(request["engine"])
    info = engine_info(path)
    wants = gpus not in (None, "none", "") or (gpus is None and host_has_gpus())
    if wants and not nvidia_ready(info):
        raise ImageError("%s on this host cannot give a container GPUs (no NVIDIA runtime or CDI spec): install "
                         "the NVIDIA Container Toolkit (https://docs.nvidia.com/datacenter/cloud-native/container-"
                         "toolkit/latest/install-guide.html), or run with --gpus none" % os.path.basename(path))
    return dict(request, engine_path=path, tag=state_tag(state_dir))


def state_tag(state_dir: str) -> str:
    """A short tag of the agent's state dir: containers of two users' (or two configs') agents never clash."""
    return hashlib.sha256(os.path.realpath(state_dir).encode("utf-8", "surrogateescape")).hexdigest()[:10]


def container_name(spec: Dict[str, Any], job_id: str, attempt: int) -> str:
    return "gputui-%s-%s-%d" % (spec["tag"], job_id, attempt)


def gpu_args(engine_name: str, visible: Optional[str]) -> List[str]:
    """Engine options giving the container the GPUs of CUDA_VISIBLE_DEVICES ``visible`` (None: all of them)."""
    if visible is None:
        if not host_has_gpus():
            return []
        visible = "all"
    ids = [g.strip() for g in visible.split(",") if g.strip()]
    if not ids or visible.strip() == "none":
        return []
    if engine_name == "podman":  # Podman gives GPUs by CDI device names
        out: List[str] = []
        for g in ids:
            out += ["--device", "nvidia.com/gpu=%s" % g]
        return out
    # Docker reads --gpus as CSV: a list of devices is one quoted field.
    return ["--gpus", "all" if ids == ["all"] else '"device=%s"' % ",".join(ids)]


def run_argv(job: Dict[str, Any], job_id: str, attempt: int, env: Dict[str, str]) -> List[str]:
    """The engine command the runner starts for this attempt of an image job (``env``: the runner's)."""
    spec = job["container"]
    cwd = job["cwd"]
    name = container_name(spec, job_id, attempt)
    argv = [spec["engine_path"], "run", "--rm", "-i", "-t", "--init", "--name", name,
            "--label", "gputui.state=%s" % spec["tag"], "--label", "gputui.job=%s" % job_id,
            "--network", "host", "--ipc", "host", "--user", "%d:%d" % (os.getuid(), os.getgid()),
            "--mount", "type=bind,source=%s,target=%s" % (cwd, cwd), "--workdir", cwd]
    engine_name = "podman" if os.path.basename(spec["engine_path"]).startswith("podman") else "docker"
    argv += gpu_args(engine_name, env.get("CUDA_VISIBLE_DEVICES"))
    passed = _PASSED + job_group.ENV_NAMES if job.get("group") else _PASSED  # a part of a job over several hosts
    names = list(job.get("env") or {}) + list(job.get("secrets") or []) + [n for n in passed if n in env]
    for var in dict.fromkeys(names):  # the value travels in the engine's environment, never on its command line
        argv += ["--env", var]
    command = job_group.run_argv(job) if job.get("group") else list(job["argv"])  # torchrun's line, in the image
    return argv + list(spec.get("args") or []) + ["--", spec["image"]] + command


def dir_problem(spec: Dict[str, Any], cwd: str) -> Optional[str]:
    """Why the job's dir cannot serve the job (bind mount, build context), or None."""
    bad = [c for c in (",", '"', "\n") if c in cwd]
    if bad:  # --mount reads its value as CSV
        return "the job's dir %r holds %r, which the engine's --mount cannot take: use another --cwd" % (cwd, bad[0])
    build = spec.get("build")
    if build:
        path = os.path.realpath(os.path.join(cwd, build["dockerfile"]))
        if os.path.commonpath([path, os.path.realpath(cwd)]) != os.path.realpath(cwd):
            return "Dockerfile %s leads outside the job's dir %s (a link)" % (build["dockerfile"], cwd)
        if not os.path.isfile(path):
            return "no Dockerfile %s in the job's dir %s on the host (sync it with --sync)" % (build["dockerfile"], cwd)
    return None


_GLOB = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}  # .dockerignore's wildcards as regexes


def dockerignore(cwd: str) -> "List[re.Pattern[str]]":
    """The build context's .dockerignore patterns as regexes of relative paths (``*`` within one name, ``**``
    across names, as the engine reads them). None are used when one re-includes (``!``): then every file counts,
    so a file the build uses is never left out of the tree's hash."""
    try:
        with open(os.path.join(cwd, ".dockerignore"), "rb") as f:
            lines = f.read(1 << 20).decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    patterns = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if any(p.startswith("!") for p in patterns):
        return []
    out = []
    for pattern in patterns:
        pattern = os.path.normpath(pattern).lstrip("/")
        parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern)
        regex = "".join(_GLOB.get(part, re.escape(part)) for part in parts)
        out.append(re.compile(regex + "(/.*)?"))
    return out


def context_hash(cwd: str, dockerfile: str) -> Optional[str]:
    """A hash of the build context's tree (each entry's path, type, size, mode and mtime; what .dockerignore
    leaves out is left out) and the Dockerfile's name: the same for an unchanged tree; None for a tree of over
    MAX_CONTEXT_FILES entries (then always built)."""
    digest = hashlib.sha256(dockerfile.encode("utf-8", "surrogateescape"))
    ignored = dockerignore(cwd)
    count = 0
    for top, dirs, files in os.walk(cwd):
        dirs.sort()
        for name in sorted(files) + dirs:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, cwd)
            if any(p.fullmatch(rel) for p in ignored):
                if name in dirs:
                    dirs.remove(name)
                continue
            count += 1
            if count > MAX_CONTEXT_FILES:
                return None
            try:
                st = os.lstat(path)
            except OSError:
                continue
            digest.update(b"%s\0%d %d %d\n" % (rel.encode("utf-8", "surrogateescape"), st.st_mode, st.st_size,
                                                st.st_mtime_ns))
    return digest.hexdigest()[:16]


def build_and_run(job_dir: str, attempt: int) -> int:
    """``image-run``, the job's process in its pane for ``--build``: build the image unless this tree's is there,
    then become the engine's run. The build's output is the job's log; its failure is the job's exit."""
    with open(os.path.join(job_dir, "job.json"), "rb") as f:
        job = json.loads(f.read().decode("utf-8"))
    spec, cwd = job["container"], job["cwd"]
    dockerfile = spec["build"]["dockerfile"]
    tree = context_hash(cwd, dockerfile)
    tag = "%s:%s-%s" % (BUILT, spec["tag"], tree or "big-tree")
    engine = spec["engine_path"]
    name = os.path.basename(engine)
    if tree is not None and _engine(engine, "image", "inspect", "--format", "{{.Id}}", tag).returncode == 0:
        print("gputui: image %s is up to date (the tree is unchanged): not built again" % tag, flush=True)
    else:
        print("gputui: building image %s from %s in %s" % (tag, dockerfile, cwd), flush=True)
        code = subprocess.call([engine, "build", "--network", "host", "--file", os.path.join(cwd, dockerfile),
                                "--tag", tag, "--label", "gputui.state=%s" % spec["tag"], cwd])
        if code != 0:
            print("gputui: the image build failed (%s build exited %d): the job did not start" % (name, code),
                  flush=True)
            return code
    spec = dict(spec, image=tag)
    job_id = os.path.basename(job_dir)
    _note(job_dir, {"name": container_name(spec, job_id, attempt), "image": tag,
                    "image_id": _image_id(engine, "image", "inspect", "--format", "{{.Id}}", tag)})
    argv = run_argv(dict(job, container=spec), job_id, attempt, dict(os.environ))
    os.execvp(argv[0], argv)
    return 127  # (not reached)


def record_image(job_dir: str, spec: Dict[str, Any], name: str, stopped: "threading.Event") -> threading.Thread:
    """Write container.json with the container's name now, and its image ID once the container exists (an image
    may take long to pull): asked every second until ``stopped`` is set, at most an hour."""
    write_json(os.path.join(job_dir, FILE), {"name": name, "image_id": None})

    def watch() -> None:
        for _ in range(3600):
            done = _engine(spec["engine_path"], "inspect", "--type", "container", "--format", "{{.Id}} {{.Image}}", name)
            ids = done.stdout.split()
            if done.returncode == 0 and len(ids) == 2 and _IMAGE_ID.fullmatch(ids[1]):
                _note(job_dir, {"id": ids[0], "image_id": ids[1]})  # the ID names its processes' cgroups
                return
            if stopped.wait(1.0):  # gone before it was seen (a job of a second): the image as tagged now
                image_id = _image_id(spec["engine_path"], "image", "inspect", "--format", "{{.Id}}", spec["image"])
                if image_id is not None:
                    _note(job_dir, {"image_id": image_id})
                return

    thread = threading.Thread(target=watch, name="image-id", daemon=True)
    thread.start()
    return thread


def _image_id(engine: str, *args: str) -> Optional[str]:
    """The image ID an engine's ``inspect`` prints, or None."""
    done = _engine(engine, *args)
    image_id = done.stdout.strip()
    return image_id if done.returncode == 0 and _IMAGE_ID.fullmatch(image_id) else None


def _note(job_dir: str, facts: Dict[str, Any]) -> None:
    """Add ``facts`` to container.json."""
    known = read_json(os.path.join(job_dir, FILE))
    write_json(os.path.join(job_dir, FILE), dict(known if isinstance(known, dict) else {}, **facts))


def running_name(job_dir: str) -> Optional[str]:
    """The name of the job's current container (from container.json), or None."""
    info = read_json(os.path.join(job_dir, FILE))
    name = info.get("name") if isinstance(info, dict) else None
    return name if isinstance(name, str) and name.startswith("gputui-") else None


def is_ours(spec: Dict[str, Any], name: str, job_id: str) -> bool:
    """Whether container ``name`` exists and carries this agent's and this job's labels."""
    done = _engine(spec["engine_path"], "ps", "-a", "--filter", "label=gputui.state=%s" % spec["tag"],
                   "--filter", "label=gputui.job=%s" % job_id, "--format", "{{.Names}}")
    return done.returncode == 0 and name in done.stdout.split()


def send_signal(spec: Dict[str, Any], name: str, job_id: str, signame: str) -> bool:
    """Send SIGINT/SIGTERM/SIGKILL (``signame``: INT, TERM, KILL) to the job's container; whether it was sent."""
    if not is_ours(spec, name, job_id):
        return False
    return _engine(spec["engine_path"], "kill", "--signal", signame, name).returncode == 0


def end(spec: Dict[str, Any], name: str, job_id: str) -> bool:
    """End and remove the job's container (its runner is gone); whether there was one of ours to end."""
    if not is_ours(spec, name, job_id):
        return False
    _engine(spec["engine_path"], "rm", "--force", name, timeout=60.0)
    return True

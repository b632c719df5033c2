"""Jobs in container images (``gputui run --image``; remote_agent/jobs/image.py) against a real Docker engine.

The engine is Debian's dockerd on its own socket (tests/docker_engine.py); the agent is deployed over the real
sshd, whose sessions get DOCKER_HOST. Each job runs in the busybox test image made on the machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SshHome, stop_host, wait_for
from docker_engine import IMAGE, DockerEngine, docker_available
from sshd import Sshd

from remote_agent.fsutil import read_json
from remote_agent.host.container import Owners
from remote_agent.jobs import image as agent_image
from remote_agent.jobs.store import running_jobs


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    why = docker_available()
    if why:
        pytest.skip(why)
    e = DockerEngine(tmp_path_factory.mktemp("docker"))
    try:
        yield e.start()
    finally:
        e.stop()


@pytest.fixture(scope="module")
def docker_sshd(tmp_path_factory: pytest.TempPathFactory, engine: DockerEngine) -> Iterator[Sshd]:
    server = Sshd(tmp_path_factory.mktemp("sshd-docker"))
    server.client_key("ok", env={"DOCKER_HOST": engine.host})
    server.start()
    yield server
    server.stop()


class Box(SshHome):
    """Host ``box`` over the sshd whose sessions reach the test engine; ``work``: a job dir on the host."""

    def __init__(self, root: Path, server: Sshd, engine: DockerEngine) -> None:
        super().__init__(root, server)
        self.engine = engine
        self.work = root.parent / "work"
        self.work.mkdir()

    def run(self, *args: str, check: bool = True) -> str:
        res = self.cli("run", "box", "--cwd", str(self.work), *args, check=check)
        return res.stdout.strip() if check else res.stderr

    def job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in json.loads(self.cli("jobs", "box", "--json", check=True).stdout) if j["id"] == job_id)

    def tag(self) -> str:
        return agent_image.state_tag(str(self.remote_dir))

    def ours(self) -> list[str]:
        return self.engine.containers(f"label=gputui.state={self.tag()}")


@pytest.fixture
def box(tmp_path: Path, docker_sshd: Sshd, engine: DockerEngine) -> Iterator[Box]:
    h = Box(tmp_path / "home", docker_sshd, engine)
    yield h
    stop_host(h.remote_dir)
    left = h.ours()
    if left:
        engine.docker("rm", "--force", *left, check=False)


def test_a_job_in_an_image_runs_in_its_dir_as_the_user_with_only_its_own_variables(box: Box) -> None:
    job = box.run("--image", IMAGE, "--env", "LR=3e-4", "--", "sh", "-c",
                  'echo "in $(pwd) as $(id -u):$(id -g)"; touch made-here; env; exit 3')
    done = box.cli("logs", "box", job, "--follow", timeout=60)
    assert done.returncode == 3, done.stderr  # the container's exit code is the job's
    assert f"in {box.work} as {os.getuid()}:{os.getgid()}" in done.stdout
    assert "LR=3e-4" in done.stdout and "PYTHONUNBUFFERED=1" in done.stdout
    assert "SSH_CONNECTION" not in done.stdout and str(box.sshd.remote_home) not in done.stdout  # not the host's
    made = box.work / "made-here"
    assert made.exists() and made.stat().st_uid == os.getuid()
    record = box.job(job)
    assert record["state"] == "failed" and record["exit_code"] == 3
    image_id = box.engine.docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    assert record["image"] == {"image": IMAGE, "id": image_id}
    history = json.loads(box.cli("history", "box", "--json", check=True).stdout)
    assert next(r for r in history if r["id"] == job)["image"] == {"image": IMAGE, "id": image_id}
    assert box.ours() == []  # --rm: nothing of the job is left in the engine


def test_kill_reaches_a_process_that_ignores_sigint_inside_the_container(box: Box) -> None:
    job = box.run("--image", IMAGE, "--", "sh", "-c", 'trap "" INT; echo ready; while true; do sleep 1; done')
    wait_for(lambda: "ready" in box.cli("logs", "box", job).stdout, timeout=60, what="the job to start")
    name = f"gputui-{box.tag()}-{job}-1"
    assert box.ours() == [name]
    # its processes descend from the engine, not the job: they are the job's by their container's cgroup
    inside = int(box.engine.docker("inspect", "--format", "{{.State.Pid}}", name).stdout)
    wait_for(lambda: (read_json(str(box.remote_job_dir(job) / agent_image.FILE)) or {}).get("id"), what="the container's id")
    owners = Owners(running_jobs(str(box.remote_dir / "jobs")))
    assert owners(inside) == job and owners(os.getpid()) is None
    killed = box.cli("kill", "box", job, "--grace", "1", "--yes", check=True, timeout=60)
    assert "killed (exit 143)" in killed.stdout  # SIGINT ignored, SIGTERM ended it
    assert box.ours() == []


def test_a_failed_attempt_restarts_in_a_fresh_container(box: Box) -> None:
    box.configure(restart_backoff_s=0)
    job = box.run("--image", IMAGE, "--restart", "on-failure:2", "--", "sh", "-c",
                  'echo "attempt $GPUTUI_ATTEMPT"; test -e once || { touch once; exit 7; }')
    done = box.cli("logs", "box", job, "--follow", timeout=90)
    assert done.returncode == 0, done.stderr
    assert "attempt 1" in done.stdout and "attempt 2" in done.stdout
    record = box.job(job)
    assert [a["exit_code"] for a in record["attempts"]] == [7]


def test_a_queued_image_job_starts_after_the_job_it_waits_for(box: Box) -> None:
    first = box.run("--image", IMAGE, "--", "sh", "-c", "sleep 2; echo first done")
    second = box.run("--image", IMAGE, "--queue", "--after", first, "--", "sh", "-c", "echo second ran")
    done = box.cli("logs", "box", second, "--follow", timeout=90)
    assert done.returncode == 0 and "second ran" in done.stdout
    assert box.job(first)["ended_at"] <= box.job(second)["started_at"]


def test_a_container_whose_runner_died_is_ended_and_a_foreign_one_is_never_touched(box: Box) -> None:
    foreign = f"gputui-{box.tag()}-99-1"  # our name pattern, not our labels: someone else's
    box.engine.docker("run", "--detach", "--network", "none", "--name", foreign, "--label", "gputui.job=1", IMAGE,
                      "sleep", "600")
    job = box.run("--image", IMAGE, "--", "sh", "-c", 'trap "" HUP; echo ready; sleep 600')  # outlives its tty
    wait_for(lambda: "ready" in box.cli("logs", "box", job).stdout, timeout=60, what="the job to start")
    name = f"gputui-{box.tag()}-{job}-1"
    runner = read_json(str(box.remote_job_dir(job) / "pid.json"))["runner_pid"]
    os.kill(runner, signal.SIGKILL)  # the container runs on, unwatched, holding its GPUs
    assert box.engine.containers(f"name={name}", "status=running") == [name]
    wait_for(lambda: box.job(job)["state"] == "lost", timeout=30, what="the job to be lost")
    wait_for(lambda: name not in box.engine.containers(f"name={name}"), timeout=60, what="its container to end")
    assert box.engine.containers(f"name={foreign}") == [foreign]  # never ours to end
    marker = box.remote_job_dir(job) / "container-ended.json"
    wait_for(marker.exists, timeout=30, what="the end to be on record")
    (box.remote_job_dir(job) / agent_image.FILE).write_text(json.dumps({"name": foreign}))  # a record naming another's
    marker.unlink()
    box.job(job)  # the lost job is looked at again: its "container" is the foreign one now
    wait_for(marker.exists, timeout=30, what="the agent to have tried")
    assert box.engine.containers(f"name={foreign}") == [foreign]
    box.engine.docker("rm", "--force", foreign)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--image=-v=/:/host"], "not starting with -"),
        (["--image", "ubuntu; rm -rf /"], "expected a name like"),
        (["--image", IMAGE, "--docker-arg=--name=mine"], "gputui's own"),
        (["--image", IMAGE, "--docker-arg=--gpus=all"], "gputui's --gpus"),
        (["--image", IMAGE, "--docker-arg", "/data:/data"], "joined by ="),
        (["--image", IMAGE, "--docker-arg=-itd"], "one short option"),
        (["--docker-arg=--shm-size=8g"], "needs --image"),
    ],
)
def test_bad_image_requests_are_refused_before_connecting(box: Box, args: list[str], says: str) -> None:
    box.configure(port=1)  # nothing listens: a refusal that connected first would say so instead
    err = box.run(*args, "--", "true", check=False)
    assert says in err and "connect" not in err.lower()


def test_gpus_on_an_engine_without_the_nvidia_runtime_are_refused_with_the_fix(box: Box) -> None:
    err = box.run("--image", IMAGE, "--gpus", "all", "--", "true", check=False)
    assert "cannot give a container GPUs" in err and "NVIDIA Container Toolkit" in err
    assert not (box.remote_dir / "jobs" / "1").exists()  # nothing half-started


def test_a_host_without_the_engine_asked_for_says_what_to_install(box: Box) -> None:
    box.configure(container_engine="podman")
    err = box.run("--image", IMAGE, "--", "true", check=False)
    assert "no podman on the host: install it" in err


def test_gpu_selection_goes_to_the_engine_renumbered_never_as_cuda_visible_devices() -> None:
    assert agent_image.gpu_args("docker", "0,2") == ["--gpus", '"device=0,2"']  # one CSV field: the quotes are Docker's
    assert agent_image.gpu_args("docker", "all") == ["--gpus", "all"]
    assert agent_image.gpu_args("docker", "") == [] and agent_image.gpu_args("docker", "none") == []
    assert agent_image.gpu_args("podman", "1") == ["--device", "nvidia.com/gpu=1"]
    argv = agent_image.run_argv(
        {"container": {"engine_path": "/usr/bin/docker", "tag": "t", "image": "img",
                       "args": ["--shm-size=8g"]}, "cwd": "/w", "argv": ["python", "-c", "x"], "env": {"A": "1"}},
        "5", 2, {"CUDA_VISIBLE_DEVICES": "3", "A": "1", "GPUTUI_ATTEMPT": "2", "HOME": "/root"},
    )
    assert argv[argv.index("--gpus") + 1] == '"device=3"'
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
    assert envs == ["A", "GPUTUI_ATTEMPT"]  # names only: values travel in the engine's environment
    assert argv[argv.index("--name") + 1] == "gputui-t-5-2"
    assert argv[-6:] == ["--shm-size=8g", "--", "img", "python", "-c", "x"]


def test_the_nvidia_runtime_is_found_as_the_toolkit_registers_it(tmp_path: Path) -> None:
    """``nvidia-ctk runtime configure`` adds ``runtimes.nvidia`` to daemon.json; ``docker info`` lists it under
    Runtimes (the Docker Engine API's SystemInfo). CDI: nvidia-ctk cdi generate writes /etc/cdi/nvidia.yaml."""
    info = {"Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "nvidia": {"path": "nvidia-container-runtime"}}}
    assert agent_image.nvidia_ready(info, cdi_dirs=())
    assert not agent_image.nvidia_ready({"Runtimes": {"runc": {"path": "runc"}}}, cdi_dirs=(str(tmp_path),))
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    assert agent_image.nvidia_ready({"Runtimes": {"runc": {"path": "runc"}}}, cdi_dirs=(str(tmp_path),))


def _project(root: Path, dockerfile: str) -> Path:
    """A local project to --sync: a Dockerfile on the test image and the job's script."""
    root.mkdir()
    (root / "Dockerfile").write_text(dockerfile)
    (root / "train.sh").write_text('echo "trained with $(cat /built.txt)"\nmkdir -p runs; echo 1 > runs/model.pt\n')
    (root / ".dockerignore").write_text("runs/\n")
    return root


def test_build_makes_the_image_once_per_tree_and_its_output_is_the_log(box: Box, tmp_path: Path) -> None:
    project = _project(tmp_path / "project", f"FROM {IMAGE}\nRUN echo built-v1 > /built.txt\n")

    def run() -> tuple[str, str]:
        job = box.cli("run", "box", "--sync", str(project), "--build", "--", "sh", "train.sh", check=True).stdout.strip()
        done = box.cli("logs", "box", job, "--follow", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return job, done.stdout

    job, log = run()
    assert "gputui: building image gputui-build:" in log and "trained with built-v1" in log
    record = box.job(job)
    built = record["image"]["image"]
    assert built.startswith(f"gputui-build:{box.tag()}-")
    assert record["image"]["id"] == box.engine.docker("image", "inspect", "--format", "{{.Id}}", built).stdout.strip()
    _, log = run()  # the job wrote runs/ (ignored): the same tree
    assert "is up to date (the tree is unchanged): not built again" in log and "trained with built-v1" in log
    (project / "Dockerfile").write_text(f"FROM {IMAGE}\nRUN echo built-v2 > /built.txt\n")
    _, log = run()
    assert "gputui: building image" in log and "trained with built-v2" in log


def test_a_failed_build_fails_the_job_with_the_builds_own_error(box: Box, tmp_path: Path) -> None:
    project = _project(tmp_path / "project", f"FROM {IMAGE}\nRUN echo no-such-step >&2 && false\n")
    job = box.cli("run", "box", "--sync", str(project), "--build", "--", "sh", "train.sh", check=True).stdout.strip()
    done = box.cli("logs", "box", job, "--follow", timeout=120)
    assert done.returncode != 0
    assert "no-such-step" in done.stdout and "the image build failed" in done.stdout
    assert "trained" not in done.stdout and box.job(job)["state"] == "failed"


def test_a_dockerfile_outside_the_tree_or_missing_is_refused(box: Box, tmp_path: Path) -> None:
    project = _project(tmp_path / "project", f"FROM {IMAGE}\n")
    err = box.cli("run", "box", "--sync", str(project), "--build", "../Dockerfile", "--", "true").stderr
    assert "outside the job's dir" in err
    err = box.cli("run", "box", "--sync", str(project), "--build", "docker/Dockerfile", "--", "true").stderr
    assert "no Dockerfile docker/Dockerfile in the job's dir" in err
    err = box.cli("run", "box", "--build", "--", "true").stderr
    assert "give --sync (this dir) or --cwd DIR" in err


def test_the_apps_job_row_names_the_image_as_plain_text() -> None:
    from gputui.core.session import model as M
    from gputui.ui.palette import Palette
    from gputui.ui.widgets.host import job_row

    wire = {"id": "3", "name": "train", "state": "running", "argv": ["python", "train.py"],
            "container": {"image": "reg.example/[bold]x[/]:1\x1b[31m"}, "image_id": None}
    row = job_row(M.Job.from_wire("gpu", wire), None, 0.0, Palette())  # type: ignore[arg-type]
    assert row[1].plain.startswith("train · in reg.example/[bold]x[/]:1") and "\x1b" not in row[1].plain


def test_the_mnist_example_trains_in_a_built_image_and_is_killed_like_a_bare_job(box: Box) -> None:
    """run --build with the shipped example: the image built on the host, the log's epochs, DataLoader workers
    (shared memory: the host's IPC), the run's files the user's; then a run killed mid-epoch saves and stops."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from test_train_mnist import EXAMPLES, _load

    image, mounts = box.engine.host_python()
    (box.work / "train_mnist.py").write_bytes((EXAMPLES / "train_mnist.py").read_bytes())
    (box.work / ".dockerignore").write_bytes((EXAMPLES / ".dockerignore").read_bytes())
    (box.work / "Dockerfile").write_text(f"FROM {image}\n")  # examples/Dockerfile's role, on the offline base
    _load("mnist_from_digits").build(box.work / "data")
    python = str(Path(sys.prefix) / "bin" / "python")
    args = ["--build", *[f"--docker-arg={m}" for m in mounts], "--", python, "train_mnist.py", "--data-dir", "data",
            "--device", "cpu", "--batch-size", "32", "--workers", "2"]
    job = box.run(*args, "--epochs", "2", "--out", "runs/a")
    done = box.cli("logs", "box", job, "--follow", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "gputui: building image" in done.stdout and re.search(r"Epoch 2/2 .*test_acc=0\.[5-9]", done.stdout)
    summary = json.loads((box.work / "runs" / "a" / "summary.json").read_text())
    assert summary["status"] == "completed" and (box.work / "runs" / "a").stat().st_uid == os.getuid()
    assert box.job(job)["image"]["id"].startswith("sha256:")

    job = box.run(*args, "--epochs", "50", "--out", "runs/b")
    wait_for(lambda: "Epoch 1/50" in box.cli("logs", "box", job).stdout, timeout=120, what="an epoch")
    assert "not built again" in box.cli("logs", "box", job).stdout  # the run wrote runs/ and data/: ignored
    killed = box.cli("kill", "box", job, "--grace", "20", "--yes", check=True, timeout=120)
    assert "killed (exit 130)" in killed.stdout  # SIGINT reached python inside: it saved and re-raised
    assert json.loads((box.work / "runs" / "b" / "summary.json").read_text())["status"] != "completed"
    assert box.ours() == []


@pytest.fixture(scope="module")
def docker_sshd2(tmp_path_factory: pytest.TempPathFactory, engine: DockerEngine) -> Iterator[Sshd]:
    """A second host on this machine (127.0.0.2) whose sessions reach the same engine."""
    server = Sshd(tmp_path_factory.mktemp("sshd-docker2"), address="127.0.0.2")
    server.client_key("ok", env={"DOCKER_HOST": engine.host})
    server.start()
    yield server
    server.stop()


def test_a_job_over_two_hosts_runs_in_an_image_and_stops_together(
    box: Box, docker_sshd2: Sshd, engine: DockerEngine
) -> None:
    """run h1,h2 --image: each part in a container on its host with the rendezvous variables; rank 1 exits 3
    and rank 0's container (its shell ignoring SIGINT) is stopped through the engine, with no client."""
    remote2 = box.root.parent / "remote-state-2"
    known = box.known_hosts
    known.write_text(known.read_text() + docker_sshd2.host_key_line())
    table = box.host_settings()
    table2 = dict(table, host="127.0.0.2", port=docker_sshd2.port, identity_file=str(docker_sshd2.keys["ok"]),
                  remote_dir=str(remote2))
    box.write_config("".join(f"[hosts.{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in t.items())
                             for name, t in (("h1", table), ("h2", table2))))
    try:
        script = ('echo "part $NODE_RANK of $NNODES at $MASTER_ADDR:$MASTER_PORT"; '
                  'if [ "$NODE_RANK" = 1 ]; then sleep 1; exit 3; fi; trap "" INT; while true; do sleep 1; done')
        res = box.cli("run", "h1,h2", "--cwd", str(box.work), "--image", IMAGE, "--", "sh", "-c", script,
                      check=True, timeout=120)
        job = res.stdout.strip()
        done = box.cli("logs", "h1", job, "--follow", timeout=120)
        assert done.returncode == 143 and "part 0 of 2 at 127.0.0.1:" in done.stdout, (done.stdout, done.stderr)
        part1 = box.cli("logs", "h1", job, "--rank", "1", check=True).stdout
        assert "part 1 of 2 at 127.0.0.1:" in part1
        record = next(j for j in json.loads(box.cli("jobs", "--json", check=True).stdout) if j["id"] == job)
        parts = record["group"]["parts"]
        assert [p["exit_code"] for p in parts] == [143, 3] and record["error"] == "h2 (rank 1) failed (exit 3)"
        assert parts[0]["error"] == "stopped: h2 (rank 1) failed (exit 3)"
        assert record["image"]["image"] == IMAGE
        tags = [agent_image.state_tag(str(box.remote_dir)), agent_image.state_tag(str(remote2))]
        assert [engine.containers(f"label=gputui.state={t}") for t in tags] == [[], []]
    finally:
        stop_host(remote2)

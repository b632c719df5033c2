"""Entry point: ``python3 gputui-agent-<hash>[.pyz] serve|runner ...`` (or ``python3 -m remote_agent``)."""

import argparse
import importlib
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

DEFAULT_STATE_DIR = "~/.gputui"


def launcher() -> List[str]:
    """argv that starts this same agent build again (used for the runner inside tmux)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)  # the build (unpacked folder or .pyz), or the folder holding the package
    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); from remote_agent.__main__ import main; main()"
    return [sys.executable, "-c", code, root]


def _dir(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


#: Each subcommand but ``serve``: (module, function, its arguments from the parsed args).
COMMANDS: Dict[str, Tuple[str, str, Callable[[argparse.Namespace], Tuple[Any, ...]]]] = {
    "runner": (".jobs.runner", "run", lambda a: (a.job_dir, launcher())),
    "image-run": (".jobs.image", "build_and_run", lambda a: (a.job_dir, a.attempt)),
    "group-hub": (".jobs.group", "serve_hub", lambda a: (a.job_dir, a.attempt)),
    "slurm-step": (".jobs.slurm_step", "run_step", lambda a: (a.job_dir, a.task, launcher())),
    "gpu-stream": (".metrics.slurm_gpus", "gpu_stream", lambda a: (os.path.expanduser(a.state_dir), a.nvidia_smi,
                                                           max(0.1, a.interval))),
    "watchdog": (".watchdog.daemon", "run", lambda a: (_dir(a.state_dir), launcher())),
    "boot": (".watchdog.autostart", "boot", lambda a: (_dir(a.state_dir), launcher())),
    "cat": (".files.pull", "cat_file", lambda a: (a.path, a.offset, a.limit)),
    "receive": (".files.sync", "receive", lambda a: (os.path.expanduser(a.state_dir), a.target, sys.stdin.buffer,
                                                sys.stdout.buffer)),
}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="gputui-agent", description="gputui's agent on a GPU host")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="speak JSON lines on stdin/stdout")
    serve.add_argument("--state-dir", default=os.environ.get("GPUTUI_STATE_DIR", DEFAULT_STATE_DIR))
    serve.add_argument("--idle-timeout", type=float, default=30.0, help="exit after this long without input")
    serve.add_argument("--heartbeat", type=float, default=2.0)
    serve.add_argument("--nvidia-smi", default="nvidia-smi")
    serve.add_argument(
        "--linger", type=float, default=60.0, help="keep sampling metrics this long after the client went"
    )
    runner = sub.add_parser("runner", help="run one job inside its tmux pane")
    runner.add_argument("job_dir")
    image_run = sub.add_parser("image-run", help="a job's --build: build its image, then run it (in its pane)")
    image_run.add_argument("job_dir")
    image_run.add_argument("attempt", type=int)
    watchdog = sub.add_parser("watchdog", help="autostop/deadline watchdog (started detached by the agent)")
    watchdog.add_argument("state_dir")
    cat = sub.add_parser("cat", help="write a regular file's bytes from OFFSET to stdout (pull, log catch-up)")
    cat.add_argument("path")
    cat.add_argument("offset", type=int)
    cat.add_argument("limit", type=int, nargs="?", help="copy at most this many bytes")
    stream = sub.add_parser("gpu-stream", help="a Slurm job's node: its GPUs as JSON lines (run by srun --overlap)")
    stream.add_argument("--state-dir", default=os.environ.get("GPUTUI_STATE_DIR", DEFAULT_STATE_DIR))
    stream.add_argument("--nvidia-smi", default="nvidia-smi")
    stream.add_argument("--interval", type=float, default=2.0)
    step = sub.add_parser("slurm-step", help="a many-node Slurm job: start its srun step (--task: its torchrun)")
    step.add_argument("--task", action="store_true")
    step.add_argument("job_dir")
    hub = sub.add_parser("group-hub", help="a job over several hosts: its hub on rank 0's host (run by its runner)")
    hub.add_argument("job_dir")
    hub.add_argument("attempt", type=int, nargs="?", default=1)
    boot = sub.add_parser("boot", help="after a reboot (resume_on_boot's crontab line): resume this state dir's work")
    boot.add_argument("state_dir")
    receive = sub.add_parser("receive", help="write files from a raw upload stream into TARGET (gputui sync)")
    receive.add_argument("--state-dir", default=os.environ.get("GPUTUI_STATE_DIR", DEFAULT_STATE_DIR))
    receive.add_argument("target")
    args = parser.parse_args(argv)

    if args.cmd in COMMANDS:  # the module of a command is imported only when it runs
        module, name, call = COMMANDS[args.cmd]
        sys.exit(getattr(importlib.import_module(module, __package__ or "remote_agent"), name)(*call(args)))
    from . import protocol as P
    from .fsutil import StateDirError
    from .server import Agent

    try:
        agent = Agent(
            os.path.expanduser(args.state_dir),
            launcher(),
            sys.stdin.buffer,
            sys.stdout.buffer,
            idle_timeout=args.idle_timeout,
            heartbeat_s=args.heartbeat,
            nvidia_smi=args.nvidia_smi,
            linger_s=args.linger,
        )
    except StateDirError as exc:  # the client shows this as the host's error
        error = {"code": "state_dir", "message": str(exc)}
        sys.stdout.buffer.write(
            P.encode(P.event(P.EV_HELLO, {"protocol": P.PROTOCOL_VERSION, "error": error}))
        )
        sys.stdout.buffer.flush()
        print("gputui-agent: %s" % exc, file=sys.stderr)
        sys.exit(2)
    code = agent.serve()
    # No sys.stdout.flush(): every frame is flushed when sent, and a write stuck on a dead link holds the
    # buffer's lock. os._exit: a reader thread may still sit in stdin.readline(); do not wait for it.
    os._exit(code)


if __name__ == "__main__":
    main()

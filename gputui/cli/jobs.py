"""Jobs: ``run``, ``queue``, ``jobs``, ``history``, ``logs``, ``kill`` — each command's parser beside its handler."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import re
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from ..core import jsonout, safetext
from ..core.config import file as cfg
from ..core.errors import ExitStatus
from ..core.files.artifacts import check_patterns
from ..core.jobs import group as job_group
from ..core.jobs import secrets
from ..core.jobs.usecases import (
    MAX_QUEUE_DEPS,
    JobSpec,
    collect_history,
    collect_jobs,
    container_request,
    parse_env,
    restart_request,
    start_job,
)
from ..core.session import model as M
from ..core.session.host import MAX_KILL_GRACE_S, HostSession
from ..tables import print_history, print_jobs, print_queue, queue_gpus
from .common import (
    CliError,
    add_direct,
    ask_async,
    bounded,
    host_names,
    hosts_status,
    job_exit,
    open_fleet,
    with_session,
)
from .files import sync_tree

USAGE = ExitStatus.USAGE
RUN_EXAMPLES = """examples:
  gputui run local -- python train.py --epochs 10
  gputui run gpu1 --sync --name exp1 --gpus 0,1 -- python train.py
  gputui run gpu1 --queue --gpus 2 -- torchrun --nproc-per-node=2 train.py
  gputui run hpc --nodes 2 --gpus-per-node 4 --launcher torchrun -- train.py --epochs 3
  gputui run gpu1,gpu2 --sync --launcher torchrun -- train.py --epochs 3"""
_GPU_ITEM = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z-]+")  # an index or a (MIG) UUID, as CUDA takes them


# --- run --------------------------------------------------------------------------------------------------------
def _parse_env(items: list[str]) -> dict[str, str]:
    try:
        return parse_env(items, label="--env")
    except ValueError as exc:
        raise CliError(str(exc), USAGE) from None


def _gpu_items(spec: str | None) -> list[str]:
    """The GPUs ``--gpus`` names (none for all/none); a usage error unless it is all, none or a comma list."""
    if spec is None or spec in ("all", "none"):
        return []
    items = spec.split(",")
    if not all(_GPU_ITEM.fullmatch(item) for item in items):
        raise CliError(
            f"--gpus {spec!r}: expected all, none, or a comma list of GPU indices or UUIDs (e.g. 0,1)", USAGE
        )
    return items


def _check_gpus_on_host(spec: str, items: list[str], host: str, facts: dict[str, Any]) -> None:
    """A usage error naming the host's GPUs when ``items`` names one it lacks (MIG UUIDs are not listed)."""
    gpus = [M.GpuSample.from_wire(g) for g in facts.get("gpus") or ()]
    missing = [
        item for item in items
        if not item.startswith("MIG-")
        and not any(item == str(g.index) or (g.uuid or "").startswith(item) for g in gpus)
    ]
    if missing:
        has = ", ".join(f"{g.index} ({g.name or '?'}, {g.uuid or 'no UUID'})" for g in gpus)
        has = has or f"none: {facts.get('gpu_error') or 'no NVIDIA GPU found'}"
        raise CliError(f"--gpus {spec!r}: {host} has no GPU {', '.join(missing)}; its GPUs: {has}", USAGE)


def _slurm_request(args: argparse.Namespace, host: cfg.HostConfig) -> dict[str, Any] | None:
    """The sbatch settings of ``gputui run`` on a Slurm host (None elsewhere; Slurm flags there are an error)."""
    flags = {"--nodes": args.nodes, "--gpus-per-node": args.gpus_per_node, "--launcher": args.launcher,
             "--partition": args.partition, "--time": args.time, "--sbatch-arg": args.sbatch_arg or None}
    if host.scheduler != "slurm":
        used = [flag for flag, value in flags.items() if value is not None]
        if used:
            raise CliError(f"{', '.join(used)}: only for a Slurm host ({host.name} has no scheduler = \"slurm\")",
                           USAGE)
        return None
    gpus = None
    if args.gpus is not None and args.gpus_per_node is not None:
        raise CliError("--gpus and --gpus-per-node: give one (on a Slurm host both are the GPUs per node)", USAGE)
    if args.gpus is not None:
        if not args.gpus.isdigit():
            raise CliError(f"--gpus {args.gpus!r}: on a Slurm host, the GPUs per node (e.g. 2)", USAGE)
        gpus = int(args.gpus)
    gpus = args.gpus_per_node if args.gpus_per_node is not None else gpus
    request = {"gpus": gpus, "nodes": args.nodes, "partition": args.partition, "time": args.time,
               "sbatch_args": list(args.sbatch_arg or []), "launcher": args.launcher}
    return {k: v for k, v in request.items() if v is not None}


def _queue_request(args: argparse.Namespace) -> dict[str, Any] | None:
    """What ``run --queue`` (or ``--after``/``--after-ok``, which imply it) asks the host's queue for; None: run now.

    With the queue, ``--gpus N`` (a bare number) is a count: any N free GPUs; a list names the GPUs."""
    after, after_ok = args.after or [], args.after_ok or []
    if not (args.queue or after or after_ok):
        return None
    bad = [i for i in after + after_ok if not i.isdigit()]
    if bad:
        raise CliError(f"--after/--after-ok {bad[0]!r}: expected job ids (numbers)", USAGE)
    for flag, ids in (("--after", after), ("--after-ok", after_ok)):
        if len(ids) > MAX_QUEUE_DEPS:
            raise CliError(f"{flag}: at most {MAX_QUEUE_DEPS} job ids, not {len(ids)}", USAGE)
    gpus = args.gpus
    if gpus is not None and gpus.isdigit():
        if not 1 <= int(gpus) <= 1024:
            raise CliError(
                f"--gpus {gpus} with --queue: a bare number is a GPU count (1 to 1024); to wait for particular"
                " GPUs, list them (0,1) or name one by its UUID (gputui status --json shows them); none: no GPU",
                USAGE,
            )
        return {"gpu_count": int(gpus), "after": after, "after_ok": after_ok}
    return {"gpus": None if gpus == "all" else gpus, "after": after, "after_ok": after_ok}


async def cmd_run(args: argparse.Namespace) -> int:
    argv = args.command
    if not argv:
        raise CliError(
            "nothing to run: give the command after --, e.g. gputui run local -- python train.py", USAGE
        )
    queue = _queue_request(args)
    try:
        artifacts = check_patterns(args.artifacts)
    except ValueError as exc:
        raise CliError(str(exc), USAGE) from None
    config = cfg.load(args.config)
    try:
        group_hosts = job_group.hosts_of(config, args.host)
    except job_group.GroupError as exc:
        raise CliError(f"run: {exc}", USAGE) from None
    if group_hosts is not None:
        return await _run_group(args, config, group_hosts, argv, artifacts, queue)
    host_cfg = config.host(args.host)
    try:
        restart_request(config, args.host, args.restart, args.resume_from)  # bad input: refused before connecting
    except ValueError as exc:
        raise CliError(str(exc), USAGE) from None
    env = _parse_env(args.env)
    both = sorted(set(env) & set(args.secret))
    if both:
        raise CliError(f"{', '.join(both)}: given both as --env and as --secret: give each variable once", USAGE)
    job_secrets = secrets.resolve(args.secret, config.path)  # before connecting: a missing one starts nothing
    slurm = _slurm_request(args, host_cfg)
    if (args.image or args.build) and slurm is not None:
        raise CliError(f"run: {args.host} is a Slurm host; jobs in images on Slurm are not supported yet", USAGE)
    _check_image(args, argv, host_cfg)
    if slurm is not None and queue is not None:
        raise CliError(f"--queue/--after: {args.host} is a Slurm host; its jobs wait in Slurm's queue", USAGE)
    counted = slurm is not None or (queue is not None and (args.gpus or "").isdigit())
    gpu_items = [] if counted else _gpu_items(args.gpus)
    cwd = args.cwd or (os.getcwd() if host_cfg.transport == "local" else None)

    async def body(s: HostSession) -> int:
        _check_gpus_on_host(args.gpus, gpu_items, args.host, s.snapshot.facts)
        code, job_cwd = await _job_dir(s, args, cwd)
        spec = JobSpec(
            args.host, argv, name=args.name, cwd=job_cwd, env=env, secrets=job_secrets,
            gpus=None if queue is not None or slurm is not None else args.gpus, code=code, artifacts=artifacts,
            queue=queue, slurm=slurm, restart=args.restart, resume_from=args.resume_from, image=args.image,
            build=args.build, docker_args=tuple(args.docker_arg),
        )
        job = await start_job(s, config, spec)
        print(job.id)
        if job.state == M.JOB_QUEUED and job.queue_position is not None:
            print(
                f"gputui: job {job.id} queued on {args.host} at position {job.queue_position}",
                file=sys.stderr,
            )
        return ExitStatus.OK

    return await with_session(args, args.host, body)


def _check_image(args: argparse.Namespace, argv: list[str], host_cfg: cfg.HostConfig) -> None:
    """Refuse a bad image or engine option, or a --build with no dir to build from (before connecting)."""
    if args.build is not None and args.sync is None and args.cwd is None and host_cfg.transport != "local":
        raise CliError("run --build builds from the job's dir: give --sync (this dir) or --cwd DIR", USAGE)
    try:
        container_request(JobSpec(host_cfg.name, argv, image=args.image, build=args.build,
                                  docker_args=tuple(args.docker_arg)), host_cfg)
    except ValueError as exc:
        raise CliError(f"run: {exc}", USAGE) from None


async def _job_dir(s: HostSession, args: argparse.Namespace, cwd: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(code, dir) a job runs with: with --sync, the tree synced to the host first (an incomplete sync: the job
    would run on stale code, so it never starts), else (None, ``cwd``)."""
    if args.sync is None:
        return None, cwd
    synced = await sync_tree(s, args.sync, args.cwd, delete=False)
    from ..core.files.sync import SyncError

    try:
        synced.require_complete(s.name)
    except SyncError as exc:
        raise CliError(f"run --sync: {exc}") from None
    return synced.code(), synced.target


def _group_flags(args: argparse.Namespace, hosts: list[str], queue: dict[str, Any] | None, env: dict[str, str]) -> None:
    """Refuse what a job over several hosts cannot take (before connecting)."""
    refused = {"--queue/--after": queue is not None,
               "--partition/--time/--sbatch-arg": bool(args.partition or args.time or args.sbatch_arg),
               "--gpus": args.gpus is not None}
    used = [flag for flag, on in refused.items() if on]
    if used:
        more = " (give --gpus-per-node G: the GPUs, and torchrun's processes, on each host)" if args.gpus else ""
        raise CliError(f"{', '.join(used)}: not for a job over several hosts ({','.join(hosts)}) yet{more}", USAGE)
    if args.nodes is not None and args.nodes != len(hosts):
        raise CliError(f"--nodes {args.nodes}: the job runs on {len(hosts)} hosts ({','.join(hosts)})", USAGE)
    taken = sorted(set(env) & set(job_group.ENV_NAMES))
    if taken:
        raise CliError(f"--env {', '.join(taken)}: gputui sets these for a job over several hosts", USAGE)


async def _run_group(
    args: argparse.Namespace, config: cfg.Config, hosts: list[str], argv: list[str], artifacts: tuple[str, ...],
    queue: dict[str, Any] | None,
) -> int:
    """``run h1,h2 ...``: check every host, then start one part on each; nothing runs unless all start."""
    from ..core.hosts.fleet import Fleet
    from .common import exit_status

    env = _parse_env(args.env)
    _group_flags(args, hosts, queue, env)
    try:  # the parts restart together: one policy for all (each host's backoff settings)
        policies = {n: restart_request(config, n, args.restart, args.resume_from) for n in hosts}
    except ValueError as exc:
        raise CliError(str(exc), USAGE) from None
    for name in hosts:
        _check_image(args, argv, config.host(name))
    said = {n: (p or {}).get("policy", "no") + (f":{p['max']}" if (p or {}).get("max") else "") for n, p in policies.items()}
    if len(set(said.values())) > 1:
        each = ", ".join(f"{n} {s}" for n, s in said.items())
        raise CliError(f"the hosts' restart settings differ ({each}): give --restart for the whole job", USAGE)
    job_secrets = secrets.resolve(args.secret, config.path)
    fleet = Fleet(config)
    try:
        sessions = {name: fleet.session(name) for name in hosts}
        answers = await asyncio.gather(*(s.start() for s in sessions.values()), return_exceptions=True)
        down = [(n, r) for n, r in zip(hosts, answers, strict=True) if isinstance(r, BaseException)]
        if down:
            lines = "\n  ".join(f"{n}: {r}" for n, r in down)
            raise CliError(f"run: nothing started: not every host answered\n  {lines}", exit_status(down[0][1]))
        cwds: dict[str, str | None] = {}
        codes: dict[str, dict[str, Any] | None] = {}
        for name, s in sessions.items():  # (an incomplete sync on one host: nothing started anywhere)
            local = config.host(name).transport == "local"
            codes[name], cwds[name] = await _job_dir(s, args, args.cwd or (os.getcwd() if local else None))
        try:
            plan = await job_group.check(sessions, config, argv, cwds, env.get("PATH"), args.launcher, args.gpus_per_node,
                                 in_image=bool(args.image or args.build))
        except job_group.GroupError as exc:
            raise CliError(f"run: nothing started: {exc}") from None
        procs = f" x {plan.nproc_per_node} processes" if plan.launcher else ""
        print(f"gputui: {len(hosts)} hosts{procs}; MASTER_ADDR={plan.master_addr} ({plan.addr_from}), "
              f"MASTER_PORT={plan.master_port}", file=sys.stderr)
        started: list[tuple[str, M.Job]] = []
        try:
            for rank, name in enumerate(hosts):
                spec = JobSpec(name, argv, name=args.name, cwd=cwds[name], env=env, secrets=job_secrets,
                               code=codes[name], artifacts=artifacts, restart=args.restart,
                               resume_from=args.resume_from, image=args.image, build=args.build,
                               docker_args=tuple(args.docker_arg), group=plan.request(rank))
                started.append((name, await start_job(sessions[name], config, spec)))
        except (Exception, asyncio.CancelledError) as exc:
            for name, job in started:  # they wait for every part: none ran its command
                with contextlib.suppress(Exception):
                    await sessions[name].kill_job(job.id, 0.0)
            raise CliError(f"run: nothing started: the part on {hosts[len(started)]} could not start: {exc}") from None
        print(started[0][1].id)
        parts = ", ".join(f"{name} job {job.id}" for name, job in started)
        print(f"gputui: job {started[0][1].id} on {hosts[0]} is the job's name for logs, kill and attach "
              f"(parts: {parts})", file=sys.stderr)
        return ExitStatus.OK
    finally:
        await fleet.close()


def check_run_command(argv: list[str], before: list[str], extra: list[str], after: list[str] | None) -> None:
    """Refuse a ``run`` whose job command argparse would split: without ``--`` an option-like word in the
    command (``python train.py --name x``) is taken as gputui's own, or the words before ``--`` are dropped."""
    if after is not None and before:
        raise CliError(
            f"run: {shlex.join(before)!r} comes before -- and would be dropped: put the whole command after --, "
            f"e.g. gputui run HOST -- {shlex.join([*before, *after])}", USAGE,
        )
    if after is None and (extra or (before and argv[len(argv) - len(before) :] != before)):
        taken = f" ({shlex.join(extra)!r} is not an option of gputui run)" if extra else ""
        raise CliError(
            f"run: the job's command holds options that gputui would take as its own{taken}: "
            "put the command after --, e.g. gputui run HOST --name exp1 -- python train.py --lr 3e-4", USAGE,
        )


# --- the queue and the lists ------------------------------------------------------------------------------------
async def cmd_queue(args: argparse.Namespace) -> int:
    """``queue HOST``: the queued jobs in order and what each waits for; ``--move ID --to N`` reorders."""
    if (args.move is None) != (args.to is None):
        raise CliError("--move ID and --to N go together", USAGE)

    async def body(s: HostSession) -> int:
        if args.move is not None:
            listing = await s.move_queued(args.move, int(args.to))
        else:
            listing = await s.list_queue()
        jobs = [M.Job.from_wire(args.host, j) for j in listing["jobs"]]
        resumed, more = (
            listing.get("resumed_at"),
            int(listing.get("more") or 0),
        )  # (an older agent: no "more")
        if args.json:
            out = [{"position": j.queue_position, "id": j.id, "name": j.name, "command": list(j.command),
                    "gpus": queue_gpus(j), "after": (j.record.get("queue") or {}).get("after"),
                    "after_ok": (j.record.get("queue") or {}).get("after_ok"), "waits_for": j.queue_reason}
                   for j in jobs]
            print(
                jsonout.dumps(
                    {"host": args.host, "jobs": out, "more": more, "resumed_after_reboot_at": resumed}
                )
            )
            return ExitStatus.OK
        if resumed:
            when = datetime.datetime.fromtimestamp(resumed).strftime("%Y-%m-%d %H:%M")
            print(f"{args.host}: the queue resumed after a reboot ({when})")
        print_queue(jobs)
        if more:
            print(f"... and {more} more queued jobs (not listed)")
        return ExitStatus.OK

    return await with_session(args, args.host, body)


def _series_flag(args: argparse.Namespace) -> None:
    if args.series and not args.json:
        raise CliError("--series goes with --json (the table has no room for curves)", USAGE)


async def _series(fleet: Any, runs: list[tuple[str, str]]) -> Any:
    """``--series``: each run's metric series (the comparison module loads the log parser: only then)."""
    from ..core.jobs.compare import load_series

    return await load_series(fleet, runs)


async def cmd_jobs(args: argparse.Namespace) -> int:
    _series_flag(args)
    async with open_fleet(args) as fleet:
        jobs, errors = await collect_jobs(fleet, host_names(fleet.config, args.host))
        jobs = job_group.merge_parts(jobs)  # a job over several hosts is one line
        series = await _series(fleet, [(j.host, j.id) for j in jobs]) if args.series else {}
    return show_jobs(jobs, errors, args.json, series if args.series else None)


def show_jobs(jobs: list[M.Job], errors: Mapping[str, object], as_json: bool, series: dict[Any, Any] | None = None) -> int:
    """Print the jobs (a table, or JSON with each job's ``series`` where asked) and each host's error; the exit
    status."""
    status = hosts_status(errors)
    if as_json:
        out = [j.to_json() for j in jobs]
        if series is not None:  # null where the host could not say
            for j, item in zip(jobs, out, strict=True):
                item["series"] = series[(j.host, j.id)].to_json() if (j.host, j.id) in series else None
        print(jsonout.dumps(out))
    else:
        print_jobs(jobs)
    return status


async def cmd_history(args: argparse.Namespace) -> int:
    _series_flag(args)
    async with open_fleet(args) as fleet:
        records, errors = await collect_history(fleet, fleet.config, host_names(fleet.config, args.host))
        if args.series:
            series = await _series(fleet, [(r["host"], r["id"]) for r in records])
            for r in records:
                got = series.get((r["host"], r["id"]))
                r["series"] = got.to_json() if got is not None else None
    return show_history(records, errors, args.json)


def show_history(records: list[dict[str, Any]], errors: Mapping[str, object], as_json: bool) -> int:
    """Print the finished runs (a table, or JSON) and each host's error; the exit status."""
    status = hosts_status(errors)
    if as_json:
        print(jsonout.dumps(records))
    else:
        print_history(records)
    return status


# --- one job ----------------------------------------------------------------------------------------------------
async def _part_of(args: argparse.Namespace) -> tuple[str, str]:
    """``--rank N``: the host and job id of that part of the job over several hosts ``args.job``."""
    async with open_fleet(args) as fleet:
        first = fleet.session(args.host)
        await first.start()
        job = await first.get_job(args.job)
        if job_group.group_of(job) is None:
            raise CliError(f"--rank: job {job.id} on {args.host} runs on that host only", USAGE)
        parts = await job_group.find_parts(fleet, job)
        if args.rank not in parts:
            raise CliError(f"--rank {args.rank}: job {job.id} has ranks 0 to {len(parts) - 1}", USAGE)
        host, part = parts[args.rank]
        if isinstance(part, BaseException):
            raise CliError(f"rank {args.rank} of job {job.id} ({host}): {part}")
        return host, part.id


async def cmd_logs(args: argparse.Namespace) -> int:
    if args.rank:
        args.host, args.job = await _part_of(args)
    out = safetext.LogOutput(sys.stdout)
    write = out.write

    async def body(s: HostSession) -> int:
        offset = args.offset  # past 0 where the session service wrote the bytes before it (service.client.logs)
        if args.tail is not None:  # the reply's bytes are the tail's first: written, not asked for again
            offset, data, _ = await s.read_log(args.job, tail_lines=args.tail)
            write(data)
            offset += len(data)
        if not args.follow:
            await s.copy_log(args.job, offset, write)
            write(b"", final=True)
            return ExitStatus.OK
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        s.run_in_background()  # survive link drops: the follow resumes from its cursor

        def gap(message: str) -> None:
            print(f"\ngputui: --- {message} ---", file=sys.stderr)

        def follow(data: bytes) -> None:  # called from the link's event handler: hand errors to the command
            try:
                write(data)
            except BrokenPipeError as exc:
                if not done.done():
                    done.set_exception(exc)

        await s.follow_log(args.job, offset, follow, lambda info: done.done() or done.set_result(info), gap)
        info = await done
        write(b"", final=True)
        return job_exit(info)

    return await with_session(args, args.host, body)


async def cmd_kill(args: argparse.Namespace) -> int:
    async def body(s: HostSession) -> int:
        job = await s.get_job(args.job)
        asked = args.after_service  # when the session service was asked this kill, if it was and went away
        if asked is not None and job.state == M.JOB_KILLED and (job.ended_at or 0.0) >= asked - CLOCK_SKEW_S:
            print(kill_line(args.host, job))  # its kill ended as the service went: said as it would have
            return ExitStatus.OK
        if not args.yes and sys.stdin.isatty():  # the question names the job: a mistyped id shows
            await _confirm_kill(args, job)
        if job_group.group_of(job) is not None:
            return await _kill_group(args, job)
        print(kill_line(args.host, await s.kill_job(args.job, args.grace)))
        return ExitStatus.OK

    return await with_session(args, args.host, body)


#: How far a host's clock may be behind this machine's when a job's end is compared with a request's time.
CLOCK_SKEW_S = 60.0


def kill_line(host: str, job: M.Job) -> str:
    """What ``kill`` says of the job it killed: its end state and exit status, or that it left the queue."""
    if job.state == M.JOB_KILLED and job.started_at is None:
        return f"job {job.id} on {host}: removed from the queue (it never started)"
    return f"job {job.id} on {host}: {job.state} (exit {job.exit_code})"


async def _kill_group(args: argparse.Namespace, job: M.Job) -> int:
    """Kill every part of a job over several hosts, each on its host at once; a part that could not be is said."""
    status = ExitStatus.OK
    async with open_fleet(args) as fleet:
        for host, res in await job_group.kill_parts(fleet, job, args.grace):
            if isinstance(res, BaseException):
                print(f"gputui: {host}: {res}", file=sys.stderr)
                status = ExitStatus.FAILED
            else:
                print(f"job {res.id} on {host}: {res.state} (exit {res.exit_code})")
    return status


async def _confirm_kill(args: argparse.Namespace, job: M.Job) -> None:
    """Ask on the terminal whether to kill the job, naming it; a CliError when not (or when it is over)."""
    group = job_group.group_of(job)
    if job.state in M.JOB_ENDED_STATES and group is None:
        raise CliError(f"job {job.id} is not running ({job.state})")
    it = f"job {job.id} ({safetext.clean(job.name, limit=120)}, {job.state})"
    if group is not None:
        it += f" and its parts on {', '.join(safetext.clean(h) for h in group.get('hosts') or ())}"
    queued = job.state == M.JOB_QUEUED
    question = (f"Remove {it} from {args.host}'s queue? [y/N] " if queued else
                f"Kill {it} on {args.host} (SIGINT, then TERM/KILL after {args.grace:g} s)? [y/N] ")
    if not await ask_async(question):
        raise CliError("not removed" if queued else "not killed")


# --- parsers ----------------------------------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser(
        "run", help="start a job in tmux on a host (or one over several: h1,h2); prints its id",
        usage="%(prog)s [OPTIONS] host[,host...] -- CMD [ARG ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=RUN_EXAMPLES,
    )
    r.add_argument("host", help="a host; or several, h1,h2 or a [groups.NAME]: one part of the job on each")
    r.add_argument("--name", help="display name (free text)")
    r.add_argument("--gpus", help="GPU selection for CUDA_VISIBLE_DEVICES: all, none, or e.g. 0,1; "
                   "with --queue a bare number N is a count: any N free GPUs")
    r.add_argument("--queue", action="store_true",
                   help="wait on the host until the GPUs are free (no other job, no foreign process, idle)")
    r.add_argument(
        "--after", action="extend", nargs="+", metavar="ID", help="queue: start after these jobs end"
    )
    r.add_argument("--after-ok", action="extend", nargs="+", metavar="ID",
                   help="queue: start only after these jobs succeeded (else it never starts, and says why)")
    r.add_argument("--restart", metavar="POLICY",
                   help="no (default), or on-failure[:N]: restart a failed attempt, at most N in a row (host default: "
                        "restart in [hosts.X])")
    r.add_argument("--resume-from", metavar="GLOB",
                   help="checkpoint glob inside the job's dir (e.g. 'ckpt/*.pt'): a restart gets the newest match as "
                        "GPUTUI_RESUME_FROM")
    r.add_argument("--cwd", help="working directory on the host (default: here for local, ~ over SSH)")
    r.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="extra environment (repeatable); kept in the job's record on the host")
    r.add_argument("--secret", action="append", default=[], metavar="NAME",
                   help="give the job $NAME from here (else NAME in secrets.toml beside the config, mode 0600); "
                        "never kept in a record, deleted from the host when the job can no longer restart")
    r.add_argument("--sync", nargs="?", const=".", metavar="SRC",
                   help="sync SRC (default: here) to the host first and run the job in the synced dir")
    r.add_argument("--image", metavar="IMAGE",
                   help="run the command in a container of IMAGE (docker or podman on the host; the job's dir is "
                        "mounted and is the workdir; --gpus go to the engine)")
    r.add_argument("--build", nargs="?", const="Dockerfile", metavar="DOCKERFILE",
                   help="instead of --image: build the image on the host from the job's dir (--sync or --cwd) with "
                        "DOCKERFILE (default: Dockerfile) first; an unchanged tree is not built again")
    r.add_argument("--docker-arg", action="append", default=[], metavar="OPT",
                   help="with --image or --build: an extra engine option, repeatable; write it with =, e.g. "
                        "--docker-arg=--shm-size=16g")
    r.add_argument("--artifacts", action="append", default=[], metavar="PATH[,PATH]",
                   help="files to bring back before release, relative to the job's dir (repeatable)")
    sl = r.add_argument_group("many nodes: Slurm hosts (scheduler = \"slurm\"; --gpus is the GPUs per node) and jobs over "
                              "several hosts (h1,h2)")
    sl.add_argument("--nodes", type=bounded(1, 100000, integer=True), metavar="N",
                    help="nodes (sbatch --nodes); more than one: the command runs once per node, in one srun step")
    sl.add_argument("--gpus-per-node", type=bounded(0, 1024, integer=True), metavar="G",
                    help="GPUs per node (as --gpus N); torchrun's processes per node")
    sl.add_argument("--launcher", choices=("torchrun",),
                    help="torchrun: gputui writes the torchrun line (rendezvous on the first node, node rank from "
                    "SLURM_NODEID); the command is then the script and its arguments")
    sl.add_argument("--partition", metavar="P", help="partition (sbatch --partition)")
    sl.add_argument("--time", metavar="T", help="time limit, e.g. 30, 2:00:00, 1-0 (sbatch --time)")
    sl.add_argument("--sbatch-arg", action="append", metavar="OPT",
                    help="extra sbatch option, repeatable; write it with =, e.g. --sbatch-arg=--qos=high")
    r.add_argument("command", nargs="*", metavar="CMD",
                   help="the job's argv, after -- (passed untouched, never through a shell)")
    r.set_defaults(func=cmd_run)

    j = sub.add_parser("jobs", help="list jobs")
    j.add_argument("host", nargs="?")
    j.add_argument("--json", action="store_true")
    j.add_argument(
        "--series", action="store_true", help="with --json: each job's metric series (kept on the host)"
    )
    add_direct(j)
    j.set_defaults(func=cmd_jobs)

    hi = sub.add_parser(
        "history", help="finished runs with their records: git, GPUs, usage, cost, final metrics"
    )
    hi.add_argument("host", nargs="?")
    hi.add_argument("--json", action="store_true")
    add_direct(hi)
    hi.add_argument(
        "--series", action="store_true", help="with --json: each run's metric series (kept on the host)"
    )
    hi.set_defaults(func=cmd_history)

    lg = sub.add_parser("logs", help="print a job's output")
    lg.add_argument("host")
    lg.add_argument("job")
    lg.add_argument(
        "-f", "--follow", action="store_true", help="follow until the job ends; exit with its status"
    )
    lg.add_argument("--rank", type=bounded(0, 1023, integer=True), metavar="N",
                    help="a job over several hosts: the log of rank N's part (default: rank 0's)")
    lg.add_argument(
        "--tail", type=bounded(0, 10_000_000, integer=True), metavar="N", help="start at the last N lines"
    )
    add_direct(lg)
    lg.set_defaults(func=cmd_logs, offset=0)

    k = sub.add_parser("kill", help="stop a job: SIGINT, then SIGTERM, then SIGKILL")
    k.add_argument("host")
    k.add_argument("job")
    k.add_argument("--grace", type=bounded(0, MAX_KILL_GRACE_S, unit=" seconds"), default=10.0, metavar="S",
                   help=f"seconds between signals, 0 to {MAX_KILL_GRACE_S:g} (default 10)")
    k.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    add_direct(k)
    k.set_defaults(func=cmd_kill, after_service=None)

    qu = sub.add_parser("queue", help="the host's queued jobs: position and what each waits for; reorder")
    qu.add_argument("host")
    qu.add_argument("--json", action="store_true")
    qu.add_argument("--move", metavar="ID", help="move this queued job ...")
    qu.add_argument(
        "--to", type=bounded(1, 1_000_000, integer=True), metavar="N", help="... to position N (1 = next)"
    )
    qu.set_defaults(func=cmd_queue)

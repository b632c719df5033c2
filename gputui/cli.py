"""The gputui command line: the same core as the TUI, without the UI."""

from __future__ import annotations

from .core import earlystart  # noqa: F401 - first: the local agent starts while the imports below load

# isort: split
import argparse
import asyncio
import contextlib
import datetime
import math
import os
import re
import select
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from . import launch
from .core import autostop, jsonout, safetext
from .core import config as cfg
from .core import doctor as D
from .core import model as M
from .core.artifacts import DEFAULT_DEST as ARTIFACTS_DEST
from .core.artifacts import check_patterns
from .core.fleet import Fleet
from .core.gather import gather_hosts
from .core.jobs import MAX_QUEUE_DEPS, JobSpec, collect_history, collect_jobs, parse_env, start_job
from .core.link import AgentError, LinkClosed
from .core.release import ReleaseError, ReleaseRequest, check_configured, release_host
from .core.session import MAX_KILL_GRACE_S, HostSession
from .core.spend import fleet_spend
from .core.transport import HostError, HostUnavailable
from .tables import print_cost, print_history, print_jobs, print_queue, print_status, queue_gpus

# Exit statuses (documented in README.md).
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_HOST, EXIT_NOT_FOUND = 0, 1, launch.EXIT_USAGE, 3, 4, 5
EXIT_PIPE = 141  # the reader closed stdout: what a shell reports for a coreutils tool killed by SIGPIPE


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


def _bounded(
    low: float, high: float, low_ok: bool = True, unit: str = "", integer: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number within [low, high] (or (low, high]), else a usage error (exit 2)."""

    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = math.nan
        if not (low <= value <= high and (low_ok or value > low)):
            kind = "a whole number" if integer else "a number"
            show = (lambda x: f"{int(x):,}") if integer else (lambda x: f"{x:g}")  # noqa: E731
            span = (
                f"from {show(low)} to {show(high)}"
                if low_ok
                else f"above {show(low)} and at most {show(high)}"
            )
            raise argparse.ArgumentTypeError(f"must be {kind} {span}{unit}, not {text!r}")
        return value

    return parse


def _parse_env(items: list[str]) -> dict[str, str]:
    try:
        return parse_env(items, label="--env")
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


_GPU_ITEM = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z-]+")  # an index or a (MIG) UUID, as CUDA takes them


def _gpu_items(spec: str | None) -> list[str]:
    """The GPUs ``--gpus`` names (none for all/none); a usage error unless it is all, none or a comma list."""
    if spec is None or spec in ("all", "none"):
        return []
    items = spec.split(",")
    if not all(_GPU_ITEM.fullmatch(item) for item in items):
        raise CliError(
            f"--gpus {spec!r}: expected all, none, or a comma list of GPU indices or UUIDs (e.g. 0,1)",
            EXIT_USAGE,
        )
    return items


def _check_gpus_on_host(spec: str, items: list[str], host: str, facts: dict[str, Any]) -> None:
    """A usage error naming the host's GPUs when ``items`` names one it lacks (MIG UUIDs are not listed)."""
    gpus = [M.GpuSample.from_wire(g) for g in facts.get("gpus") or ()]
    missing = [
        item for item in items
        if not item.startswith("MIG-")
        and not any(item == str(g.index) or (g.uuid or "").startswith(item) for g in gpus)
    ]  # fmt: skip
    if missing:
        has = ", ".join(f"{g.index} ({g.name or '?'}, {g.uuid or 'no UUID'})" for g in gpus)
        has = has or f"none: {facts.get('gpu_error') or 'no NVIDIA GPU found'}"
        raise CliError(
            f"--gpus {spec!r}: {host} has no GPU {', '.join(missing)}; its GPUs: {has}", EXIT_USAGE
        )


async def _session(args: argparse.Namespace, host: str) -> HostSession:
    fleet = Fleet(cfg.load(args.config))
    session = fleet.session(host)
    await session.start()
    return session


async def _with_session(
    args: argparse.Namespace, host: str, body: Callable[[HostSession], Awaitable[int]]
) -> int:
    session = await _session(args, host)
    try:
        return await body(session)
    except AgentError as exc:
        if exc.code != "not_found":
            raise
        said = str(exc).replace(" on this host", f" on {host}", 1)  # which host; and where the job ids are
        hint = f"; gputui jobs {host} lists its jobs" if said.startswith("no job ") else ""
        raise CliError(said + hint, EXIT_NOT_FOUND) from None
    finally:
        await session.close()


def _job_exit(info: dict[str, Any]) -> int:
    code = info.get("exit_code")
    if isinstance(code, int):
        return code
    print(f"gputui: job ended as {info.get('job_state', 'unknown')} with no exit status", file=sys.stderr)
    return EXIT_FAIL


def _slurm_request(args: argparse.Namespace, host: cfg.HostConfig) -> dict[str, Any] | None:
    """The sbatch settings of ``gputui run`` on a Slurm host (None elsewhere; Slurm flags there are an error)."""
    flags = {"--nodes": args.nodes, "--partition": args.partition, "--time": args.time,
             "--sbatch-arg": args.sbatch_arg or None}  # fmt: skip
    if host.scheduler != "slurm":
        used = [flag for flag, value in flags.items() if value is not None]
        if used:
            raise CliError(f"{', '.join(used)}: only for a Slurm host ({host.name} has no scheduler = \"slurm\")",
                           EXIT_USAGE)  # fmt: skip
        return None
    gpus = None
    if args.gpus is not None:
        if not args.gpus.isdigit():
            raise CliError(f"--gpus {args.gpus!r}: on a Slurm host, the GPUs per node (e.g. 2)", EXIT_USAGE)
        gpus = int(args.gpus)
    request = {"gpus": gpus, "nodes": args.nodes, "partition": args.partition, "time": args.time,
               "sbatch_args": list(args.sbatch_arg or [])}  # fmt: skip
    return {k: v for k, v in request.items() if v is not None}


# --- commands -------------------------------------------------------------------------------------------------
async def cmd_run(args: argparse.Namespace) -> int:
    argv = args.command
    if not argv:
        raise CliError(
            "nothing to run: give the command after --, e.g. gputui run local -- python train.py", EXIT_USAGE
        )
    queue = _queue_request(args)
    try:
        artifacts = check_patterns(args.artifacts)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    config = cfg.load(args.config)
    host_cfg = config.host(args.host)
    slurm = _slurm_request(args, host_cfg)
    if slurm is not None and queue is not None:
        raise CliError(f"--queue/--after: {args.host} is a Slurm host; its jobs wait in Slurm's queue", EXIT_USAGE)
    counted = slurm is not None or (queue is not None and (args.gpus or "").isdigit())
    gpu_items = [] if counted else _gpu_items(args.gpus)
    cwd = args.cwd or (os.getcwd() if host_cfg.transport == "local" else None)

    async def body(s: HostSession) -> int:
        _check_gpus_on_host(args.gpus, gpu_items, args.host, s.snapshot.facts)
        code, job_cwd = None, cwd
        if args.sync is not None:
            synced = await _sync_tree(s, args.sync, args.cwd, delete=False)
            from .core.sync import SyncError

            try:
                synced.require_complete(s.name)  # the job would run on stale code: never started
            except SyncError as exc:
                raise CliError(f"run --sync: {exc}", EXIT_FAIL) from None
            code, job_cwd = synced.code(), synced.target
        spec = JobSpec(
            args.host, argv, name=args.name, cwd=job_cwd, env=_parse_env(args.env),
            gpus=None if queue is not None or slurm is not None else args.gpus, code=code, artifacts=artifacts,
            queue=queue, slurm=slurm,
        )  # fmt: skip
        job = await start_job(s, config, spec)
        print(job.id)
        if job.state == M.JOB_QUEUED and job.queue_position is not None:
            print(f"gputui: job {job.id} queued on {args.host} at position {job.queue_position}", file=sys.stderr)
        return EXIT_OK

    return await _with_session(args, args.host, body)


def _queue_request(args: argparse.Namespace) -> dict[str, Any] | None:
    """What ``run --queue`` (or ``--after``/``--after-ok``, which imply it) asks the host's queue for; None: run now.

    With the queue, ``--gpus N`` (a bare number) is a count: any N free GPUs; a list names the GPUs."""
    after, after_ok = args.after or [], args.after_ok or []
    if not (args.queue or after or after_ok):
        return None
    bad = [i for i in after + after_ok if not i.isdigit()]
    if bad:
        raise CliError(f"--after/--after-ok {bad[0]!r}: expected job ids (numbers)", EXIT_USAGE)
    for flag, ids in (("--after", after), ("--after-ok", after_ok)):
        if len(ids) > MAX_QUEUE_DEPS:
            raise CliError(f"{flag}: at most {MAX_QUEUE_DEPS} job ids, not {len(ids)}", EXIT_USAGE)
    gpus = args.gpus
    if gpus is not None and gpus.isdigit():
        if not 1 <= int(gpus) <= 1024:
            raise CliError(
                f"--gpus {gpus} with --queue: a bare number is a GPU count (1 to 1024); to wait for particular"
                " GPUs, list them (0,1) or name one by its UUID (gputui status --json shows them); none: no GPU",
                EXIT_USAGE,
            )
        return {"gpu_count": int(gpus), "after": after, "after_ok": after_ok}
    return {"gpus": None if gpus == "all" else gpus, "after": after, "after_ok": after_ok}


async def cmd_queue(args: argparse.Namespace) -> int:
    """``queue HOST``: the queued jobs in order and what each waits for; ``--move ID --to N`` reorders."""
    if (args.move is None) != (args.to is None):
        raise CliError("--move ID and --to N go together", EXIT_USAGE)

    async def body(s: HostSession) -> int:
        if args.move is not None:
            listing = await s.move_queued(args.move, int(args.to))
        else:
            listing = await s.list_queue()
        jobs = [M.Job.from_wire(args.host, j) for j in listing["jobs"]]
        resumed, more = listing.get("resumed_at"), int(listing.get("more") or 0)  # (an older agent: no "more")
        if args.json:
            out = [{"position": j.queue_position, "id": j.id, "name": j.name, "command": list(j.command),
                    "gpus": queue_gpus(j), "after": (j.record.get("queue") or {}).get("after"),
                    "after_ok": (j.record.get("queue") or {}).get("after_ok"), "waits_for": j.queue_reason}
                   for j in jobs]  # fmt: skip
            print(jsonout.dumps({"host": args.host, "jobs": out, "more": more, "resumed_after_reboot_at": resumed}))
            return EXIT_OK
        if resumed:
            when = datetime.datetime.fromtimestamp(resumed).strftime("%Y-%m-%d %H:%M")
            print(f"{args.host}: the queue resumed after a reboot ({when})")
        print_queue(jobs)
        if more:
            print(f"... and {more} more queued jobs (not listed)")
        return EXIT_OK

    return await _with_session(args, args.host, body)


def _host_names(config: cfg.Config, host: str | None) -> list[str]:
    if host:
        config.host(host)
        return [host]
    return list(config.hosts)


async def cmd_jobs(args: argparse.Namespace) -> int:
    config = cfg.load(args.config)
    names = _host_names(config, args.host)
    fleet = Fleet(config)
    try:
        jobs, errors = await collect_jobs(fleet, names)
    finally:
        await fleet.close()
    status = _hosts_status(errors)
    if args.json:
        print(jsonout.dumps([j.to_json() for j in jobs]))
    else:
        print_jobs(jobs)
    return status


async def cmd_history(args: argparse.Namespace) -> int:
    config = cfg.load(args.config)
    names = _host_names(config, args.host)
    fleet = Fleet(config)
    try:
        records, errors = await collect_history(fleet, config, names)
    finally:
        await fleet.close()
    status = _hosts_status(errors)
    if args.json:
        print(jsonout.dumps(records))
        return status
    print_history(records)
    return status


async def cmd_logs(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    async def body(s: HostSession) -> int:
        if args.tail is not None:
            offset, _, _ = await s.read_log(args.job, tail_lines=args.tail)
        else:
            offset = 0
        if not args.follow:
            await s.copy_log(args.job, offset, write)
            return EXIT_OK
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
        return _job_exit(await done)

    return await _with_session(args, args.host, body)


async def cmd_kill(args: argparse.Namespace) -> int:
    async def body(s: HostSession) -> int:
        if not args.yes and sys.stdin.isatty():  # the question names the job: a mistyped id shows
            await _confirm_kill(args, s)
        job = await s.kill_job(args.job, args.grace)
        if job.state == M.JOB_KILLED and job.started_at is None:
            print(f"job {job.id} on {args.host}: removed from the queue (it never started)")
        else:
            print(f"job {job.id} on {args.host}: {job.state} (exit {job.exit_code})")
        return EXIT_OK

    return await _with_session(args, args.host, body)


async def _confirm_kill(args: argparse.Namespace, s: HostSession) -> None:
    """Ask on the terminal whether to kill the job, naming it; a CliError when not (or when it is over)."""
    job = await s.get_job(args.job)
    if job.state in M.JOB_ENDED_STATES:
        raise CliError(f"job {job.id} is not running ({job.state})", EXIT_FAIL)
    it = f"job {job.id} ({safetext.clean(job.name, limit=120)}, {job.state})"
    queued = job.state == M.JOB_QUEUED
    question = (f"Remove {it} from {args.host}'s queue? [y/N] " if queued else
                f"Kill {it} on {args.host} (SIGINT, then TERM/KILL after {args.grace:g} s)? [y/N] ")  # fmt: skip
    if not await asyncio.to_thread(_ask, question):  # the loop runs on: the link stays alive while we wait
        raise CliError("not removed" if queued else "not killed", EXIT_FAIL)


async def _probe_fleet(fleet: Fleet) -> tuple[dict[str, M.HostSnapshot], int]:
    """Connect to each host, take one sample and the job list; (snapshots with cost, exit status)."""

    async def probe(s: HostSession) -> None:
        await s.sample()
        await s.list_jobs()
        if s.scheduler == "slurm":
            await s.cluster_info()

    results = await gather_hosts(fleet, list(fleet.sessions), probe)
    snaps = {name: fleet.with_cost(fleet.sessions[name].snapshot) for name in results}
    await fleet.close()
    return snaps, _hosts_status(results)


async def cmd_status(args: argparse.Namespace) -> int:
    snaps, status = await _probe_fleet(Fleet(cfg.load(args.config)))
    if args.json:
        print(jsonout.dumps({"hosts": [s.to_json() for s in snaps.values()]}))
    else:
        print_status(list(snaps.values()))
    return status


async def cmd_cost(args: argparse.Namespace) -> int:
    config = cfg.load(args.config)
    since = 0.0
    if args.since:
        try:
            since = datetime.datetime.fromisoformat(args.since).timestamp()
        except ValueError:
            raise CliError(f"--since {args.since!r}: expected a date like 2026-11-01", EXIT_USAGE) from None
    fleet = Fleet(config)
    snaps, status = await _probe_fleet(fleet)
    now = time.time()
    hosts, accrued = [], {}
    for name, snap in snaps.items():
        c = snap.cost or M.CostInfo()
        live = snap.state == M.CONNECTED
        accrued[name] = fleet.ledger.spent(name, now, live, since=since)
        hosts.append({"name": name, "state": snap.state, **c.to_json(), "accrued": accrued[name],
                      "by_day": fleet.ledger.by_day(name, now, live, since=since)})  # fmt: skip
    spend = fleet_spend(list(snaps.values()), config, accrued)
    if args.json:
        one = spend.single  # mixed currencies are never added up: the totals are per currency then
        out = {"currency": one and one.currency, "hosts": hosts, "total": one and one.accrued,
               "today": one and one.today, "month": one and one.month, "burn_per_hour": one and one.burn_per_hour,
               "by_currency": [s.to_json() for s in spend.by_currency],
               "budget": [a.to_json() for a in spend.alerts]}  # fmt: skip
        print(jsonout.dumps(out))
        return status
    print_cost(hosts, spend)
    for alert in spend.alerts:
        print(f"budget: {alert.message}", file=sys.stderr)
    return status


def _ask(question: str) -> bool:
    return input(question).strip().lower() in ("y", "yes")


async def _artifacts_first(args: argparse.Namespace, session: HostSession, host: cfg.HostConfig) -> None:
    """Before a release: the artifacts changed on the host since the last pull, pulled when asked (--pull, or
    yes on a terminal); a CliError (not released) when some would be lost and nobody said so."""
    from .core.artifacts import check, pull_artifacts
    from .core.pull import PullError

    if args.pull is False:
        return
    found = await check(session, host)
    if not found.at_risk:
        return
    print(f"gputui: {args.host}: {safetext.clean(found.summary(), limit=2000)}", file=sys.stderr)
    if args.pull is None:
        if args.yes or not sys.stdin.isatty():
            raise CliError(
                f"not released: {args.host} has artifacts that would be lost; pass --pull to fetch them "
                "first or --no-pull to release without them", EXIT_FAIL,
            )  # fmt: skip
        if not _ask(f"Pull them to {args.to}/{args.host}/ first? [y/N] "):
            if not _ask("Release without them? They will be lost. [y/N] "):
                raise CliError("not released", EXIT_FAIL)
            return
    if found.problems:
        raise CliError(
            f"not released: {args.host}'s artifacts could not all be checked (--no-pull releases anyway)"
        )
    try:
        outcomes = await pull_artifacts(session, found.unpulled, args.to, _progress_printer())
    except (PullError, OSError) as exc:
        raise CliError(f"not released: pulling the artifacts failed: {exc}") from None
    kept = [o for o in outcomes if o.status == "newer here"]
    if kept:
        raise CliError(f"not released: {kept[0].target} here is newer than the host's {kept[0].rel} "
                       "(move it away, or --no-pull)")  # fmt: skip
    print(f"gputui: pulled {len(outcomes)} artifact files to {args.to}/{args.host}/", file=sys.stderr)


async def cmd_release(args: argparse.Namespace) -> int:
    config = cfg.load(args.config)
    host = config.host(args.host)
    try:
        check_configured(host)
    except ReleaseError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if not args.yes and not sys.stdin.isatty():
        raise CliError(
            f"releasing {args.host} needs confirmation: run on a terminal or pass --yes", EXIT_USAGE
        )
    fleet = Fleet(config)
    session = fleet.session(args.host)
    try:
        await session.start()
        await _artifacts_first(args, session, host)
        if not args.yes and not _ask(
            f"Release {args.host}? This stops billing by stopping or terminating the instance. [y/N] "
        ):
            raise CliError("not released", EXIT_FAIL)
        result = await release_host(session, host, fleet.ledger, ReleaseRequest(args.host, force=args.force))
    except ReleaseError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    finally:
        await fleet.close()
    for step in result.steps:
        print(f"[{step.where}] {' '.join(step.argv)} -> exit {step.exit_code}")
        if step.output:
            print("  " + step.output.replace("\n", "\n  "))
    print(f"{args.host}: released")
    return EXIT_OK


async def cmd_autostop(args: argparse.Namespace) -> int:
    async def body(s: HostSession) -> int:
        try:
            if args.cancel:
                await autostop.cancel(s)
            else:
                await autostop.snooze(s, args.snooze)
        except autostop.NoAutostop as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        if args.cancel:
            print(f"{args.host}: autostop cancelled until the host reboots or its settings change")
        else:
            print(f"{args.host}: autostop snoozed for {args.snooze:g} min")
        return EXIT_OK

    return await _with_session(args, args.host, body)


async def cmd_notify(args: argparse.Namespace) -> int:
    """``notify HOST --test``: the host sends a test message with its [notify] settings now."""
    settings = autostop.notify_settings(cfg.load(args.config).host(args.host))
    if settings is None:
        raise CliError(f"{args.host} has no notifications: set [notify] webhook, ntfy or command in the config", EXIT_USAGE)

    async def body(s: HostSession) -> int:
        result = await s.notify_test(settings)
        if not result.get("sent"):
            raise CliError(f"{args.host}: test notification failed: {result.get('error')}", EXIT_FAIL)
        print(f"{args.host}: test notification sent")
        return EXIT_OK

    return await _with_session(args, args.host, body)


async def cmd_doctor(args: argparse.Namespace) -> int:
    if not 0 < args.timeout <= 600:
        raise CliError("--timeout must be between 0 and 600 seconds", EXIT_USAGE)
    config = cfg.load(args.config)
    names = _host_names(config, args.host)
    fleet = Fleet(config)
    results = await gather_hosts(
        fleet, names, lambda s: D.run_doctor(s, args.python, args.timeout), limit=D.HOSTS_AT_ONCE
    )
    await fleet.close()
    reports = [
        D.DoctorReport(name, error=str(res)) if isinstance(res, Exception) else res
        for name, res in results.items()
    ]
    if args.json:
        print(jsonout.dumps({"hosts": [r.to_json() for r in reports]}))
    else:
        print("\n\n".join(D.format_report(r) for r in reports))
    return _hosts_status(results) or (EXIT_FAIL if any(r.failed for r in reports) else EXIT_OK)


def exit_status(exc: BaseException) -> int:
    """The README's exit status for an error (the one rule for single- and multi-host commands)."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, cfg.ConfigError) or (isinstance(exc, HostError) and exc.kind == "config"):
        return EXIT_USAGE
    if isinstance(exc, HostError):
        return EXIT_HOST
    if isinstance(exc, AgentError):
        return EXIT_NOT_FOUND if exc.code == "not_found" else EXIT_FAIL
    return EXIT_UNREACHABLE  # HostUnavailable, LinkClosed, OSError: no answer


def _hosts_status(results: Mapping[str, object]) -> int:
    """Report each host that gave an error on stderr; 0 when none did, else the highest of their statuses.

    The hosts that answered are still shown: a multi-host command is a report, its status says what is missing.
    """
    status = EXIT_OK
    for name, res in results.items():
        if isinstance(res, Exception):
            print(f"gputui: {name}: {res}", file=sys.stderr)
            status = max(status, exit_status(res))
    return status


async def cmd_trust(args: argparse.Namespace) -> int:
    """Fetch an SSH host's key, show its fingerprint, and (once confirmed) append it to known_hosts."""
    from .core import trust as T  # asyncssh is only imported when an SSH host is used

    try:
        check = await T.check_host_key(cfg.load(args.config), args.host)
    except T.NoHostKey as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    print(f"{args.host} ({check.target.pattern}) presents {check.description}")
    if check.trusted_in is not None:
        print(f"already trusted in {check.trusted_in}")
        return EXIT_OK
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("not trusted: confirm on a terminal, or pass --yes", EXIT_USAGE)
        print("Compare it with the host's own: ssh-keygen -lf /etc/ssh/ssh_host_<type>_key.pub (on the host)")
        if input(f"Trust this key and add it to {check.path}? [y/N] ").strip().lower() not in ("y", "yes"):
            raise CliError("not trusted", EXIT_FAIL)
    print(f"added {check.target.pattern} to {T.trust(check, hashed=args.hash)}")
    return EXIT_OK


def _progress_printer() -> Callable[[str, int, int], None] | None:
    """A progress line on stderr when it is a terminal (redrawn at most ten times a second); else None."""
    if not sys.stderr.isatty():
        return None
    raw = getattr(sys.stderr, "stream", sys.stderr)  # past the terminal guard: our own control sequences only
    last = [0.0]

    def show(name: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1 and done < total:
            return
        last[0] = now
        pct = 100.0 * done / total if total else 100.0
        shown = safetext.clean(name)[-40:]  # a host's file name is data: cleaned
        end = "\n" if done >= total else ""
        raw.write(f"\r\x1b[K{shown}  {done / 1e6:,.1f}/{total / 1e6:,.1f} MB  {pct:5.1f}%{end}")
        raw.flush()

    return show


async def cmd_pull(args: argparse.Namespace) -> int:
    """Copy files from a host here: resumable, verified by sha256, never over a newer local file."""
    from .core.pull import PullError, pull

    specs, dest = args.paths, None
    if len(specs) > 1:
        specs, dest = specs[:-1], specs[-1]

    async def body(s: HostSession) -> int:
        try:
            outcomes = await pull(s, specs, dest, force=args.force, on_progress=_progress_printer())
        except (LinkClosed, HostUnavailable):
            raise
        except (PullError, OSError) as exc:  # e.g. no room or no permission here
            raise CliError(f"pull: {safetext.clean(exc)}") from None
        status = EXIT_OK
        for o in outcomes:  # a host's file name is data: one line each, control characters escaped
            if o.status == "newer here":
                print(
                    f"gputui: skipped {safetext.clean(o.target)}: the local file is newer (--force overwrites it)",
                    file=sys.stderr,
                )
                status = EXIT_FAIL
            else:
                print(f"{o.status}: {safetext.clean(o.target)} ({o.size:,} bytes)")
        return status

    return await _with_session(args, args.host, body)


async def _sync_tree(s: HostSession, src: str, target: str | None, delete: bool) -> Any:
    """Sync ``src`` to the host, reporting notes and a summary on stderr; the SyncResult."""
    from .core.pull import PullError
    from .core.sync import SyncError, sync

    try:
        res = await sync(s, src, target, delete=delete, on_progress=_progress_printer())
    except (LinkClosed, HostUnavailable):
        raise
    except (SyncError, PullError, OSError) as exc:  # e.g. a local file unreadable, a host's bad answer
        raise CliError(f"sync: {safetext.clean(exc)}") from None
    for note in res.notes:
        print(f"gputui: {safetext.clean(note)}", file=sys.stderr)
    print(f"gputui: synced {os.path.abspath(src)} to {s.name}:{safetext.clean(res.target)}: {res.sent} of {res.files} files sent "
          f"({res.bytes_sent:,} bytes), {res.deleted} deleted; tree {res.tree_sha256[:12]}", file=sys.stderr)  # fmt: skip
    return res


async def cmd_sync(args: argparse.Namespace) -> int:
    """Copy a local tree to a directory on the host: only changed files travel."""

    async def body(s: HostSession) -> int:
        res = await _sync_tree(s, args.src, args.to, args.delete)
        print(res.target)
        return EXIT_FAIL if res.missing or any(n.startswith("not sent") for n in res.notes) else EXIT_OK

    return await _with_session(args, args.host, body)


async def cmd_forward(args: argparse.Namespace) -> int:
    """Reach a port on the host at 127.0.0.1 here until Ctrl-C; survives reconnects."""
    if cfg.load(args.config).host(args.host).transport == "local":
        print(
            f"{args.host} is this machine: open http://127.0.0.1:{args.remote_port}/ directly (no forward needed)"
        )
        return EXIT_OK
    from .core.forward import Forward, ForwardError

    async def body(s: HostSession) -> int:
        fwd = Forward(s, args.remote_port, args.local_port or 0,
                      lambda msg: print(f"gputui: {safetext.clean(msg)}", file=sys.stderr))  # fmt: skip
        try:
            url = await fwd.start()
        except ForwardError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        print(f"{url} -> {args.host} port {args.remote_port} (Ctrl-C stops)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await fwd.close()
        return EXIT_OK

    return await _with_session(args, args.host, body)


# --- entry ----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gputui",
        description="Watch, run and release jobs on GPU hosts.",
        epilog="Without a command gputui opens the app (on a terminal) or prints `gputui status` (when piped).",
    )
    p.add_argument("--config", help=CONFIG_HELP)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    r = sub.add_parser(
        "run", help="start a job in tmux on a host; prints its id", usage="%(prog)s [OPTIONS] host -- CMD [ARG ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=RUN_EXAMPLES,
    )  # fmt: skip
    r.add_argument("host")
    r.add_argument("--name", help="display name (free text)")
    r.add_argument("--gpus", help="GPU selection for CUDA_VISIBLE_DEVICES: all, none, or e.g. 0,1; "
                   "with --queue a bare number N is a count: any N free GPUs")  # fmt: skip
    r.add_argument("--queue", action="store_true",
                   help="wait on the host until the GPUs are free (no other job, no foreign process, idle)")  # fmt: skip
    r.add_argument("--after", action="extend", nargs="+", metavar="ID", help="queue: start after these jobs end")
    r.add_argument("--after-ok", action="extend", nargs="+", metavar="ID",
                   help="queue: start only after these jobs succeeded (else it never starts, and says why)")  # fmt: skip
    r.add_argument("--cwd", help="working directory on the host (default: here for local, ~ over SSH)")
    r.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment (repeatable)")
    r.add_argument("--sync", nargs="?", const=".", metavar="SRC",
                   help="sync SRC (default: here) to the host first and run the job in the synced dir")  # fmt: skip
    r.add_argument("--artifacts", action="append", default=[], metavar="PATH[,PATH]",
                   help="files to bring back before release, relative to the job's dir (repeatable)")  # fmt: skip
    sl = r.add_argument_group("Slurm hosts (scheduler = \"slurm\"): --gpus is then the GPUs per node")
    sl.add_argument("--nodes", type=_bounded(1, 100000, integer=True), metavar="N", help="nodes (sbatch --nodes)")
    sl.add_argument("--partition", metavar="P", help="partition (sbatch --partition)")
    sl.add_argument("--time", metavar="T", help="time limit, e.g. 30, 2:00:00, 1-0 (sbatch --time)")
    sl.add_argument("--sbatch-arg", action="append", metavar="OPT",
                    help="extra sbatch option, repeatable; write it with =, e.g. --sbatch-arg=--qos=high")  # fmt: skip
    r.add_argument("command", nargs="*", metavar="CMD",
                   help="the job's argv, after -- (passed untouched, never through a shell)")  # fmt: skip
    r.set_defaults(func=cmd_run)

    j = sub.add_parser("jobs", help="list jobs")
    j.add_argument("host", nargs="?")
    j.add_argument("--json", action="store_true")
    j.set_defaults(func=cmd_jobs)

    hi = sub.add_parser(
        "history", help="finished runs with their records: git, GPUs, usage, cost, final metrics"
    )
    hi.add_argument("host", nargs="?")
    hi.add_argument("--json", action="store_true")
    hi.set_defaults(func=cmd_history)

    lg = sub.add_parser("logs", help="print a job's output")
    lg.add_argument("host")
    lg.add_argument("job")
    lg.add_argument(
        "-f", "--follow", action="store_true", help="follow until the job ends; exit with its status"
    )
    lg.add_argument(
        "--tail", type=_bounded(0, 10_000_000, integer=True), metavar="N", help="start at the last N lines"
    )
    lg.set_defaults(func=cmd_logs)

    k = sub.add_parser("kill", help="stop a job: SIGINT, then SIGTERM, then SIGKILL")
    k.add_argument("host")
    k.add_argument("job")
    k.add_argument("--grace", type=_bounded(0, MAX_KILL_GRACE_S, unit=" seconds"), default=10.0, metavar="S",
                   help=f"seconds between signals, 0 to {MAX_KILL_GRACE_S:g} (default 10)")  # fmt: skip
    k.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    k.set_defaults(func=cmd_kill)

    qu = sub.add_parser("queue", help="the host's queued jobs: position and what each waits for; reorder")
    qu.add_argument("host")
    qu.add_argument("--json", action="store_true")
    qu.add_argument("--move", metavar="ID", help="move this queued job ...")
    qu.add_argument("--to", type=_bounded(1, 1_000_000, integer=True), metavar="N", help="... to position N (1 = next)")
    qu.set_defaults(func=cmd_queue)

    st = sub.add_parser("status", help="hosts, GPUs and jobs")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    tr = sub.add_parser("trust", help="show an SSH host's key; add it to known_hosts (asks first)")
    tr.add_argument("host")
    tr.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    tr.add_argument("--hash", action="store_true", help="store the host name hashed (HashKnownHosts)")
    tr.set_defaults(func=cmd_trust)

    co = sub.add_parser("cost", help="hourly price, accrued cost per host and day, budgets")
    co.add_argument("--json", action="store_true")
    co.add_argument("--since", metavar="DATE", help="count from this date (YYYY-MM-DD) on")
    co.set_defaults(func=cmd_cost)

    rl = sub.add_parser("release", help="stop paying for a host: run its release commands (asks first)")
    rl.add_argument("host")
    rl.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    rl.add_argument("--force", action="store_true", help="release even while jobs run")
    rp = rl.add_mutually_exclusive_group()
    rp.add_argument("--pull", action="store_true", dest="pull", default=None,
                    help="pull artifacts changed since the last pull first (release only if all arrive)")  # fmt: skip
    rp.add_argument("--no-pull", action="store_false", dest="pull", help="release without pulling artifacts")
    rl.add_argument("--to", default=ARTIFACTS_DEST, metavar="DIR",
                    help=f"where --pull puts them: DIR/HOST/JOB/PATH (default: ./{ARTIFACTS_DEST})")  # fmt: skip
    rl.set_defaults(func=cmd_release)

    au = sub.add_parser("autostop", help="snooze or cancel a host's idle autostop")
    au.add_argument("host")
    g = au.add_mutually_exclusive_group(required=True)
    g.add_argument("--snooze", type=_bounded(0, autostop.MAX_SNOOZE_MIN, low_ok=False, unit=" minutes"), metavar="MIN",
                   help=f"postpone autostop: the idle window restarts after MIN minutes (at most {autostop.MAX_SNOOZE_MIN})")  # fmt: skip
    g.add_argument("--cancel", action="store_true", help="no autostop until the host reboots")
    au.set_defaults(func=cmd_autostop)

    nt = sub.add_parser("notify", help="send a test notification from a host with its [notify] settings")
    nt.add_argument("host")
    nt.add_argument("--test", action="store_true", required=True, help="send a test message now")
    nt.set_defaults(func=cmd_notify)

    sy = sub.add_parser("sync", help="copy a local tree to the host: only changed files travel")
    sy.add_argument("host")
    sy.add_argument("src", nargs="?", default=".", help="local directory (default: here)")
    sy.add_argument(
        "--to", metavar="DIR", help="directory on the host (default: ~/gputui-work/<name of SRC>)"
    )
    sy.add_argument("--delete", action="store_true",
                    help="remove files an earlier sync put there that SRC no longer has")  # fmt: skip
    sy.set_defaults(func=cmd_sync)

    fw = sub.add_parser("forward", help="reach a port on the host at 127.0.0.1 here (TensorBoard, Jupyter)")
    fw.add_argument("host")
    fw.add_argument("remote_port", type=_bounded(1, 65535, integer=True), metavar="REMOTE_PORT")
    fw.add_argument("local_port", type=_bounded(0, 65535, integer=True), nargs="?", metavar="LOCAL_PORT",
                    help="port here (default: any free one)")  # fmt: skip
    fw.set_defaults(func=cmd_forward)

    pu = sub.add_parser("pull", help="copy files from a host here: resumable, sha256-checked")
    pu.add_argument("host")
    pu.add_argument("paths", nargs="+", metavar="[JOB:]PATH... [DEST]",
                    help="files, dirs or globs on the host (relative to job JOB's dir, else to ~), then DEST")  # fmt: skip
    pu.add_argument("--force", action="store_true", help="overwrite local files even when they are newer")
    pu.set_defaults(func=cmd_pull)

    dr = sub.add_parser("doctor", help="check driver, CUDA, torch, tmux, disk: ok/warn/fail with the fix")
    dr.add_argument("host", nargs="?", help="one host (default: every host)")
    dr.add_argument("--json", action="store_true")
    dr.add_argument(
        "--python", help="the jobs' interpreter on the host (default: python, else python3, on PATH)"
    )
    dr.add_argument("--timeout", type=float, default=D.DEFAULT_TIMEOUT_S, metavar="S",
                    help="seconds the torch probe may take (default 60)")  # fmt: skip
    dr.set_defaults(func=cmd_doctor)
    _document(sub)
    return p


CONFIG_HELP = "config file (default: $GPUTUI_CONFIG, else ~/.config/gputui/config.toml)"
RUN_EXAMPLES = """examples:
  gputui run local -- python train.py --epochs 10
  gputui run gpu1 --sync --name exp1 --gpus 0,1 -- python train.py
  gputui run gpu1 --queue --gpus 2 -- torchrun --nproc-per-node=2 train.py"""
SHARED_HELP = {
    "host": "a host from the config (with no config: local); gputui status lists them",
    "job": "the job's id, as gputui run printed it; gputui jobs HOST lists them",
    "json": "print JSON (its keys are in README.md)",
    "remote_port": "the port on the host, e.g. 6006 for TensorBoard",
}


def _document(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Each command's --help opens with what it does, and the arguments the commands share say what they are;
    ``--config`` works after the command too (``gputui status --config c.toml``)."""
    for listed in sub._choices_actions:
        parser = sub.choices[listed.dest]
        parser.description = parser.description or listed.help
        parser.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
        for action in parser._actions:
            if action.help is None:
                action.help = SHARED_HELP.get(action.dest)
                if action.dest == "host" and action.nargs == "?":
                    action.help = "one host (default: every host)"


def main(argv: list[str] | None = None) -> None:
    """Run one command; a reader that goes away (``gputui status --json | head``) ends it quietly."""
    try:
        try:
            _main(argv)
            code: Any = EXIT_OK
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()
    except BrokenPipeError as exc:
        if not _stdout_closed():
            print(f"gputui: {exc}", file=sys.stderr)
            sys.exit(EXIT_FAIL)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        code = EXIT_PIPE
    sys.exit(code)


def _stdout_closed() -> bool:
    """Whether nobody reads our stdout any more (a pipe or socket whose other end is gone)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), 0)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError):
        return False


def _check_run_command(argv: list[str], before: list[str], extra: list[str], after: list[str] | None) -> None:
    """Refuse a ``run`` whose job command argparse would split: without ``--`` an option-like word in the
    command (``python train.py --name x``) is taken as gputui's own, or the words before ``--`` are dropped."""
    if after is not None and before:
        raise SystemExit(_usage_error(
            f"run: {shlex.join(before)!r} comes before -- and would be dropped: put the whole command after --, "
            f"e.g. gputui run HOST -- {shlex.join([*before, *after])}"
        ))  # fmt: skip
    if after is None and (extra or (before and argv[len(argv) - len(before) :] != before)):
        taken = f" ({shlex.join(extra)!r} is not an option of gputui run)" if extra else ""
        raise SystemExit(_usage_error(
            f"run: the job's command holds options that gputui would take as its own{taken}: "
            "put the command after --, e.g. gputui run HOST --name exp1 -- python train.py --lr 3e-4"
        ))  # fmt: skip


def _usage_error(message: str) -> int:
    print(f"gputui: {message}", file=sys.stderr)
    return EXIT_USAGE


def _main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] | None = None
    if "--" in argv:  # the job's argv: never let argparse look at it
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.cmd == "run":
        _check_run_command(argv, args.command, extra, command)
    if extra:
        parser.parse_args(argv)  # argparse's own error for them
    if command is not None:
        if args.cmd != "run":
            parser.error("'--' is only used with: gputui run HOST -- CMD [ARG ...]")
        args.command = command
    if args.cmd is None:
        if sys.stdin.isatty() and sys.stdout.isatty():
            sys.exit(launch.run_app(args.config))
        args = parser.parse_args([*argv, "status"])  # not a terminal: print the status instead
    safetext.guard_terminal()  # host text printed to a terminal is data: no raw control characters
    try:
        code = asyncio.run(args.func(args))
    except KeyboardInterrupt:
        code = 130
    except (cfg.ConfigError, CliError, HostError, HostUnavailable, LinkClosed, AgentError) as exc:
        print(f"gputui: {exc}", file=sys.stderr)
        code = exit_status(exc)
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    sys.exit(code)

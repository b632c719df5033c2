"""The fleet: ``status``, ``cost``, ``doctor``, ``trust`` — each command's parser beside its handler."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import io
import os
import sys
import time
from pathlib import Path

from ..core import jsonout, safetext
from ..core.config import file as cfg
from ..core.errors import ExitStatus
from ..core.hosts import doctor as host_doctor
from ..core.hosts.fleet import Fleet
from ..core.money import autostop
from ..core.money.spend import fleet_spend
from ..core.session import model as M
from ..core.session.gather import gather_hosts
from ..core.session.host import HostSession
from ..tables import print_cost, print_status, status_line
from .common import CliError, add_direct, ask, bounded, host_names, hosts_status, open_fleet


async def probe_fleet(fleet: Fleet, look_every_s: float = 0.0) -> tuple[dict[str, M.HostSnapshot], dict[str, object]]:
    """Connect to each host, take one sample and the job list; (snapshots with cost, each host's outcome). The
    providers of hosts that do not answer are asked at most every ``look_every_s``."""

    async def probe(s: HostSession) -> None:
        await s.sample()
        await s.list_jobs()
        if s.scheduler == "slurm":
            await s.cluster_info()

    results = await gather_hosts(fleet, list(fleet.sessions), probe)
    await fleet.look_down(look_every_s)  # a host that does not answer: stopped? preempted? (its provider, with your key)
    snaps = {name: fleet.with_cost(fleet.sessions[name].snapshot) for name in results}
    return snaps, dict(results)


def show_status(snaps: dict[str, M.HostSnapshot], results: dict[str, object], form: str) -> int:
    """Print the status (``form``: ``json``, ``short`` or ``text``) and each host's error; the exit status."""
    status = hosts_status(results)
    if form in ("json", "json-line"):
        print(jsonout.dumps({"hosts": [s.to_json() for s in snaps.values()]}, indent=2 if form == "json" else None))
    elif form == "short":
        print("\n".join(status_line(s) for s in snaps.values()))
    else:
        print_status(list(snaps.values()))
    return status


def status_form(args: argparse.Namespace) -> str:
    return "json" if args.json else "short" if args.short else "text"


async def cmd_status(args: argparse.Namespace) -> int:
    if args.now:
        return status_not_now(args)
    if args.watch is not None:
        return await watch_status(args)
    async with open_fleet(args) as fleet:
        snaps, results = await probe_fleet(fleet)
    return show_status(snaps, results, status_form(args))


def status_not_now(args: argparse.Namespace) -> int:
    """``status --now`` that no session service answered (it answers that form itself): none is to be used, or
    none runs yet (one is started as this command ends: the next ``--now`` gets an answer)."""
    from ..service import client

    if args.direct or os.environ.get("GPUTUI_DIRECT"):
        raise CliError("--now answers from the session service, which --direct and GPUTUI_DIRECT=1 turn off",
                       ExitStatus.USAGE)
    found = client.usable(args.config)
    if found is not None:
        client.start(*found)
    raise CliError("no session service answered yet; one is starting: ask again in a moment (or without --now, "
                   "which connects from this command)", ExitStatus.UNREACHABLE)


#: A host that does not answer: its provider is asked what became of it at most this often while watching.
WATCH_LOOK_EVERY_S = 60.0


async def watch_status(args: argparse.Namespace) -> int:
    """``status --watch S`` where no session service answers (client.watch): the status again every S seconds
    from this one process, which keeps each host's connection between rounds (a host that does not answer is
    tried again at most every 10 s): what ``watch -n S gputui status`` shows, without a Python start per round.
    On a terminal each round replaces the last under a heading; to a pipe the rounds follow one another
    (``--json``: one line each)."""
    from ..service import client

    form, tty = status_form(args), sys.stdout.isatty()
    async with open_fleet(args) as fleet:
        while True:
            snaps, results = await probe_fleet(fleet, WATCH_LOOK_EVERY_S)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out if tty else sys.stderr):
                show_status(snaps, results, "json-line" if form == "json" and not tty else form)  # errors stay on screen
            if tty:  # drawn over the last round from the top, each line and then the rest cleared: no flicker
                safetext.redraw(sys.stdout, f"{client.watch_heading(args.watch, form)}\n\n{out.getvalue()}")
            else:
                sys.stdout.write(out.getvalue() + ("\n" if form == "text" else ""))  # a blank line between rounds
                sys.stdout.flush()
            await asyncio.sleep(args.watch)


async def cmd_cost(args: argparse.Namespace) -> int:
    since = 0.0
    if args.since:
        try:
            since = datetime.datetime.fromisoformat(args.since).timestamp()
        except ValueError:
            raise CliError(f"--since {args.since!r}: expected a date like 2026-11-01", ExitStatus.USAGE) from None
    async with open_fleet(args) as fleet:
        snaps, results = await probe_fleet(fleet)
    status = hosts_status(results)
    now = time.time()
    hosts, accrued = [], {}
    for name, snap in snaps.items():
        c = snap.cost or M.CostInfo()
        live = snap.state == M.CONNECTED
        accrued[name] = fleet.ledger.spent(name, now, live, since=since)
        hosts.append({"name": name, "state": snap.state, **c.to_json(), "accrued": accrued[name],
                      "by_day": fleet.ledger.by_day(name, now, live, since=since)})
    spend = fleet_spend(list(snaps.values()), fleet.config, accrued)
    if args.json:
        one = spend.single  # mixed currencies are never added up: the totals are per currency then
        out = {"currency": one and one.currency, "hosts": hosts, "total": one and one.accrued,
               "today": one and one.today, "month": one and one.month, "burn_per_hour": one and one.burn_per_hour,
               "by_currency": [s.to_json() for s in spend.by_currency],
               "budget": [a.to_json() for a in spend.alerts]}
        print(jsonout.dumps(out))
        return status
    print_cost(hosts, spend)
    for alert in spend.alerts:
        print(f"budget: {alert.message}", file=sys.stderr)
    return status


async def cmd_doctor(args: argparse.Namespace) -> int:
    if not 0 < args.timeout <= 600:
        raise CliError("--timeout must be between 0 and 600 seconds", ExitStatus.USAGE)
    async with open_fleet(args) as fleet:
        urls = autostop.api_urls(fleet.config)
        results = await gather_hosts(
            fleet, host_names(fleet.config, args.host), lambda s: host_doctor.run_doctor(s, args.python, args.timeout, fleet.config.hosts[s.name], urls),
            limit=host_doctor.HOSTS_AT_ONCE,
        )
    reports = [
        host_doctor.DoctorReport(name, error=str(res)) if isinstance(res, Exception) else res
        for name, res in results.items()
    ]
    if args.json:
        print(jsonout.dumps({"hosts": [r.to_json() for r in reports]}))
    else:
        print("\n\n".join(host_doctor.format_report(r) for r in reports))
    return hosts_status(results) or (ExitStatus.FAILED if any(r.failed for r in reports) else ExitStatus.OK)


async def cmd_service(args: argparse.Namespace) -> int:
    """What the session service of this config holds (hosts, connections, requests, memory, uptime), or stop it."""
    from ..service import client

    config = client.config_path(args.config)
    info = client.ask(config, {"op": "info" if args.action == "status" else "stop"})
    if info is None and client.quiet:
        pid = client.quiet[0]
        if args.action == "status":
            raise CliError(f"the session service for {config} (pid {pid}) takes connections but said nothing for "
                           f"{client.QUIET_S:g} s (stopped, or stuck): gputui service stop ends it")
        await end_service(pid)
        print(f"session service for {config} (pid {pid}) did not answer: ended it")
        return ExitStatus.OK
    if info is None and client.refused:
        raise CliError(client.refused[0])
    if info is None:
        print(f"no session service runs for {config}" + (": nothing to stop" if args.action == "stop" else ""))
        return ExitStatus.OK
    if args.action == "stop":
        print(f"session service for {config} stopped")
    elif args.json:
        print(jsonout.dumps(info))
    else:
        hosts = ", ".join(f"{name} {state}" for name, state in info.get("hosts", {}).items()) or "none yet"
        up = time.time() - float(info.get("started") or time.time())
        print(f"session service for {info.get('config')}: pid {info.get('pid')}, up {up / 60:.0f} min, "
              f"{info.get('requests')} requests, {info.get('rss_mib')} MiB, build {info.get('build')}; exits after "
              f"{info.get('idle_minutes'):g} min without a command\nhosts: {hosts}")
    return ExitStatus.OK


#: A stuck service asked to end (SIGTERM) is killed when it has not gone within this long.
END_WAIT_S = 3.0


async def end_service(pid: int) -> None:
    """End the session service ``pid`` that does not answer (the peer of its own socket, so this user's):
    SIGTERM, with SIGCONT for a stopped one, then SIGKILL if it has not gone within ``END_WAIT_S``. A pid
    whose command line is not the service's is left alone."""
    import signal

    def alive() -> bool:
        try:
            return b"gputui.service.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    if not alive():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + END_WAIT_S
        while alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if alive():
            os.kill(pid, signal.SIGKILL)


async def cmd_trust(args: argparse.Namespace) -> int:
    """Fetch an SSH host's key, show its fingerprint, and (once confirmed) append it to known_hosts."""
    from ..core.hosts import trust as host_trust  # asyncssh is only imported when an SSH host is used

    check = await host_trust.check_host_key(cfg.load(args.config), args.host)  # NoHostKey: a usage error
    print(f"{args.host} ({check.target.pattern}) presents {check.description}")
    if check.trusted_in is not None:
        print(f"already trusted in {check.trusted_in}")
        return ExitStatus.OK
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("not trusted: confirm on a terminal, or pass --yes", ExitStatus.USAGE)
        print("Compare it with the host's own: ssh-keygen -lf /etc/ssh/ssh_host_<type>_key.pub (on the host)")
        if not ask(f"Trust this key and add it to {check.path}? [y/N] "):
            raise CliError("not trusted")
    print(f"added {check.target.pattern} to {host_trust.trust(check, hashed=args.hash)}")
    return ExitStatus.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    st = sub.add_parser("status", help="hosts, GPUs and jobs")
    shape = st.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true")
    shape.add_argument("--short", action="store_true",
                       help="one line per host (state, GPUs, jobs, price, idle): for a tmux status line or a prompt")
    live = st.add_mutually_exclusive_group()
    live.add_argument("--now", action="store_true",
                      help="answer at once with what the session service has, waiting on no host (for a shell "
                      "prompt or a tmux status line); with none running yet: nothing, exit 3, and one starts")
    live.add_argument("--watch", type=bounded(0.2, 86400, unit=" s"), metavar="S", nargs="?", const=2.0,
                      help="show it again every S seconds (default 2): each round the session service's answer, "
                      "or, with none, from this process keeping the hosts' connections (far lighter than watch -n S "
                      "gputui status); --json to a pipe: one line per round")
    add_direct(st)
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

    dr = sub.add_parser("doctor", help="check driver, CUDA, torch, tmux, disk: ok/warn/fail with the fix")
    dr.add_argument("host", nargs="?", help="one host (default: every host)")
    dr.add_argument("--json", action="store_true")
    dr.add_argument("--python", help="the jobs' interpreter on the host (default: python, else python3, on PATH)")
    dr.add_argument("--timeout", type=float, default=host_doctor.DEFAULT_TIMEOUT_S, metavar="S",
                    help="seconds the torch probe may take (default 60)")
    dr.set_defaults(func=cmd_doctor)

    sv = sub.add_parser("service", help="the session service that keeps connections warm for status, jobs, "
                        "history, logs, kill -y and release -y: show or stop it")
    sv.add_argument("action", nargs="?", choices=("status", "stop"), default="status",
                    help="status (default): what it holds; stop: close its connections and end it")
    sv.add_argument("--json", action="store_true")
    sv.set_defaults(func=cmd_service)

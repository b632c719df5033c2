"""The bill: ``release`` (artifacts first), ``start`` (a stopped instance, again), ``autostop``, ``notify``; each
parser beside its handler."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import safetext
from ..core.config import file as cfg
from ..core.errors import ExitStatus
from ..core.files.artifacts import DEFAULT_DEST as ARTIFACTS_DEST
from ..core.money import autostop
from ..core.money.cost import Ledger
from ..core.money.release import ReleaseError, ReleaseRequest, check_configured, check_release, release_host
from ..core.session.host import HostSession
from .common import CliError, add_direct, ask, bounded, open_fleet, progress_printer, with_session

if TYPE_CHECKING:
    from ..core.hosts.fleet import Fleet


async def _artifacts_first(
    args: argparse.Namespace, session: HostSession, host: cfg.HostConfig, warn: Callable[[str], None]
) -> None:
    """Before a release: the artifacts changed on the host since the last pull, pulled when asked (--pull, or
    yes on a terminal); a CliError (not released) when some would be lost and nobody said so."""
    from ..core.files.artifacts import check, pull_artifacts
    from ..core.files.pull import PullError
    from ..core.files.wire import WireError

    if args.pull is False:
        return
    found = await check(session, host)
    if not found.at_risk:
        return
    warn(f"gputui: {args.host}: {safetext.clean(found.summary(), limit=2000)}")
    if args.pull is None:
        if args.yes or not sys.stdin.isatty():
            raise CliError(
                f"not released: {args.host} has artifacts that would be lost; pass --pull to fetch them "
                "first or --no-pull to release without them"
            )
        if not ask(f"Pull them to {args.to}/{args.host}/ first? [y/N] "):
            if not ask("Release without them? They will be lost. [y/N] "):
                raise CliError("not released")
            return
    if found.problems:
        raise CliError(f"not released: {args.host}'s artifacts could not all be checked (--no-pull releases anyway)")
    try:
        with progress_printer() as show:
            outcomes = await pull_artifacts(session, found.unpulled, args.to, show)
    except (PullError, WireError, OSError) as exc:
        raise CliError(f"not released: pulling the artifacts failed: {exc}") from None
    kept = [o for o in outcomes if o.status == "newer here"]
    if kept:
        raise CliError(f"not released: {kept[0].target} here is newer than the host's {kept[0].rel} "
                       "(move it away, or --no-pull)")
    warn(f"gputui: pulled {len(outcomes)} artifact files to {args.to}/{args.host}/")


async def cmd_release_check(args: argparse.Namespace) -> int:
    """``release HOST --check``: prove, with no side effects, that the release would work (exit 1 if not)."""
    async with open_fleet(args) as fleet:
        host = fleet.config.host(args.host)
        try:
            check_configured(host)
        except ReleaseError as exc:
            raise CliError(str(exc), ExitStatus.USAGE) from None
        session = fleet.session(args.host)
        await session.start()
        verdict = await check_release(session, host, autostop.api_urls(fleet.config))
    detail = safetext.clean(verdict.detail, limit=600)
    if not verdict.ok:
        raise CliError(f"{args.host}: release check FAILED ({verdict.via}): {detail}; the host would NOT be released")
    print(f"{args.host}: release check ok ({verdict.via}): {detail}")
    return ExitStatus.OK


async def cmd_release(args: argparse.Namespace) -> int:
    if args.check:
        return await cmd_release_check(args)
    if args.after_service is not None:
        return after_service(args.host, args.after_service)
    async with open_fleet(args) as fleet:
        lines = await release(args, fleet, lambda line: print(line, file=sys.stderr))
    print("\n".join(lines))
    return ExitStatus.OK


async def release(args: argparse.Namespace, fleet: Fleet, warn: Callable[[str], None]) -> list[str]:
    """Release ``args.host`` of ``fleet`` (its link made, or kept where it is up) as ``gputui release`` does:
    asked on the terminal unless ``args.yes``, its artifacts first; the lines it prints, or a GputuiError (not
    released). Shared by the command and the session service (asked only ``--yes`` releases that pull nothing)."""
    host = fleet.config.host(args.host)
    try:
        check_configured(host)
    except ReleaseError as exc:
        raise CliError(str(exc), ExitStatus.USAGE) from None
    session = fleet.session(args.host)
    if not host.release and not host.release_remote and host.provider != "lambda":
        await session.ensure_connected()  # is there a provider to release through? Asked before anything else
        found = await session.release_check(**autostop.release_settings(host, autostop.api_urls(fleet.config)))
        if found.get("via") == "none":
            raise CliError(
                f"no release command for {args.host}: set release (run here, e.g. a provider CLI) or "
                "release_remote (run on the host) in its [hosts.NAME] table; no RunPod or vast.ai instance "
                f"was found on the host ({safetext.clean(str(found.get('detail')), limit=300)})", ExitStatus.USAGE,
            )
    if not args.yes and not sys.stdin.isatty():
        raise CliError(f"releasing {args.host} needs confirmation: run on a terminal or pass --yes", ExitStatus.USAGE)
    await session.ensure_connected()
    await _artifacts_first(args, session, host, warn)
    if not args.yes and not ask(
        f"Release {args.host}? This stops billing by stopping or terminating the instance. [y/N] "
    ):
        raise CliError("not released")
    result = await release_host(session, host, fleet.ledger, ReleaseRequest(args.host, force=args.force),
                                autostop.api_urls(fleet.config))
    lines = []
    for step in result.steps:
        lines.append(f"[{step.where}] {' '.join(step.argv)} -> exit {step.exit_code}")
        if step.output:
            lines.append("  " + safetext.clean(step.output, multiline=True, limit=4000).replace("\n", "\n  "))
    lines.append(f"{args.host}: released (confirmed: {safetext.clean(result.how, limit=300) or 'commands exited 0'})")
    return lines


#: What to do about a release that may or may not have happened.
UNCONFIRMED = ("see whether the host still answers (gputui status) and look at the instance in its provider's "
               "console; gputui release HOST asks again")


def after_service(host: str, asked_at: float) -> int:
    """``release HOST --yes`` whose session service went away once asked: never asked again here (it may be
    under way or done); said as done where the service marked it released, else loudly as not known."""
    if Ledger().released_since(host, asked_at):  # (marked by the service, on this machine's clock)
        print(f"{host}: released (confirmed by the session service, which stopped before it could say how)")
        return ExitStatus.OK
    raise CliError(
        f"{host}: the session service stopped while it released {host}, and the release is NOT confirmed: it may "
        f"be under way, done or not begun, and was not asked again: {UNCONFIRMED}"
    )


async def cmd_start(args: argparse.Namespace) -> int:
    """``start HOST``: start its stopped RunPod pod / vast.ai instance with the user's key here, follow it to the
    SSH endpoint it came back on, connect, and say what resumed there."""
    from ..core.money import lifecycle
    from ..core.money.providers import ProviderError

    config = cfg.load(args.config)
    host = config.host(args.host)

    def say(line: str) -> None:
        print(f"gputui: {safetext.clean(line, limit=600)}", file=sys.stderr, flush=True)

    try:
        started = await lifecycle.start(config, host, say, args.timeout)
    except ProviderError as exc:
        raise CliError(f"{args.host}: not started: {safetext.clean(str(exc), limit=600)}") from None
    for warning in started.warnings:
        print(f"gputui: WARNING: {args.host}: {safetext.clean(warning, limit=600)}", file=sys.stderr)
    ledger = Ledger()  # its stopped time ends; billed again from its next sample (a release it had is over)
    ledger.started(args.host, time.time())
    ledger.save(force=True)

    async def body(s: HostSession) -> int:
        jobs = await s.list_jobs()
        running = sum(j.state == "running" for j in jobs)
        restarting = sum(j.state == "lost" and bool(j.record.get("restart")) for j in jobs)
        queued = sum(j.state == "queued" for j in jobs)
        armed = f"autostop armed ({host.autostop_minutes:g} min idle)" if host.autostop_minutes else "no autostop"
        how = "was already running" if started.already_running else "started"
        print(f"{args.host}: {how}; {running} jobs running, {restarting} to resume by their restart policy, "
              f"{queued} queued; {armed}")
        return ExitStatus.FAILED if started.warnings else ExitStatus.OK

    return await with_session(args, args.host, body)


async def cmd_autostop(args: argparse.Namespace) -> int:
    async def body(s: HostSession) -> int:
        if args.cancel:
            await autostop.cancel(s)  # NoAutostop: a usage error
            print(f"{args.host}: autostop cancelled until the host reboots or its settings change")
        else:
            await autostop.snooze(s, args.snooze)
            print(f"{args.host}: autostop snoozed for {args.snooze:g} min")
        return ExitStatus.OK

    return await with_session(args, args.host, body)


async def cmd_notify(args: argparse.Namespace) -> int:
    """``notify HOST --test``: the host sends a test message with its [notify] settings now."""
    settings = autostop.notify_settings(cfg.load(args.config).host(args.host))
    if settings is None:
        raise CliError(f"{args.host} has no notifications: set [notify] webhook, ntfy or command in the config",
                       ExitStatus.USAGE)

    async def body(s: HostSession) -> int:
        result = await s.notify_test(settings)
        if not result.get("sent"):
            raise CliError(f"{args.host}: test notification failed: {result.get('error')}")
        print(f"{args.host}: test notification sent")
        return ExitStatus.OK

    return await with_session(args, args.host, body)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rl = sub.add_parser("release", help="stop paying for a host: run its release commands (asks first)")
    rl.add_argument("host")
    rl.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    rl.add_argument("--force", action="store_true", help="release even while jobs run")
    rl.add_argument("--check", action="store_true",
                    help="prove, with no side effects, that the release would work (releases nothing)")
    rp = rl.add_mutually_exclusive_group()
    rp.add_argument("--pull", action="store_true", dest="pull", default=None,
                    help="pull artifacts changed since the last pull first (release only if all arrive)")
    rp.add_argument("--no-pull", action="store_false", dest="pull", help="release without pulling artifacts")
    rl.add_argument("--to", default=ARTIFACTS_DEST, metavar="DIR",
                    help=f"where --pull puts them: DIR/HOST/JOB/PATH (default: ./{ARTIFACTS_DEST})")
    add_direct(rl)
    rl.set_defaults(func=cmd_release, after_service=None)

    st = sub.add_parser("start", help="start a stopped RunPod pod or vast.ai instance again (with your key here)")
    st.add_argument("host")
    st.add_argument("--timeout", type=bounded(10, 3600, unit=" s"), default=600.0, metavar="S",
                    help="how long to wait for it to run and its SSH to answer (default: 600)")
    st.set_defaults(func=cmd_start)

    au = sub.add_parser("autostop", help="snooze or cancel a host's idle autostop")
    au.add_argument("host")
    g = au.add_mutually_exclusive_group(required=True)
    g.add_argument("--snooze", type=bounded(0, autostop.MAX_SNOOZE_MIN, low_ok=False, unit=" minutes"), metavar="MIN",
                   help=f"postpone autostop: the idle window restarts after MIN minutes (at most {autostop.MAX_SNOOZE_MIN})")
    g.add_argument("--cancel", action="store_true", help="no autostop until the host reboots")
    au.set_defaults(func=cmd_autostop)

    nt = sub.add_parser("notify", help="send a test notification from a host with its [notify] settings")
    nt.add_argument("host")
    nt.add_argument("--test", action="store_true", required=True, help="send a test message now")
    nt.set_defaults(func=cmd_notify)

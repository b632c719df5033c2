"""``gputui add``, ``gputui remove`` and ``gputui hosts``: the fleet's hosts, edited from the command line.

``add`` connects first (the host key shown and asked about, as ``gputui trust`` does; the doctor's checks run
and printed) and writes the ``[hosts.NAME]`` table only when all that worked. ``remove`` cuts a table out and
never touches the host. The config file itself is edited by :mod:`gputui.core.hosts.edit`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import jsonout
from ..core.config import file as cfg
from ..core.errors import ExitStatus
from ..core.hosts import doctor as host_doctor
from ..core.safetext import clean
from ..core.session import model as M
from .common import CliError, ask, bounded

if TYPE_CHECKING:
    from ..core.hosts.edit import ConfigFile, Destination
    from ..core.hosts.trust import TrustCheck
    from ..core.session.host import HostSession

#: The hook for provider detection (issue 26): given the new host's connected session, the table to be
#: written and the config's API bases (``autostop.api_urls``), the keys it found (``price_per_hour``,
#: ``release``, ...) to add where the user set none; None: nothing found. Until it is set, ``gputui add`` says
#: that no provider was detected.
ProviderDetector = Callable[["HostSession", dict[str, Any], dict[str, str]], Awaitable["dict[str, Any] | None"]]


async def _detect_provider(session: HostSession, table: dict[str, Any], urls: dict[str, str]) -> dict[str, Any] | None:
    """The new host's provider, as its agent finds it (RunPod / vast.ai: the instance's own variables, checked
    against the provider's API with no side effects), else a Lambda instance of the user's at its address (with
    $LAMBDA_API_KEY or ~/.lambda_cloud/lambda_keys); each API asked at ``urls`` where the config sets one.
    ``provider`` (and ``instance_id``, for ``gputui start``) where the table sets none; RunPod's and vast.ai's
    price is read from their API at every connect, never frozen into the config (Lambda's, read here only,
    is written). Prints what it found; None when nothing was."""
    from ..core.money import providers

    found: dict[str, Any] = {}
    host_urls = {k: v for k, v in urls.items() if k in (providers.RUNPOD, providers.VASTAI)}
    verdict = await session.release_check(provider="auto", api_urls=host_urls)
    via = verdict.get("via")
    price: Any = None
    if via in (providers.RUNPOD, providers.VASTAI):
        found["provider"] = via
        if isinstance(verdict.get("instance_id"), str):
            found["instance_id"] = verdict["instance_id"]
        now = verdict.get("price_per_hour")
        if isinstance(now, (int, float)) and not isinstance(now, bool):
            print(f"provider: {via} prices it at {float(now):.4g}/h now; gputui reads its price at every connect")
        if not verdict.get("ok"):
            print(f"provider: {via}, but its API did not answer: {clean(str(verdict.get('detail')), limit=300)}")
    else:
        key = providers.lambda_key() if table.get("provider") in (None, "auto", "lambda") else None
        if key is not None:
            try:
                inst = await providers.find(key, str(table.get("host") or session.name), urls.get(providers.LAMBDA))
            except providers.ProviderError as exc:
                print(f"provider: Lambda not checked: {clean(str(exc), limit=300)}")
                inst = None
            if inst is not None:
                found["provider"], price = providers.LAMBDA, inst.price_per_hour
    if not found:
        print("provider: none detected (not a RunPod pod, vast.ai instance or Lambda instance of yours); set "
              "price_per_hour and release in its table by hand")
        return None
    if isinstance(price, (int, float)) and not isinstance(price, bool) and 0 <= price <= 10000:
        found["price_per_hour"] = round(float(price), 4)
    found = {k: v for k, v in found.items() if k not in table}
    if table.get("provider", found.get("provider")) not in (providers.RUNPOD, providers.VASTAI):
        found.pop("instance_id", None)  # an instance id is the named provider's only
    shown = ", ".join(f"{k} = {v!r}" for k, v in found.items()) or "nothing new (the table sets it)"
    print(f"provider: {via if via in (providers.RUNPOD, providers.VASTAI) else providers.LAMBDA} detected; adding {shown}")
    return found or None


detect_provider: ProviderDetector | None = _detect_provider


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``add``, ``remove`` and ``hosts`` commands to the CLI's subparsers."""
    a = sub.add_parser(
        "add", help="add an SSH host: connect, trust its key (asks), run the doctor's checks, write [hosts.NAME]",
        usage="%(prog)s NAME DESTINATION [-p PORT] [-i KEY] [--price X] [--yes]\n"
              "       %(prog)s NAME [--price X] [--yes] -- ssh [USER@]HOST [-p PORT] [-i KEY]\n"
              "       %(prog)s --from-ssh-config ALIAS [ALIAS ...] [--yes]",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=ADD_EXAMPLES,
    )
    a.add_argument("name", nargs="?", metavar="NAME", help="the host's name in gputui (letters, digits, . _ -)")
    a.add_argument("destination", nargs="?", metavar="DESTINATION",
                   help="what ssh takes: USER@HOST, HOST, ssh://USER@HOST:PORT, [IPv6], an ~/.ssh/config alias, "
                        'or a quoted "ssh ..." line')
    a.add_argument("-p", "--port", type=bounded(1, 65535, integer=True), metavar="PORT", help="the SSH port")
    a.add_argument("-i", "--identity-file", metavar="KEY", help="the private key to log in with")
    a.add_argument("--price", type=bounded(0, 1e6), metavar="X", help="price per hour (price_per_hour)")
    a.add_argument("-y", "--yes", action="store_true", help="trust the host's key without asking")
    a.add_argument("--from-ssh-config", nargs="+", metavar="ALIAS",
                   help="add these ~/.ssh/config aliases, each under its own name (gputui hosts --ssh-config "
                        "lists them)")
    a.set_defaults(func=cmd_add, command=None)

    rm = sub.add_parser("remove", help="remove a host's [hosts.NAME] table (asks; never touches the host)")
    rm.add_argument("name", metavar="NAME", help="the host's name in the config (gputui hosts lists them)")
    rm.add_argument("--force", action="store_true", help="remove even while jobs run (they keep running)")
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    rm.set_defaults(func=cmd_remove)

    hs = sub.add_parser("hosts", help="the configured hosts: where each comes from, address, price")
    hs.add_argument("--json", action="store_true")
    hs.add_argument("--ssh-config", action="store_true", help="also the ~/.ssh/config aliases not added yet")
    hs.set_defaults(func=cmd_hosts)


ADD_EXAMPLES = """examples:
  gputui add gpu1 root@203.0.113.7 -p 22022 -i ~/.ssh/id_ed25519 --price 2.49
  gputui add gpu1 -- ssh root@203.0.113.7 -p 22022 -i ~/.ssh/id_ed25519   (the provider's line, pasted)
  gputui add box mybox                                                     (an alias of ~/.ssh/config)"""


# --- add ------------------------------------------------------------------------------------------------------
def _destinations(args: argparse.Namespace) -> list[tuple[str, Destination]]:
    """(name, destination) of each host to add; a usage error for a command line that does not fit."""
    from ..core.hosts import edit as host_edit

    try:
        if args.from_ssh_config:
            if args.name or args.destination or args.command or args.port or args.identity_file:
                raise CliError("--from-ssh-config takes aliases only (each is added under its own name, "
                               "with what ~/.ssh/config says for it)", ExitStatus.USAGE)
            return [(alias, host_edit.parse_destination(alias)) for alias in args.from_ssh_config]
        if not args.name:
            raise CliError("gputui add NAME DESTINATION (or NAME -- ssh ..., or --from-ssh-config ALIAS)", ExitStatus.USAGE)
        dest = host_edit.parse(args.destination, args.command)
        return [(args.name, dest.merged(port=args.port, identity_file=args.identity_file))]
    except host_edit.DestinationError as exc:
        raise CliError(str(exc), ExitStatus.USAGE) from None


def _read_config(explicit: str | None) -> ConfigFile:
    """The config file to edit (``--config``, ``$GPUTUI_CONFIG``, else the default; it may not exist yet)."""
    from ..core.hosts import edit as host_edit

    path, _ = cfg.resolve_path(explicit)
    assert path is not None
    try:
        return host_edit.read(path)
    except host_edit.EditError as exc:
        raise CliError(str(exc), ExitStatus.USAGE) from None


async def cmd_add(args: argparse.Namespace) -> int:
    for name, dest in _destinations(args):
        await _add_one(args, name, dest)
    return ExitStatus.OK


def _planned(file: ConfigFile, name: str, table: dict[str, Any]) -> tuple[str, cfg.Config]:
    """The config's new text with the host's table, and the config it loads as (errors: usage errors)."""
    from ..core.hosts import edit as host_edit

    try:
        text = host_edit.with_host(file, name, table)
        return text, cfg.parse(text, file.path)
    except host_edit.EditError as exc:
        raise CliError(str(exc), ExitStatus.USAGE) from None


async def _add_one(args: argparse.Namespace, name: str, dest: Destination) -> None:
    """Connect to the new host, trust its key (asking), run the doctor; then write its table."""
    from ..core.hosts import edit as host_edit
    from ..core.hosts import trust as host_trust
    from ..core.transport import known_hosts as kh

    file = _read_config(args.config)
    table = dest.table()
    if args.price is not None:
        table["price_per_hour"] = args.price
    text, config = _planned(file, name, table)
    host = config.hosts[name]
    twin = await host_edit.same_host(config, host)
    if twin is not None:
        raise CliError(f"{name}: that host is configured already as {twin!r} (same address, port and user)",
                       ExitStatus.USAGE)
    check = await host_trust.check_host_key(config, name)
    print(f"{name} ({check.target.user}@{check.target.pattern}) presents {check.description}")
    if check.trusted_in is not None:
        print(f"already trusted in {check.trusted_in}")
    else:
        await _confirm_key(args, check)
    pinned = tempfile.mkdtemp(prefix="gputui-add-")
    try:
        if check.trusted_in is None:  # connect trusting exactly the key accepted; known_hosts only on success
            known = str(Path(pinned) / "known_hosts")
            kh.append(known, check.target.key_name, check.target.port, check.key)
            host = replace(host, known_hosts=known)
        found = await _check_host(replace(config, hosts={name: host}), name, table)
    finally:
        shutil.rmtree(pinned, ignore_errors=True)
    if found:
        table = {**found, **table}
        text, config = _planned(file, name, table)
    if check.trusted_in is None:
        print(f"added {check.target.pattern} to {host_trust.trust(check)}")
    try:
        host_edit.write(file, text)
    except (host_edit.EditError, OSError) as exc:
        raise CliError(f"{name} not added: {exc}", ExitStatus.FAILED) from None
    print(f"added [hosts.{name}] to {file.path}; try: gputui run {name} -- nvidia-smi")


async def _confirm_key(args: argparse.Namespace, check: TrustCheck) -> None:
    """The user's yes to an untrusted host key: --yes, or asked on a terminal; a CliError otherwise."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CliError("not added: the host key is not trusted yet; confirm on a terminal, or pass --yes",
                       ExitStatus.USAGE)
    print("Compare it with the host's own: ssh-keygen -lf /etc/ssh/ssh_host_<type>_key.pub (on the host)")
    if not await asyncio.to_thread(ask, f"Trust this key and add it to {check.path}? [y/N] "):
        raise CliError("not added: the host key was not trusted", ExitStatus.FAILED)


async def _check_host(config: cfg.Config, name: str, table: dict[str, Any]) -> dict[str, Any] | None:
    """Connect, run the doctor's checks and print them; the keys provider detection found (None: none)."""
    from ..core.hosts.fleet import Fleet
    from ..core.money import autostop

    fleet = Fleet(config)
    try:
        session = fleet.session(name)
        await session.start()
        report = await host_doctor.run_doctor(session)
        print(host_doctor.format_report(report))
        if report.failed:
            print(f"gputui: {name}: some checks failed (above); the host is added all the same", file=sys.stderr)
        if detect_provider is None:
            print("provider: not detected yet (set price_per_hour and release in its table by hand)")
            return None
        return await detect_provider(session, dict(table), autostop.api_urls(config))
    finally:
        await fleet.close()


# --- remove ---------------------------------------------------------------------------------------------------
async def cmd_remove(args: argparse.Namespace) -> int:
    """Cut ``[hosts.NAME]`` out of the config (asks; refuses while its jobs run unless --force)."""
    from ..core.hosts import edit as host_edit

    file = _read_config(args.config)
    if not file.exists:
        raise CliError(f"{file.path}: no config file, so no host to remove", ExitStatus.USAGE)
    try:
        text = host_edit.without_host(file, args.name)
    except host_edit.EditError as exc:
        raise CliError(str(exc), ExitStatus.USAGE) from None
    if not args.force:
        await _refuse_while_busy(_host_config(file, args.name), args.name)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"removing {args.name} needs confirmation: run on a terminal or pass --yes", ExitStatus.USAGE)
        if not await asyncio.to_thread(ask, f"Remove [hosts.{args.name}] from {file.path}? [y/N] "):
            raise CliError("not removed", ExitStatus.FAILED)
    try:
        host_edit.write(file, text)
    except (host_edit.EditError, OSError) as exc:
        raise CliError(f"{args.name} not removed: {exc}", ExitStatus.FAILED) from None
    print(f"removed [hosts.{args.name}] from {file.path} (nothing on the host was touched)")
    return ExitStatus.OK


def _host_config(file: ConfigFile, name: str) -> cfg.Config:
    """The config to reach ``name`` with: the file's, else (another host's table is broken: that does not block
    this one's removal) the file with no other host; a CliError naming --force when neither loads."""
    from ..core.hosts import edit as host_edit

    try:
        return file.config()
    except cfg.ConfigError:
        try:
            return cfg.parse(host_edit.only_host(file, name), file.path)
        except (cfg.ConfigError, host_edit.EditError) as exc:
            raise CliError(f"not removed: cannot ask {name} whether jobs run there ({exc}); --force removes it "
                           "anyway (jobs there keep running)", ExitStatus.USAGE) from None


async def _refuse_while_busy(config: cfg.Config, name: str) -> None:
    """A CliError when the host has jobs running or queued, or cannot be asked (--force skips this)."""
    from ..core.hosts.fleet import Fleet
    from ..core.transport.base import HostError, HostUnavailable
    from ..core.transport.link import AgentError, LinkClosed

    fleet = Fleet(replace(config, hosts={name: config.host(name)}))
    try:
        session = fleet.session(name)
        await session.start()
        jobs = await session.list_jobs()
    except (HostError, HostUnavailable, LinkClosed, AgentError) as exc:
        raise CliError(f"not removed: cannot ask {name} whether jobs run there ({exc}); --force removes it "
                       "anyway (jobs there keep running)", ExitStatus.UNREACHABLE) from None
    finally:
        with contextlib.suppress(Exception):
            await fleet.close()
    busy = [j for j in jobs if j.state in (M.JOB_RUNNING, M.JOB_QUEUED)]
    if busy:
        ids = ", ".join(f"{j.id} ({j.state})" for j in busy[:10]) + (" ..." if len(busy) > 10 else "")
        raise CliError(f"not removed: {name} has {len(busy)} job(s) running or queued: {ids}; --force removes "
                       "it anyway (they keep running; gputui kill stops one)", ExitStatus.FAILED)


# --- hosts ----------------------------------------------------------------------------------------------------
async def cmd_hosts(args: argparse.Namespace) -> int:
    """Every configured host with where it comes from, its address and price; ssh_config aliases not added."""
    from ..core.hosts import edit as host_edit

    config = cfg.load(args.config)
    try:
        aliases = host_edit.ssh_config_aliases(config.ssh_config)
    except host_edit.EditError as exc:
        raise CliError(str(exc), ExitStatus.USAGE) from None
    rows = [
        {"name": name, "source": host_edit.source(host, aliases), "address": host_edit.address(host),
         "provider": None if host.provider == "auto" else host.provider,
         "price_per_hour": host.price_per_hour, "currency": host.currency or config.currency}
        for name, host in config.hosts.items()
    ]
    used = {h.address for h in config.hosts.values()} | set(config.hosts)
    new = [a for a in aliases if a not in used] if args.ssh_config else []
    if args.json:
        out: dict[str, Any] = {"hosts": rows}
        if args.ssh_config:
            out["ssh_config_not_added"] = new
        print(jsonout.dumps(out))
        return ExitStatus.OK
    _print_hosts(rows)
    if args.ssh_config:
        print(f"\n~/.ssh/config aliases not added: {', '.join(new) if new else 'none'}")
        if new:
            print(f"add them with: gputui add --from-ssh-config {' '.join(new)}")
    return ExitStatus.OK


def _print_hosts(rows: list[dict[str, Any]]) -> None:
    head = ("NAME", "SOURCE", "ADDRESS", "PROVIDER", "PRICE/H")
    table = [head] + [
        (r["name"], r["source"], r["address"], r["provider"] or "-",
         f"{r['price_per_hour']:g} {r['currency']}" if r["price_per_hour"] is not None else "-")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())

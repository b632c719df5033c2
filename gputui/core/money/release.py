"""Releasing a host: run the configured commands (they win where set), else release through the provider's API
(RunPod / vast.ai from the host with the instance's own key, Lambda from here with the user's key), confirm that
the bill stopped, then close its ledger interval and mark it released. ``check_release`` proves the same path
would work, with no side effects."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from gputui.core.config.file import HostConfig
from gputui.core.errors import ExitStatus, GputuiError
from gputui.core.money import providers
from gputui.core.money.autostop import release_settings
from gputui.core.money.cost import Ledger, idleness
from gputui.core.session import model as M
from gputui.core.session.host import HostSession
from gputui.core.transport.link import AgentError, LinkClosed


class ReleaseError(GputuiError, RuntimeError):
    """The host was not released; the message says why and what to do."""


class NoRelease(ReleaseError):
    """The host has no way to be released: no command set and no provider found for it."""

    status = ExitStatus.USAGE


@dataclass
class Step:
    where: str  # "client" or "host"
    argv: tuple[str, ...]
    exit_code: int | None
    output: str


@dataclass(frozen=True)
class ReleaseRequest:
    """What the user (or a budget rule) asked to release, and which running jobs they agreed to lose."""

    host: str
    confirmed_jobs: frozenset[str] | None = None  # running jobs a confirmation named (None: it named none)
    force: bool = False  # the CLI's --force: release whatever runs
    idle_only: bool = False  # an automatic release: only a host idle with no running job, checked now


@dataclass
class ReleaseResult:
    host: str
    steps: list[Step] = field(default_factory=list)
    how: str = ""  # how the release was confirmed (the provider's state read back, or the commands' exits)


@dataclass(frozen=True)
class Verdict:
    """A release check: whether the release would work, by which path, and what was proved (or why not)."""

    ok: bool
    via: str  # "command (here)", "command", "runpod", "vastai", "lambda", "none"
    detail: str
    checked_at: float


async def run_client_command(argv: tuple[str, ...], timeout: float) -> Step:
    """Run ``argv`` here (no shell); a hang is killed after ``timeout`` and reported."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        raise ReleaseError(f"cannot run release command {argv[0]!r}: {exc.strerror or exc}") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise ReleaseError(
            f"release command {argv[0]!r} did not finish within {timeout:.0f} s; killed it"
        ) from None
    return Step("client", argv, proc.returncode, out.decode("utf-8", "replace")[-4000:].strip())


def check_configured(host: HostConfig) -> None:
    """A ReleaseError saying how to set one up when the host has no way to be released: no command and
    ``provider = "none"`` (ask nothing before it; a provider host is found out when connected)."""
    if not host.release and not host.release_remote and host.provider == providers.NONE:
        raise ReleaseError(
            f"no release command for {host.name}: set release (run here, e.g. a provider CLI) "
            "or release_remote (run on the host) in its [hosts.NAME] table, or a provider (RunPod, vast.ai, "
            "Lambda: see docs/money.md, Providers)"
        )


def _lambda_api(urls: dict[str, str]) -> str | None:
    return urls.get(providers.LAMBDA)


async def check_release(session: HostSession, host: HostConfig, urls: dict[str, str]) -> Verdict:
    """Prove, with no side effects, that releasing ``host`` would work: each user command exists and is
    executable (``release`` here, ``release_remote`` on the host), else the provider's API answers for this
    instance with its key (on the host for RunPod / vast.ai, here for Lambda)."""
    now = time.time()
    if host.release:
        found = shutil.which(host.release[0])
        if found is None:
            return Verdict(False, "command (here)", f"release program {host.release[0]!r} is not found or not "
                           "executable here", now)
        if not host.release_remote:
            return Verdict(True, "command (here)", f"release program {found} is executable here", now)
    if host.release_remote or host.provider != providers.LAMBDA:
        res = await session.release_check(**release_settings(host, urls))
        return Verdict(bool(res.get("ok")), str(res.get("via") or "none"), str(res.get("detail") or ""), now)
    try:
        key = providers.require_lambda_key()
        inst = await providers.check(key, host.address, _lambda_api(urls))
    except providers.ProviderError as exc:
        return Verdict(False, providers.LAMBDA, str(exc), now)
    return Verdict(True, providers.LAMBDA, f"lambda answers for instance {inst.id} ({inst.status}); release "
                   "would terminate it", now)


async def _provider_release(session: HostSession, host: HostConfig, urls: dict[str, str]) -> Step:
    """Release through the provider's API and confirm it; a ReleaseError when it did not stop the bill."""
    if host.provider == providers.LAMBDA:
        try:
            key = providers.require_lambda_key()
            inst = await providers.check(key, host.address, _lambda_api(urls))
            await providers.terminate(key, inst.id, _lambda_api(urls))
            done = await providers.confirm_terminated(key, inst.id, _lambda_api(urls), host.release_timeout)
        except providers.ProviderError as exc:
            raise ReleaseError(f"{host.name} was not released: {exc}") from None
        return Step("client", ("lambda", "terminate", inst.id), 0, done.how)
    args: dict[str, Any] = release_settings(host, urls)
    # which instance, known before the stop: a stopped pod takes the link with it before it can answer
    try:
        target: dict[str, Any] = dict(await session.release_check(**args))
    except AgentError:
        target = {}
    args.pop("release_remote")
    try:
        res = await session.release_provider(host.release_timeout, **args)
    except LinkClosed:
        return await _confirm_from_here(host, target, urls)
    except AgentError as exc:
        raise ReleaseError(f"{host.name} was not released: {exc}") from None
    if not res.get("found"):
        raise NoRelease(
            f"no release command for {host.name} and {res.get('error') or 'no provider found'}: set release (run "
            "here, e.g. a provider CLI) or release_remote (run on the host) in its [hosts.NAME] table"
        )
    if not res.get("released"):
        raise ReleaseError(f"{host.name} was not released: {res.get('error') or 'the provider did not confirm'}")
    return Step("host", (str(args.get("provider") or "provider"), "release"), 0, str(res.get("how") or ""))


async def _confirm_from_here(host: HostConfig, target: dict[str, Any], urls: dict[str, str]) -> Step:
    """The host closed the link after the provider was asked to release it (a stop ends the container): read
    the instance back from here with the user's own key; without one, or unconfirmed, a ReleaseError."""
    provider, instance, mode = (str(target.get(k) or "") for k in ("via", "instance_id", "mode"))
    lost = f"{host.name}: {provider or 'the provider'} was asked to release it and the host closed the connection "
    if provider not in providers.ACCOUNT_KEYS or not instance or not mode:
        raise ReleaseError(lost + "before it confirmed; it is NOT marked released: check it in the provider's console")
    try:
        found = providers.account_key(provider)
        if found is None:
            raise ReleaseError(
                lost + f"(as a stopped {provider} instance does) before the provider confirmed; it is NOT marked "
                f"released: check instance {instance} in {provider}'s console, or put your {provider} API key in "
                f"{providers.account_key_hint(provider)} so that gputui reads the release back from this machine"
            )
        key, where = found
        done = await providers.confirm_instance(
            provider, instance, mode, key, urls.get(provider), host.release_timeout
        )
    except providers.ProviderError as exc:
        raise ReleaseError(lost + f"and reading it back from here failed: {exc}; it is NOT marked released") from None
    how = f"{done.how}, read back from this machine with the key in {where} after the host closed the connection"
    return Step("client", (provider, "confirm", instance), 0, how)


async def release_host(
    session: HostSession, host: HostConfig, ledger: Ledger, request: ReleaseRequest,
    urls: dict[str, str] | None = None,
) -> ReleaseResult:
    """Check again, now, that the release is still what was asked; then run ``release_remote`` on the host
    and ``release`` here (or, with neither, release through the provider and confirm it: ``urls`` are the
    providers' API bases), close the host's ledger interval and mark it released.

    Refused: while a job runs that the request did not name (unless ``force``); for an ``idle_only`` release,
    while any job runs or the host is not idle under its idle rule.
    """
    check_configured(host)
    # a queued job is lost with the host too: it counts as a running one here (named, confirmed or refused)
    running = [j for j in await session.list_jobs() if j.running or j.state == M.JOB_QUEUED]
    if request.idle_only:
        if running:
            raise ReleaseError(f"{host.name} was not released automatically: {_named(running)} running")
        idle, _, reasons = idleness((await session.sample()).activity, host)
        if not idle:
            why = "; ".join(reasons[:3]) or f"idle for less than {host.idle_minutes:g} min"
            raise ReleaseError(f"{host.name} was not released automatically: it is not idle ({why})")
    unconfirmed = [j for j in running if j.id not in (request.confirmed_jobs or ())]
    if unconfirmed and not request.force:
        if request.confirmed_jobs is None:
            raise ReleaseError(
                f"{host.name} has running jobs: {_named(unconfirmed)}; kill them first or use --force"
            )
        raise ReleaseError(
            f"{host.name} was not released: jobs started after you confirmed: {_named(unconfirmed)}; "
            "look at them, then release again"
        )
    result = ReleaseResult(host.name)
    boot_id = session.snapshot.facts.get("boot_id")
    if host.release_remote:
        try:
            res = await session.exec(list(host.release_remote), host.release_timeout)
            step = Step(
                "host", host.release_remote, res["exit_code"], (res["stdout"] + res["stderr"]).strip()
            )
        except LinkClosed:  # a shutdown may take the link with it before the reply
            step = Step("host", host.release_remote, None, "the host closed the connection (shutting down)")
        except AgentError as exc:
            raise ReleaseError(f"release_remote on {host.name} failed: {exc}") from None
        result.steps.append(step)
        if step.exit_code not in (0, None):
            raise ReleaseError(
                f"release_remote on {host.name} exited {step.exit_code}: {step.output or 'no output'}"
            )
    if host.release:
        step = await run_client_command(host.release, host.release_timeout)
        result.steps.append(step)
        if step.exit_code != 0:
            raise ReleaseError(
                f"release command for {host.name} exited {step.exit_code}: {step.output or 'no output'}"
            )
    if host.release_remote or host.release:
        result.how = "; ".join(f"{st.where} command exited {st.exit_code}" for st in result.steps)
    else:
        step = await _provider_release(session, host, urls or {})
        result.steps.append(step)
        result.how = step.output
    ledger.close(host.name, time.time(), boot_id=boot_id)
    ledger.save(force=True)
    return result


def _named(jobs: list[M.Job]) -> str:
    return ", ".join(f"{j.id} ({j.name[:30]})" for j in jobs)

"""Starting a stopped instance from the app (``gputui start`` in one key). ``S`` on a host whose provider says
its instance is stopped (or was preempted) asks first, saying what will bill; then starts it with the account
key on this machine (``gputui.core.money.lifecycle.start``), says each step as a notice, warns loudly of an
instance back without its GPUs, and reconnects to the host at once, where its SSH came back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gputui.core import safetext
from gputui.core.config.file import Config, HostConfig
from gputui.core.money import lifecycle
from gputui.core.transport import instances

from . import NAME_CHARS, NOTIFY_S

if TYPE_CHECKING:
    from ..app import GpuTuiApp

#: the call that starts an instance (core.money.lifecycle.start); tests give the app one that records instead
StartCall = Callable[[Config, HostConfig, Callable[[str], None]], Awaitable[lifecycle.Started]]
STARTABLE = ("stopped", "preempted")


def ask(app: GpuTuiApp, host: str) -> None:
    """The start key on ``host``: say why not, or confirm (what starts, what it will bill), then start."""
    conf, snap = app.config.hosts.get(host), app.hosts.get(host)
    name = safetext.clean(host, limit=NAME_CHARS)
    known = instances.known(conf) if conf is not None else None
    look = snap.instance if snap is not None else None
    if conf is None or known is None:
        app.notify(f"gputui does not know which RunPod pod or vast.ai instance {name} is: connect once while it "
                   f"runs, or set provider and instance_id in [hosts.{name}]", severity="warning", timeout=NOTIFY_S)
        return
    if look is None or look.state not in STARTABLE:
        said = f": {safetext.clean(look.detail, limit=2 * NAME_CHARS)}" if look is not None else " (it answers, or its provider was not asked yet)"
        app.notify(f"{name} is not stopped{said}; nothing to start", timeout=NOTIFY_S)
        return
    price = snap.cost.price_per_hour if snap is not None and snap.cost is not None else None
    rate = f" at {price:.2f} USD/h" if price is not None else ""
    body = (f"Start {name}?\n\n{known.provider} {known.instance_id} ({look.state}) starts again with your account key "
            f"on this machine and bills{rate} from then on. gputui waits until its SSH answers, follows it to the "
            "port the start gives it and reconnects.")

    def answered(yes: bool | None) -> None:
        if yes and conf is not None:
            app.run_worker(start(app, conf), group="command")

    app.confirm("Start instance", body, "Start", answered)


async def start(app: GpuTuiApp, conf: HostConfig) -> None:
    """Run a confirmed start; each step, a warning and whatever goes wrong are said, never swallowed."""
    name = safetext.clean(conf.name, limit=NAME_CHARS)

    def say(line: str) -> None:
        app.notify(safetext.clean(line, limit=4 * NAME_CHARS), timeout=NOTIFY_S)

    say(f"starting {name}…")
    try:
        started = await (app.start_call or lifecycle.start)(app.config, conf, say)
    except Exception as exc:  # the provider's refusal, no key here, the time running out, a config error
        app.notify(f"{name} did not start: {safetext.clean(str(exc), limit=4 * NAME_CHARS)}", title="not started",
                   severity="error", timeout=2 * NOTIFY_S)
        return
    for warning in started.warnings:
        app.notify(f"{name}: {safetext.clean(warning, limit=4 * NAME_CHARS)}", title="WARNING", severity="error",
                   timeout=2 * NOTIFY_S)
    app.session(conf.name).reconnect_now()
    app.notify(f"{name} {'was already running' if started.already_running else 'started'}: reconnecting",
               timeout=NOTIFY_S)

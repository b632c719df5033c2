"""The new-job dialog: host, command (split like a shell would, never run through one), and options."""

from __future__ import annotations

import os
import shlex

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from gputui.core import safetext
from gputui.core.jobs import usecases as jobs
from gputui.core.jobs.usecases import JobSpec
from gputui.core.session import model as M

from ..widgets.plain_input import PlainInput

FREE_UTIL_PCT = 10.0
FREE_MEM_FRACTION = 0.10


def free_gpus(snap: M.HostSnapshot | None) -> list[int]:
    """GPUs with no processes, low utilisation and little memory in use (a lost GPU is never free)."""
    out = []
    for g in snap.gpus if snap else ():
        mem = (g.mem_used_mib or 0) / g.mem_total_mib if g.mem_total_mib else 0.0
        if g.lost:
            continue
        if not g.processes and (g.util_percent or 0) < FREE_UTIL_PCT and mem < FREE_MEM_FRACTION:
            out.append(g.index)
    return out


def gpu_hint(snap: M.HostSnapshot | None) -> tuple[str, str]:
    """(suggested value, explanation) for the GPUs field."""
    gpus = snap.gpus if snap else ()
    if not gpus:
        return "", "no GPUs reported on this host"
    free = free_gpus(snap)
    lost = [g.index for g in gpus if g.lost]
    busy = [g.index for g in gpus if g.index not in free and not g.lost]
    if not busy and not lost:
        return "", f"all {len(gpus)} free (empty = all)"
    if not free:
        return "", "none free (empty = all)"
    why = f"free: {', '.join(map(str, free))}" + "".join(
        f" · {what}: {', '.join(map(str, which))}" for what, which in (("busy", busy), ("lost", lost)) if which
    )
    return ",".join(map(str, free)), why


def parse_env(text: str) -> dict[str, str]:
    """The env field: ``KEY=VALUE`` items split like a shell would."""
    return jobs.parse_env(shlex.split(text))


class NewJobScreen(ModalScreen[JobSpec | None]):
    """Enter in any field starts the job; Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "submit", "Start")]
    AUTO_FOCUS = "#command"  # typing goes to the command from the first frame on

    def __init__(
        self,
        hosts: list[str],
        host: str | None,
        snapshots: dict[str, M.HostSnapshot],
        local_cwd: str,
        local_hosts: frozenset[str] = frozenset({"local"}),
        draft: JobSpec | None = None,
        error: str = "",
    ) -> None:
        """``draft``: a job that could not start, its fields filled in again with ``error`` (nothing retyped)."""
        super().__init__(classes="dialog-screen")
        self.hosts, self.snapshots, self.local_cwd = hosts, snapshots, local_cwd
        self.local_hosts = local_hosts
        self.draft, self.error = (draft, error) if draft is None or draft.host in hosts else (None, "")
        host = self.draft.host if self.draft else host
        self.host = host if host in hosts else (hosts[0] if hosts else None)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Static("New job", classes="dialog-title")
            yield Label("Host")
            hosts = [(Text(safetext.clean(h)), h) for h in self.hosts]
            yield Select(hosts, value=self.host, allow_blank=False, id="host")
            yield Label("Command (split like a shell, run without one)")
            yield PlainInput(placeholder="python train.py --epochs 10", id="command")
            with Horizontal(classes="row"):
                with Vertical():
                    yield Label("Working directory")
                    yield PlainInput(id="cwd")
                with Vertical():  # the job then runs in the synced dir (default ~/gputui-work/NAME)
                    yield Label("Sync first from (local dir)")
                    yield PlainInput(placeholder="none; . for here", id="sync")
            with Horizontal(classes="row"):
                with Vertical():
                    yield Label("GPUs (CUDA_VISIBLE_DEVICES)")
                    yield PlainInput(placeholder="all", id="gpus")
                with Vertical():
                    yield Label("Name")
                    yield PlainInput(placeholder="optional", id="name")
            yield Static("", id="gpu-hint", classes="hint")
            with Horizontal(classes="row"):
                with Vertical():
                    yield Label("Environment")
                    yield PlainInput(placeholder="KEY=VALUE OTHER='with spaces'", id="env")
                with Vertical():  # restart policies (remote_agent/jobs/restart.py)
                    yield Label("Restart")
                    yield PlainInput(placeholder="no / on-failure[:N]", id="restart")
                with Vertical():
                    yield Label("Resume from")
                    yield PlainInput(placeholder="ckpt/*.pt", id="resume_from")
            yield Checkbox("Queue: wait on the host until these GPUs are free (a number N: any N GPUs)", id="queue")
            yield Static("", id="error", classes="error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel (esc)", id="cancel")
                yield Button("Start (enter)", id="start", variant="primary")

    def on_mount(self) -> None:
        self._fill_for_host(self.host)
        if self.draft is not None:
            self._fill_draft(self.draft)
        self.query_one("#command", Input).focus()

    def _fill_draft(self, spec: JobSpec) -> None:
        """The fields as the user typed them for ``spec`` (as :meth:`spec` reads them back)."""
        queue = spec.queue or {}
        gpus = str(queue["gpu_count"]) if queue.get("gpu_count") else queue.get("gpus") if queue else spec.gpus
        values = {
            "command": shlex.join(spec.argv), "cwd": spec.cwd, "sync": spec.sync, "gpus": gpus,
            "name": spec.name, "env": " ".join(shlex.quote(f"{k}={v}") for k, v in spec.env.items()),
            "restart": spec.restart, "resume_from": spec.resume_from,
        }
        for key, value in values.items():
            self.query_one(f"#{key}", Input).value = value or ""
        self.query_one("#queue", Checkbox).value = spec.queue is not None
        self.query_one("#error", Static).update(Text(safetext.clean(self.error, multiline=True)))

    def _fill_for_host(self, host: str | None) -> None:
        snap = self.snapshots.get(host or "")
        local = host in self.local_hosts
        self.query_one("#cwd", Input).value = self.local_cwd if local else ""
        self.query_one("#cwd", Input).placeholder = "" if local else "~ (home on the host)"
        value, hint = gpu_hint(snap)
        self.query_one("#gpus", Input).value = value
        self.query_one("#gpu-hint", Static).update(Text(safetext.clean(hint)))

    def on_select_changed(self, event: Select.Changed) -> None:
        if isinstance(event.value, str) and event.value != self.host:
            self.host = event.value
            self._fill_for_host(self.host)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        # The field's value as it was on Enter: keys typed right after it must not leak into the command.
        self.action_submit({event.input.id: event.value} if event.input.id else None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_submit(self, at_enter: dict[str, str] | None = None) -> None:
        try:
            spec = self.spec(at_enter)
        except ValueError as exc:
            self.query_one("#error", Static).update(Text(safetext.clean(str(exc), multiline=True)))
            return
        self.dismiss(spec)

    def spec(self, at_enter: dict[str, str] | None = None) -> JobSpec:
        if self.host is None:
            raise ValueError("no host to run on")
        fixed = at_enter or {}
        value = lambda key: fixed.get(key, self.query_one(f"#{key}", Input).value).strip()  # noqa: E731
        try:
            argv = shlex.split(value("command"))
        except ValueError as exc:
            raise ValueError(f"command: {exc}") from None
        if not argv:
            raise ValueError("command: what should run? e.g. python train.py")
        env = parse_env(value("env"))
        sync, cwd = self._sync(value("sync"), value("cwd"))
        gpus, queue = value("gpus") or None, None
        if self.query_one("#queue", Checkbox).value:  # the host's queue starts it when its GPUs are free
            count = gpus is not None and gpus.isdigit()
            if count and not 1 <= int(gpus or 0) <= 1024:
                raise ValueError("GPUs: with the queue, a count from 1 to 1024, a list like 0,1, or empty for all")
            queue = {"gpu_count": int(gpus or 0)} if count else {"gpus": None if gpus == "all" else gpus}
            gpus = None
        restart, resume_from = value("restart") or None, value("resume_from") or None
        try:
            jobs.check_restart(restart, resume_from)
        except ValueError as exc:
            raise ValueError(f"restart: {exc}") from None
        return JobSpec(
            restart=restart,
            resume_from=resume_from,
            host=self.host,
            argv=argv,
            cwd=cwd,
            gpus=gpus,
            name=value("name") or None,
            env=env,
            sync=sync,
            queue=queue,
        )

    def _sync(self, src: str, cwd: str) -> tuple[str | None, str | None]:
        """(local dir to sync, host dir): with a sync the working dir is where it goes; the local host's
        prefilled dir (the app's own) or the source itself mean the default target, never a copy over them."""
        if not src:
            return None, cwd or None
        path = os.path.abspath(os.path.join(self.local_cwd, os.path.expanduser(src)))
        if not os.path.isdir(path):
            raise ValueError(f"sync: {path} is not a directory here")
        here = self.host in self.local_hosts
        if here and cwd and (cwd == self.local_cwd or os.path.abspath(os.path.expanduser(cwd)) == path):
            cwd = ""
        return path, cwd or None

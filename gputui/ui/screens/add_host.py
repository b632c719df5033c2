"""The ``+`` dialog: add an SSH host as ``gputui add`` does, step by step. Destination (what ssh takes, or a
pasted ``ssh ...`` line), then the host key's type and SHA256 fingerprint to accept, then the doctor's checks,
then save: the ``[hosts.NAME]`` table goes into the config (the user's bytes kept; never over a file changed
since it was read) and the new host joins the fleet. Every step's I/O runs in a worker; nothing is written
before Save."""

from __future__ import annotations

import asyncio
import shlex
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from gputui.core import safetext
from gputui.core.config import file as cfg

from ..widgets.plain_input import PlainInput

if TYPE_CHECKING:
    from gputui.core.hosts.edit import ConfigFile
    from gputui.core.hosts.trust import TrustCheck

DOCTOR_TIMEOUT_S = 60.0
SHOWN_CHARS = 4000


@dataclass
class Plan:
    """What Save writes: the config's new text (and the config it loads as) and the key to trust."""

    name: str
    file: ConfigFile
    text: str
    config: cfg.Config
    check: TrustCheck | None = None


def destination(text: str) -> Any:
    """The destination typed or pasted: ``USER@HOST [-p PORT] [-i KEY]`` or a whole ``ssh ...`` line."""
    from gputui.core.hosts import edit

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise edit.DestinationError(f"not a destination: {exc}") from None
    if not words:
        raise edit.DestinationError("type the host, as ssh takes it: root@203.0.113.7 -p 22022 -i ~/.ssh/id_ed25519")
    if Path(words[0]).name == "ssh":
        return edit.parse_ssh_command(words)
    return edit.parse_ssh_command(["ssh", *words])


async def plan(path: Path, name: str, dest_text: str, price_text: str) -> Plan:
    """Read the config and plan the new table (nothing is written): a usage error for what cannot be added."""
    from gputui.core.hosts import edit

    edit.check_name(name)
    table = destination(dest_text).table()
    if price_text.strip():
        try:
            table["price_per_hour"] = float(price_text)
        except ValueError:
            raise edit.EditError(f"price: not a number: {price_text!r}") from None
    file = await asyncio.to_thread(edit.read, path)
    text = edit.with_host(file, name, table)
    config = cfg.parse(text, file.path)
    twin = await edit.same_host(config, config.hosts[name])
    if twin is not None:
        raise edit.EditError(f"{name}: that host is configured already as {twin!r} (same address, port and user)")
    return Plan(name, file, text, config)


async def doctor_lines(p: Plan) -> list[str]:
    """Connect trusting exactly the key shown (a throwaway known_hosts until Save) and run the doctor."""
    from gputui.core.hosts import doctor as host_doctor
    from gputui.core.hosts.fleet import Fleet
    from gputui.core.transport import known_hosts as kh

    host = p.config.hosts[p.name]
    pinned = tempfile.mkdtemp(prefix="gputui-add-")
    try:
        if p.check is not None and p.check.trusted_in is None:
            known = str(Path(pinned) / "known_hosts")
            await asyncio.to_thread(kh.append, known, p.check.target.key_name, p.check.target.port, p.check.key)
            host = replace(host, known_hosts=known)
        fleet = Fleet(replace(p.config, hosts={p.name: host}))
        try:
            session = fleet.session(p.name)
            await session.start()
            report = await host_doctor.run_doctor(session, timeout_s=DOCTOR_TIMEOUT_S)
        finally:
            await fleet.close()
    finally:
        await asyncio.to_thread(shutil.rmtree, pinned, True)
    return host_doctor.format_report(report).splitlines()


async def save(p: Plan) -> None:
    """Trust the key (known_hosts) and write the table (atomically; refused if the file changed)."""
    from gputui.core.hosts import edit
    from gputui.core.hosts import trust as host_trust

    if p.check is not None and p.check.trusted_in is None:
        await asyncio.to_thread(host_trust.trust, p.check)
    await asyncio.to_thread(edit.write, p.file, p.text)


class AddHostScreen(ModalScreen["cfg.Config | None"]):
    """Name and destination, then Connect → Trust → Save; dismissed with the saved config (None: cancelled)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    AddHostScreen #steps-box { height: auto; max-height: 14; }
    """

    def __init__(self, path: Path) -> None:
        super().__init__(classes="dialog-screen")
        self.path = path
        self.plan: Plan | None = None
        self.lines: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Static("Add an SSH host", classes="dialog-title")
            yield Label("Name")
            yield PlainInput(placeholder="gpu1", id="name")
            yield Label("Destination (what ssh takes, or the provider's ssh line)")
            yield PlainInput(placeholder="root@203.0.113.7 -p 22022 -i ~/.ssh/id_ed25519", id="dest")
            yield Label("Price per hour (optional)")
            yield PlainInput(placeholder="2.49", id="price")
            with VerticalScroll(id="steps-box", classes="dialog-body"):
                yield Static(id="steps")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Connect", id="connect", variant="primary")
                yield Button("Trust key", id="trust", variant="warning", disabled=True)
                yield Button("Save", id="save", variant="success", disabled=True)

    def on_mount(self) -> None:
        self.query_one("#name", PlainInput).focus()

    def say(self, line: str, fresh: bool = False) -> None:
        """A step's outcome (host text is data: escaped, shown as plain text)."""
        self.lines = [] if fresh else self.lines
        self.lines.append(safetext.clean(line, limit=SHOWN_CHARS))
        self.query_one("#steps", Static).update(Text("\n".join(self.lines)))
        self.query_one("#steps-box", VerticalScroll).scroll_end(animate=False)

    def _buttons(self, connect: bool, trust: bool, save: bool) -> None:
        self.query_one("#connect", Button).disabled = not connect
        self.query_one("#trust", Button).disabled = not trust
        self.query_one("#save", Button).disabled = not save

    def on_input_submitted(self) -> None:
        if not self.query_one("#connect", Button).disabled:
            self._connect()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        pressed = event.button.id
        if pressed == "cancel":
            self.dismiss(None)
        elif pressed == "connect":
            self._connect()
        elif pressed == "trust":
            self._buttons(False, False, False)
            self.run_worker(self._check(), group="add-host", exclusive=True)
        elif pressed == "save":
            self._buttons(False, False, False)
            self.run_worker(self._save(), group="add-host", exclusive=True)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _connect(self) -> None:
        self._buttons(False, False, False)
        self.plan = None
        self.run_worker(self._fetch_key(), group="add-host", exclusive=True)

    def _failed(self, exc: BaseException) -> None:
        self.say(f"not added: {exc}")
        self._buttons(True, False, False)

    async def _fetch_key(self) -> None:
        from gputui.core.hosts import trust as host_trust

        name = self.query_one("#name", PlainInput).value.strip()
        self.say(f"connecting to {name or '?'} ...", fresh=True)
        try:
            p = await plan(self.path, name, self.query_one("#dest", PlainInput).value,
                           self.query_one("#price", PlainInput).value)
            p.check = await host_trust.check_host_key(p.config, name)
        except Exception as exc:  # noqa: BLE001 - every failure is said in the dialog, never a crash
            self._failed(exc)
            return
        self.plan = p
        target = p.check.target
        self.say(f"{name} ({target.user}@{target.pattern}) presents {p.check.description}")
        if p.check.trusted_in is not None:
            self.say(f"already trusted in {p.check.trusted_in}; running the checks ...")
            await self._check()
            return
        self.say("Compare it with the host's own: ssh-keygen -lf /etc/ssh/ssh_host_<type>_key.pub (on the host)")
        self.say(f"Trust key adds it to {p.check.path} when you save.")
        self._buttons(True, True, False)
        self.query_one("#trust", Button).focus()

    async def _check(self) -> None:
        assert self.plan is not None
        self.say("running the doctor's checks ...")
        try:
            for line in await doctor_lines(self.plan):
                self.say(line)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return
        self.say(f"Save writes [hosts.{self.plan.name}] to {self.plan.file.path}.")
        self._buttons(True, False, True)
        self.query_one("#save", Button).focus()

    async def _save(self) -> None:

        assert self.plan is not None
        try:
            await save(self.plan)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return
        self.dismiss(self.plan.config)

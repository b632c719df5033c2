"""Parse one command line and run its command; every error a command ends with is a GputuiError."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import re
import select
import sys
from typing import Any, NoReturn

from .. import __version__, appstart
from ..core import safetext
from ..core.errors import ExitStatus, GputuiError

CONFIG_HELP = "config file (default: $GPUTUI_CONFIG, else ~/.config/gputui/config.toml)"
#: Help of the arguments several commands share (a command's own help, where given, wins).
SHARED_HELP = {
    "host": "a host from the config (with no config: local); gputui status lists them",
    "job": "the job's id, as gputui run printed it; gputui jobs HOST lists them",
    "json": "print JSON (its keys are in docs/commands.md)",
    "remote_port": "the port on the host, e.g. 6006 for TensorBoard",
}


#: The module of each command (in --help's order): a command line that names one imports only its module
#: (``gputui status`` loads neither the sync nor the release code); tests/test_cli_start.py checks the list.
FAMILIES = {
    "jobs": ("run", "jobs", "history", "logs", "kill", "queue"),
    "fleet": ("status", "trust", "cost", "doctor", "service"),
    "release": ("release", "start", "autostop", "notify"),
    "files": ("sync", "forward", "pull"),
    "hosts": ("add", "remove", "hosts"),
    "compare": ("compare",),
}
_FAMILY_OF = {cmd: family for family, cmds in FAMILIES.items() for cmd in cmds}


def command_word(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word that is neither an option nor ``--config``'s value)."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return None
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command, or only the family of ``command`` when it is one."""
    family = _FAMILY_OF.get(command or "")
    p = argparse.ArgumentParser(
        prog="gputui",
        description=f"Watch, run and release jobs on GPU hosts. (gputui {__version__})",
        epilog="Without a command gputui opens the app (on a terminal) or prints `gputui status` (when piped).",
    )
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--version", action="version", version=f"gputui {__version__}")
    p.add_argument("--completion", choices=sorted(COMPLETION_SCRIPTS), metavar="SHELL",
                   help='print the shell completion script (bash, zsh): eval "$(gputui --completion bash)"')
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    for name in [family] if family else FAMILIES:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    for name, parser in sub.choices.items():
        _document(parser, next(a.help for a in sub._choices_actions if a.dest == name))
    return p


def _document(parser: argparse.ArgumentParser, summary: str | None) -> None:
    """A command's --help opens with what it does, the arguments the commands share say what they are, and
    ``--config`` works after the command too (``gputui status --config c.toml``)."""
    parser.description = parser.description or summary
    parser.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
    for action in parser._actions:
        if action.help is None:
            action.help = SHARED_HELP.get(action.dest)
            if action.dest == "host" and action.nargs == "?":
                action.help = "one host (default: every host)"


def main(argv: list[str] | None = None, **preset: Any) -> NoReturn:
    """Run one command; a reader that goes away (``gputui status --json | head``) ends it quietly. ``preset``:
    values set on the parsed command line (``offset``: a ``logs`` the session service began, gone on here)."""
    try:
        try:
            _main(argv, preset)
            code: Any = ExitStatus.OK
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()
    except BrokenPipeError as exc:
        if not _stdout_closed():
            print(f"gputui: {exc}", file=sys.stderr)
            sys.exit(ExitStatus.FAILED)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        code = ExitStatus.PIPE
    sys.exit(int(code) if isinstance(code, ExitStatus) else code)


def _stdout_closed() -> bool:
    """Whether nobody reads our stdout any more (a pipe or socket whose other end is gone)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), 0)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError):
        return False


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line as a namespace; the job's argv after ``--`` is never looked at by argparse."""
    command: list[str] | None = None
    if argv[:1] == [COMPLETE]:
        with contextlib.suppress(Exception):  # a completion never prints a traceback into the shell
            print("\n".join(complete(argv[1:])))
        sys.exit(ExitStatus.OK)
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = build_parser(command_word(argv))
    args, extra = parser.parse_known_args(argv)
    if args.cmd == "run":
        from .jobs import check_run_command

        check_run_command(argv, args.command, extra, command)
    if extra:
        parser.parse_args(argv)  # argparse's own error for them
    if command is not None:
        if args.cmd not in ("run", "add"):
            parser.error("'--' is only used with: gputui run HOST -- CMD [ARG ...], gputui add NAME -- ssh ...")
        args.command = command
    if getattr(args, "completion", None):
        print(COMPLETION_SCRIPTS[args.completion], end="")
        sys.exit(ExitStatus.OK)
    if args.cmd is None:
        if sys.stdin.isatty() and sys.stdout.isatty():
            sys.exit(appstart.run_app(args.config))
        args = parser.parse_args([*argv, "status"])  # not a terminal: print the status instead
    return args


def _main(argv: list[str] | None, preset: dict[str, Any]) -> None:
    try:
        args = _parse(sys.argv[1:] if argv is None else argv)
        vars(args).update(preset)
        safetext.guard_terminal()  # host text printed to a terminal is data: no raw control characters
        code = asyncio.run(args.func(args))
    except KeyboardInterrupt:
        code = ExitStatus.INTERRUPTED
    except GputuiError as exc:
        print(f"gputui: {exc}", file=sys.stderr)
        code = exc.status
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    sys.exit(int(code))


# --- shell completion -----------------------------------------------------------------------------------------
COMPLETE = "__complete"  # gputui __complete WORD... : the candidates for the last word, one a line
JOB_LIST_TIMEOUT_S = 5.0
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")  # what a completion may print (a host's text is data)
COMPLETION_SCRIPTS = {
    "bash": '_gputui() { local IFS=$\'\\n\'; COMPREPLY=($(command gputui __complete '
            '"${COMP_WORDS[@]:1:$COMP_CWORD}" 2>/dev/null)); }\ncomplete -o default -F _gputui gputui\n',
    "zsh": "autoload -U +X bashcompinit && bashcompinit\n",
}
COMPLETION_SCRIPTS["zsh"] += COMPLETION_SCRIPTS["bash"]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _takes_value(parser: argparse.ArgumentParser, word: str) -> bool:
    action = parser._option_string_actions.get(word)
    return action is not None and action.nargs != 0


def complete(words: list[str]) -> list[str]:
    """The candidates for the last of ``words`` (the command line after ``gputui``, the last word partial)."""
    parser = build_parser()
    *before, prefix = words or [""]
    commands = _subparsers(parser)
    config = next((before[i + 1] for i, w in enumerate(before[:-1]) if w == "--config"), None)
    cmd = next((w for i, w in enumerate(before) if w in commands and (i == 0 or before[i - 1] != "--config")),
               None)
    if cmd is None:
        pool = [*parser._option_string_actions] if prefix.startswith("-") else [*commands]
        return sorted(w for w in pool if w.startswith(prefix))
    sp = commands[cmd]
    after = before[before.index(cmd) + 1 :]
    if prefix.startswith("-"):
        return sorted(w for w in sp._option_string_actions if w.startswith(prefix))
    if after and _takes_value(sp, after[-1]):
        return []  # an option's value: the shell's own (files)
    given = [w for i, w in enumerate(after) if not w.startswith("-") and not (i and _takes_value(sp, after[i - 1]))]
    positionals = [a for a in sp._actions if not a.option_strings]
    if len(given) >= len(positionals):
        return []
    dest = positionals[len(given)].dest
    if dest in ("host", "name") and cmd != "add":
        found = _hosts(config)
    elif dest == "job" and given:
        found = _job_ids(config, given[0])
    else:
        return []
    return sorted(w for w in found if w.startswith(prefix) and _PLAIN.match(w))


def _hosts(config: str | None) -> list[str]:
    from ..core.config import file as cfg

    try:
        return list(cfg.load(config).hosts)
    except GputuiError:
        return []


def _job_ids(config: str | None, host: str) -> list[str]:
    """The host's job ids, asked of it (bounded); none when it cannot answer in time."""
    from ..core.config import file as cfg
    from ..core.hosts.fleet import Fleet

    async def ask() -> list[str]:
        fleet = Fleet(cfg.load(config))
        try:
            session = fleet.session(host)
            await session.start()
            return [j.id for j in await session.list_jobs()]
        finally:
            await fleet.close()

    try:
        return asyncio.run(asyncio.wait_for(ask(), JOB_LIST_TIMEOUT_S))
    except (GputuiError, OSError, asyncio.TimeoutError):
        return []

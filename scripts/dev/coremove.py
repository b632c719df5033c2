#!/usr/bin/env python3
"""Move gputui/core's flat modules into domain packages and rewrite every reference to them (issue 36).

Run from the repository root: `git mv`s each flat module named in coremap.MAP that still exists, then rewrites
imports, dotted names ("gputui.core.session.HostSession" in mock targets) and paths ("gputui/core/cost.py" in
docs) in every tracked .py/.md/.toml/.sh file. Running it again changes nothing.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from coremap import MAP, PKG_DOCS  # noqa: E402

CORE = Path("gputui/core")
NEWPKGS = sorted({v.split(".")[0] for v in MAP.values()})
SUBMODS = {p: {v.split(".")[1] for v in MAP.values() if v.startswith(p + ".")} for p in NEWPKGS}
FROM = re.compile(r"^(?P<ind>[ \t]*)from (?P<src>[\w.]+) import (?P<names>.*)$")
DOTTED = re.compile(r"\bgputui\.core\.(?P<mod>\w+)(?P<rest>(\.\w+)?)")
SLASHED = re.compile(r"\bgputui/core/(?P<mod>\w+)\.py\b")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def move() -> set[Path]:
    moved: set[Path] = set()
    for pkg in NEWPKGS:
        (CORE / pkg).mkdir(exist_ok=True)
        init = CORE / pkg / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{PKG_DOCS[pkg]}"""\n')
            git("add", str(init))
    for old, new in MAP.items():
        src, dst = CORE / f"{old}.py", CORE / (new.replace(".", "/") + ".py")
        if src.exists() and not dst.exists():
            git("mv", str(src), str(dst))
            moved.add(dst)
    return moved


def is_new_path(mod: str, rest: list[str]) -> bool:
    """`gputui.core.MOD.REST...` already names a new package's module (config.file, session.model, ...)."""
    return mod in SUBMODS and bool(rest) and rest[0] in SUBMODS[mod]


def split_names(names: str) -> list[tuple[str, str]]:
    out = []
    for part in names.split(","):
        name, _, alias = part.strip().partition(" as ")
        if name:
            out.append((name.strip(), alias.strip()))
    return out


def rewrite_abs(src: str, names: str) -> list[tuple[str, str]] | None:
    """`from SRC import NAMES` with SRC absolute, as the lines it becomes; None where it stays."""
    if src == "gputui.core":
        body, _, comment = names.partition("#")
        if body.strip().startswith("("):
            return None
        groups: dict[str, list[str]] = {}
        for name, alias in split_names(body):
            new = MAP.get(name)
            if new is None:
                groups.setdefault(src, []).append(f"{name} as {alias}" if alias else name)
                continue
            pkg, mod = new.split(".")
            alias = alias or (name if mod != name else "")
            groups.setdefault(f"gputui.core.{pkg}", []).append(f"{mod} as {alias}" if alias else mod)
        if list(groups) == [src]:
            return None
        tail = f"  #{comment}" if comment else ""
        lines = [(s, ", ".join(ns)) for s, ns in groups.items()]
        lines[-1] = (lines[-1][0], lines[-1][1] + tail)
        return lines
    if src.startswith("gputui.core."):
        mod, *rest = src[len("gputui.core.") :].split(".")
        if mod not in MAP or is_new_path(mod, rest):
            return None
        imported = [n for n, _ in split_names(names.split("#")[0].strip("() "))]
        if mod in SUBMODS and not rest and imported and all(n in SUBMODS[mod] for n in imported):
            return None  # `from gputui.core.session import model`: already the new layout
        return [(f"gputui.core.{'.'.join([MAP[mod], *rest])}", names)]
    return None


def rewrite_from(m: re.Match[str], package: str | None, moved: bool) -> str:
    """Rewrite one from-import; relative ones are resolved against PACKAGE (where the file was written)."""
    ind, src, names = m["ind"], m["src"], m["names"]
    dots = len(src) - len(src.lstrip("."))
    if dots:
        if package is None:
            return m[0]
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - dots + 1])
        src = base + ("." + src[dots:] if src[dots:] else "")
    lines = rewrite_abs(src, names)
    if lines is None:
        if moved and dots:  # a moved module sits one level deeper: its relative imports become absolute
            return f"{ind}from {src} import {names}"
        return m[0]
    out = []
    for s, n in lines:
        if dots and not moved and (s == base or s.startswith(base + ".")):
            s = "." * dots + s[len(base) + 1 :]
        out.append(f"{ind}from {s} import {n}")
    return "\n".join(out)


def rewrite(text: str, package: str | None, moved: bool, py: bool, toml: bool) -> str:
    out = []
    for line in text.split("\n"):
        m = FROM.match(line) if py else None
        if m:
            out.append(rewrite_from(m, package, moved))
            continue

        def dotted(d: re.Match[str]) -> str:
            mod, rest = d["mod"], d["rest"]
            if mod not in MAP or is_new_path(mod, [rest[1:]] if rest else []):
                return d[0]
            return f"gputui.core.{MAP[mod]}{rest}"

        if not toml:  # pyproject.toml's package list names the new packages (gputui.core.config)
            line = DOTTED.sub(dotted, line)
        line = SLASHED.sub(lambda s: f"gputui/core/{MAP[s['mod']].replace('.', '/')}.py" if s["mod"] in MAP else s[0], line)
        out.append(line)
    return "\n".join(out)


def list_packages() -> None:
    """pyproject.toml lists the packages (it does not find them): add the new ones after gputui.core."""
    p = Path("pyproject.toml")
    text = p.read_text()
    missing = [f'    "gputui.core.{pkg}",\n' for pkg in NEWPKGS if f'"gputui.core.{pkg}"' not in text]
    if missing:
        p.write_text(text.replace('    "gputui.core",\n', '    "gputui.core",\n' + "".join(missing), 1))


# Code that names its own place: each (file, old text, new text), applied where the old text is still there.
CORE_DOC = '''"""Headless core of gputui: everything both frontends (the app, the CLI) do, by domain. Never imports textual.

Packages, from the bottom up (a package imports only itself, the packages below it and the leaves):

=============  =========================================================================================
leaves         ``errors`` (exit statuses), ``paths`` (our files here), ``safetext`` (host text made safe),
               ``durations``, ``jsonout``
``config``     the user's config file: what it may hold, errors naming file, line and field
``insights``   reading a training log: progress, ETA, metrics, hints
``deploy``     the agent build, its unpacking on a host, the local agent process and its early start
``transport``  the Link (agent protocol, client end), local and SSH transports, known_hosts files
``session``    one host's HostSession across link drops, its snapshots (model), metrics history, series
``files``      sync, pull, what was pulled, artifacts, port forwards
``money``      prices and the ledger, spend and budgets, release, autostop, provider clients
``jobs``       job use cases (run, list, history), run records, compare, headline metrics, insights cache
``hosts``      the fleet, add/remove in the config, trust a host key, doctor, Slurm cluster view
=============  =========================================================================================
"""
'''

SPECIAL = [
    ("tests/test_ssh_cli.py", '"from gputui.core import config; ', '"from gputui.core.config import file as config; '),
    (
        "tests/test_hygiene.py",
        'INSTALLER = ROOT / "gputui" / "core" / "agent_install.py"',
        'INSTALLER = ROOT / "gputui" / "core" / "deploy" / "install.py"',
    ),
    ("gputui/core/__init__.py", '"""Headless core of gputui: transports, sessions, state. Never imports textual."""\n', CORE_DOC),
    ("gputui/core/hosts/fleet.py", 'f"{__package__}.ssh_transport"', '"gputui.core.transport.ssh"'),
    (
        "gputui/core/jobs/insights_cache.py",
        'core = Path(__file__).parent\n    for path in [*sorted((core / "insights").glob("*.py")), core / "records.py"]:',
        'core = Path(__file__).parent.parent\n'
        '    for path in [*sorted((core / "insights").glob("*.py")), core / "jobs" / "records.py"]:',
    ),
    (
        "tests/test_cli_local.py",
        "for m in pkgutil.iter_modules(c.__path__):\\n\"\n        \"    importlib.import_module('gputui.core.' + m.name)",
        "for m in pkgutil.walk_packages(c.__path__, 'gputui.core.'):\\n\"\n        \"    importlib.import_module(m.name)",
    ),
]


def special() -> None:
    for name, old, new in SPECIAL:
        p = Path(name)
        text = p.read_text()
        if old in text:
            p.write_text(text.replace(old, new))


def main() -> None:
    moved = move()
    for f in git("ls-files", "*.py", "*.md", "*.toml", "*.sh", "*.tcss", "*.cfg", "*.txt").split():
        p = Path(f)
        if not p.is_file():
            continue
        text = p.read_text()
        # relative imports are resolved where they were written: the moved modules sat in gputui.core
        is_moved = p in moved
        package = "gputui.core" if is_moved else ".".join(p.parent.parts) if p.parts[0] == "gputui" else None
        new = rewrite(text, package, is_moved, py=p.suffix == ".py", toml=p.name == "pyproject.toml")
        if new != text:
            p.write_text(new)
    list_packages()
    special()


if __name__ == "__main__":
    main()

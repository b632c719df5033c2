"""The agent stays deployable anywhere: stdlib (+ pynvml) only, nothing newer than Python 3.8; the bundle is
reproducible. No module of the agent or the core imports another that imports it back, even lazily."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

from gputui.core.deploy import bundle
from remote_agent import protocol as P

AGENT = ROOT / "remote_agent"
INSTALLER = ROOT / "gputui" / "core" / "deploy" / "install.py"  # runs on the host too


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which never runs."""
    for child in ast.iter_child_nodes(tree):
        typing_only = isinstance(child, ast.If) and ast.unparse(child.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        )
        for node in child.orelse if typing_only else [child]:
            yield node
            yield from _run_time_nodes(node)


def module_imports(package: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """Every module of ``package`` (dotted name) -> the modules of the same tree that importing it runs."""
    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        found = run_time_imports(path, name)
        graph[name] = {m for m in found if m in names and not f"{name}.".startswith(f"{m}.")}
    return graph


def run_time_imports(path: Path, name: str) -> set[str]:
    """What importing module ``name`` (at ``path``) imports when it runs, absolute; with ``from X import Y`` also
    ``X.Y`` (Y may be a module), and the packages above each (importing a.b.c runs a and a.b first)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _run_time_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1]) if node.level else ""
            mod = ".".join(p for p in (base, node.module) if p)
            found |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return found | {m.rsplit(".", n)[0] for m in found for n in range(1, m.count(".") + 1)}


def _modules(package: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) through each module that imports itself back."""
    cycles = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            name, path = stack.pop()
            for dep in sorted(graph[name]):
                if dep == start:
                    cycles.append([*path, start])
                    stack = []
                    break
                if dep not in seen:
                    seen.add(dep)
                    stack.append((dep, [*path, dep]))
    return cycles


@pytest.mark.parametrize("package", ["remote_agent", "gputui/core", "gputui"])
def test_no_import_cycles(package: str) -> None:
    graph = module_imports(ROOT / package)
    assert len(graph) > 5 and any(graph.values())  # the walk saw the modules and their imports
    assert import_cycles(graph) == []


def test_import_cycle_finder_sees_lazy_relative_and_package_imports_not_typing_ones(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    from . import d\n"
    )
    (pkg / "b.py").write_text("def f():\n    from .sub.c import g\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import x\n")
    (pkg / "d.py").write_text("from .sub import c\n")
    graph = module_imports(pkg, tmp_path)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub", "pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.sub", "pkg.sub.c"}
    assert import_cycles(graph) == [
        ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"],
        ["pkg.b", "pkg.sub.c", "pkg.a", "pkg.b"],
        ["pkg.sub.c", "pkg.a", "pkg.b", "pkg.sub.c"],
    ]


#: gputui.core's domain packages from the bottom up: each imports only itself, those before it and the leaves.
CORE_LAYERS = ("config", "insights", "deploy", "transport", "session", "files", "money", "jobs", "hosts")
CORE_LEAVES = ("errors", "paths", "safetext", "durations", "jsonout")
#: All the client takes from the agent's code: the package (the bundle is built from it), the wire schema, the
#: file helpers both sides use, the restart policy's parser, the provider clients (a release from here), and the
#: rules for a secret's name and size (checked here before anything is sent).
AGENT_SHARED = {"remote_agent.protocol", "remote_agent.fsutil", "remote_agent.jobs.restart", "remote_agent.host.provider",
                "remote_agent.jobs.secrets", "remote_agent.jobs.image", "remote_agent.jobs.group"}


def layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` (gputui.core's modules) that go up or across the layers, or out of a leaf."""
    def part(module: str) -> str:
        return module.split(".")[2] if module.count(".") >= 2 else ""

    bad = []
    for name, deps in sorted(graph.items()):
        here = part(name)
        if here and here not in CORE_LAYERS + CORE_LEAVES:
            bad.append(f"{name}: in no domain package (see gputui/core/__init__.py)")
        for dep in sorted(deps):
            there = part(dep)
            if not there or there == here or there in CORE_LEAVES or there not in CORE_LAYERS:
                continue
            if here not in CORE_LAYERS or CORE_LAYERS.index(there) > CORE_LAYERS.index(here):
                bad.append(f"{name} -> {dep}")
    return bad


def test_core_packages_import_only_themselves_those_below_and_the_leaves() -> None:
    graph = module_imports(ROOT / "gputui" / "core")
    assert any(d.startswith("gputui.core.session.") for d in graph["gputui.core.hosts.fleet"])  # the walk sees them
    assert layer_breaches(graph) == []


def test_layer_check_sees_an_import_up_across_or_out_of_a_leaf() -> None:
    graph = {
        "gputui.core.session.host": {"gputui.core.hosts.fleet", "gputui.core.transport.link", "gputui.core.paths"},
        "gputui.core.files.sync": {"gputui.core.money.cost"},
        "gputui.core.paths": {"gputui.core.config.file"},
        "gputui.core.stray": set(),
    }
    assert layer_breaches(graph) == [
        "gputui.core.files.sync -> gputui.core.money.cost",
        "gputui.core.paths -> gputui.core.config.file",
        "gputui.core.session.host -> gputui.core.hosts.fleet",
        "gputui.core.stray: in no domain package (see gputui/core/__init__.py)",
    ]


def test_only_sshlib_imports_asyncssh() -> None:
    """asyncssh loads the slow way unless sshlib imports it first: every other module takes it from there."""
    bad = [
        name
        for name, path in _modules(ROOT / "gputui")
        if name != "gputui.core.transport.sshlib"
        and any(m.split(".")[0] == "asyncssh" for m in run_time_imports(path, name))
    ]
    assert bad == []


def test_importing_gputui_warns_nothing() -> None:
    """cryptography 51 made asyncssh's import print five DeprecationWarnings about DSA on every command's stderr."""
    names = [name for name, _ in _modules(ROOT / "gputui") if not name.endswith("__main__")]
    code = "import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)"
    done = subprocess.run([sys.executable, "-W", "default", "-c", code, *names], capture_output=True, text=True, cwd=ROOT)
    assert (done.returncode, done.stderr) == (0, "")


def test_the_client_takes_from_the_agent_only_what_both_sides_share() -> None:
    """The frontends (ui/, cli/) never import the agent; the core only the shared modules (AGENT_SHARED)."""
    bad = []
    for name, path in _modules(ROOT / "gputui"):
        agent = {m for m in run_time_imports(path, name) if m.split(".")[0] == "remote_agent"} - {"remote_agent"}
        if not name.startswith("gputui.core."):
            bad += [f"{name} -> {m}" for m in sorted(agent)]
        else:  # a shared module's names (remote_agent.protocol.X) and the packages above it are the module
            bad += [
                f"{name} -> {m}"
                for m in sorted(agent)
                if not any(m == s or m.startswith(s + ".") or s.startswith(m + ".") for s in AGENT_SHARED)
            ]
    assert bad == []


def test_agent_imports_only_stdlib_and_pynvml() -> None:
    allowed = set(sys.stdlib_module_names) | {"pynvml", "remote_agent"}
    bad = []
    for path in AGENT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert bad == []


def test_agent_needs_nothing_newer_than_python_38() -> None:
    # a test dependency: missing, this fails (it never skips); run by this interpreter, not whatever is on PATH
    assert importlib.util.find_spec("vermin"), "vermin is not installed: pip install -e '.[test]'"
    res = subprocess.run(
        [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())",
         "-t=3.8-", "--no-tips", "--violations", "--eval-annotations", str(AGENT), str(INSTALLER)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_bundle_is_reproducible_and_named_by_its_hash() -> None:
    name1, data1 = bundle.agent_build()
    name2, data2 = bundle.agent_build()
    assert data1 == data2 and name1 == name2
    assert name1 == f"gputui-agent-{hashlib.sha256(data1).hexdigest()[:16]}.pyz"


@pytest.mark.parametrize("form", ["zipapp", "unpacked"])
def test_bundle_runs_standalone(tmp_path: Path, form: str) -> None:
    path = bundle.ensure_local_build(tmp_path)
    assert (path / "__main__.py").is_file() and (path / "remote_agent" / "server.py").is_file()
    if form == "zipapp":
        path = tmp_path / bundle.agent_build()[0]
        path.write_bytes(bundle.build_bytes())
        names = zipfile.ZipFile(path).namelist()
        assert "__main__.py" in names and "remote_agent/server.py" in names
    proc = subprocess.run(
        [sys.executable, "-I", str(path), "serve", "--state-dir", str(tmp_path / "state")],
        input=b'{"id": 1, "op": "ping", "args": {}}\n',
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    frames = [json.loads(line) for line in proc.stdout.splitlines()]
    hello = frames[0]
    assert (
        hello["event"] == "hello"
        and hello["data"]["build"] == bundle.agent_build()[0][len("gputui-agent-") : -4]
    )
    assert any(f.get("id") == 1 and f.get("ok") for f in frames)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, with ``from X import Y`` also as ``X.Y`` (Y may be a module)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


#: The files ops: sync and pull send them (gputui/core/files/sync.py, pull.py); HostSession alone sends every other op.
OP_NAMES = {name: value for name, value in vars(P).items() if name.startswith("OP_") and isinstance(value, str)}
FILE_OPS = {name for name in OP_NAMES if name.startswith("OP_FILES_")}
SESSION_OPS = {name for name, value in OP_NAMES.items() if value in P.OPS} - FILE_OPS


def test_the_op_table_is_what_the_agent_answers_and_the_client_sends() -> None:
    """One op table (protocol.OPS): the agent dispatches exactly its ops, and each is sent by the client."""
    from remote_agent.ops import HANDLERS

    assert set(HANDLERS) == set(P.OPS)
    core = "".join(p.read_text() for p in (ROOT / "gputui" / "core").rglob("*.py"))
    unsent = [name for name in SESSION_OPS | FILE_OPS if f"P.{name}" not in core]
    assert unsent == []  # an op the client never sends is an op on one side only
    assert {op: spec.args for op, spec in P.OPS.items() if spec.args is not None} == P.OP_ARGS


def test_only_the_core_speaks_the_agent_protocol() -> None:
    """The frontends go through gputui.core; of the core, only HostSession sends the ops above."""
    gputui = ROOT / "gputui"
    frontends = [*(gputui / "ui").rglob("*.py"), *(gputui / "cli").rglob("*.py"), gputui / "tables.py"]
    bad = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in frontends
        for name in _imports(p)
        if name == "remote_agent.protocol"
    ]
    assert bad == []
    senders = sorted(
        str(p.relative_to(ROOT))
        for p in gputui.rglob("*.py")
        if any(isinstance(n, ast.Attribute) and n.attr in SESSION_OPS for n in ast.walk(ast.parse(p.read_text())))
    )
    assert senders == ["gputui/core/session/host.py"]


def _private_app_attributes(path: Path) -> list[str]:
    """``app._x`` and ``self.app._x`` in ``path``: a reach into the app's private parts."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and (
            (isinstance(node.value, ast.Name) and node.value.id == "app")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "app")
        )
    ]


def test_flows_screens_and_widgets_use_the_apps_public_surface() -> None:
    """Only gputui/ui/app.py touches the app's private methods and fields; the flows (gputui/ui/flows/) and
    every screen or widget use what it offers in public (session, ledger, confirm, notify, run_worker, ...)."""
    ui = ROOT / "gputui" / "ui"
    assert (ui / "flows" / "release.py").is_file() and (ui / "flows" / "files.py").is_file()
    bad = [hit for path in sorted(ui.rglob("*.py")) if path != ui / "app.py" for hit in _private_app_attributes(path)]
    assert bad == []


def test_an_ops_prefix_names_its_module() -> None:
    """``release.check`` is ``ops/release.py:release_check``: an op is found from its name (the few ops without a
    family of their own live where they are listed here)."""
    from remote_agent import ops

    elsewhere = {"ping": "host", "shutdown": "host", "doctor": "host", "slurm": "host", "queue": "jobs",
                 "notify": "watchdog"}
    for op, fn in ops.HANDLERS.items():
        family = op.split(".")[0]
        assert fn.__module__ == f"remote_agent.ops.{elsewhere.get(family, family)}", (op, fn.__module__)


def test_module_aliases_are_words_but_the_two_house_ones() -> None:
    """A module imported under another name gets a word (``restart_policy``, ``job_series``), never a letter or
    two that means a different module in each file; the two house aliases are ``M`` (the client's session model)
    and ``P`` (the wire protocol). torch's ``F`` is PyTorch's own convention: the examples keep it."""
    house = {"M": "model", "P": "protocol"}
    bad = []
    for folder in ("gputui", "remote_agent", "tests", "scripts", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for a in node.names:
                        if a.asname and len(a.asname) <= 3 and a.asname.isupper() and house.get(a.asname) != a.name.rsplit(".", 1)[-1]:
                            bad.append(f"{path.relative_to(ROOT)}: {a.name} as {a.asname}")
    assert bad == []


def test_no_formatter_markers() -> None:
    """No formatter runs here (``ruff check`` only, docs/development.md): a formatter's skip marker is only noise."""
    marker = "# fmt" + ":"
    hits = [str(p.relative_to(ROOT)) for folder in ("gputui", "remote_agent", "tests", "scripts", "bench", "examples")
            for p in sorted((ROOT / folder).rglob("*.py")) if marker in p.read_text()]
    assert hits == []

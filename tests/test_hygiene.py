"""The agent stays deployable anywhere: stdlib (+ pynvml) only, nothing newer than Python 3.8; the bundle is reproducible."""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

from gputui.core import bundle

AGENT = ROOT / "remote_agent"


def test_agent_imports_only_stdlib_and_pynvml() -> None:
    allowed = set(sys.stdlib_module_names) | {"pynvml", "remote_agent"}
    bad = []
    for path in AGENT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert bad == []


def test_agent_needs_nothing_newer_than_python_38() -> None:
    vermin = shutil.which("vermin")
    if vermin is None:
        pytest.skip("vermin is not installed (pip install -e '.[test]')")
    res = subprocess.run(
        [vermin, "-t=3.8-", "--no-tips", "--violations", "--eval-annotations", str(AGENT)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_bundle_is_reproducible_and_named_by_its_hash() -> None:
    name1, data1 = bundle.agent_build()
    name2, data2 = bundle.agent_build()
    assert data1 == data2 and name1 == name2
    assert name1 == f"gputui-agent-{hashlib.sha256(data1).hexdigest()[:16]}.pyz"


def test_bundle_runs_standalone(tmp_path: Path) -> None:
    path = bundle.ensure_local_build(tmp_path)
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
    assert hello["event"] == "hello" and hello["data"]["build"] == path.name[len("gputui-agent-") : -len(".pyz")]
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


#: The agent ops HostSession alone sends: jobs, logs, exec, doctor, the autostop watchdog.
SESSION_OPS = {
    "OP_JOBS_START", "OP_JOBS_KILL", "OP_JOBS_LIST", "OP_LOGS_READ", "OP_LOGS_FOLLOW", "OP_LOGS_UNFOLLOW",
    "OP_LOGS_TIMES", "OP_EXEC", "OP_DOCTOR", "OP_WATCHDOG_CONFIGURE", "OP_WATCHDOG_SNOOZE", "OP_WATCHDOG_CANCEL",
}  # fmt: skip


def test_only_the_core_speaks_the_agent_protocol() -> None:
    """The frontends go through gputui.core; of the core, only HostSession sends the ops above."""
    gputui = ROOT / "gputui"
    frontends = [*(gputui / "ui").rglob("*.py"), gputui / "cli.py", gputui / "tables.py"]
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
    assert senders == ["gputui/core/session.py"]

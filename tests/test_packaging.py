"""The wheel ships every module and the built-in themes, which live in the top-level themes/; an editable
install finds them too. Both are installed, offline, into a clean venv that holds nothing else but what the
theme loader imports (textual and its dependencies, linked from this interpreter's site-packages)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from conftest import ROOT

pytest.importorskip("setuptools", minversion="70.1", reason="building the wheel needs setuptools>=70.1")

BUILTIN = ["gputui-contrast", "gputui-dark", "gputui-light"]
#: What a source distribution of gputui holds: the build needs nothing else.
SOURCES = ("pyproject.toml", "README.md", "gputui", "remote_agent", "themes")
LOAD_THEMES = """
import json
from gputui.ui import themes as theme_files
found, errors = theme_files.load_themes(theme_files.BUILTIN_DIR)
print(json.dumps({"module": theme_files.__file__, "dir": str(theme_files.BUILTIN_DIR),
                  "names": sorted(t.name for t in found), "errors": errors}))
"""


def _pip(*args: str | Path) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *map(str, args)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a checkout's gputui.egg-info there
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)  # would pass as installed
    assert res.returncode == 0, res.stdout + res.stderr


def _checkout_copy(dest: Path) -> Path:
    """The sources in a temp dir, so a build leaves nothing (build/, *.egg-info) in the checkout."""
    dest.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _loader_deps(dest: Path) -> Path:
    """A folder of links to textual and every installed distribution it requires, and nothing else."""
    dest.mkdir()
    todo, seen = ["textual"], {}
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            seen[name] = dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # an optional extra that is not installed
            continue
        todo += [re.match(r"[A-Za-z0-9_.-]+", req).group() for req in dist.requires or ()]
    for dist in seen.values():
        for top in {Path(f).parts[0] for f in dist.files or ()}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (dest / top).exists():
                (dest / top).symlink_to(Path(str(dist.locate_file(top))))
    return dest


def _clean_venv(path: Path, deps: Path) -> Path:
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    site = subprocess.run(
        [python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "theme_loader_deps.pth").write_text(f"{deps}\n")
    return python


def _load_builtin_themes(python: Path, cwd: Path) -> dict:
    """The built-in themes as the installed gputui finds them (-I: no PYTHONPATH, no checkout on sys.path)."""
    res = subprocess.run(
        [python, "-I", "-c", LOAD_THEMES], capture_output=True, text=True, cwd=cwd, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_wheel_ships_every_module_and_the_builtin_themes(tmp_path: Path) -> None:
    src = _checkout_copy(tmp_path / "src")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path / "dist", src)
    (wheel,) = (tmp_path / "dist").glob("gputui-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        p.relative_to(ROOT).as_posix()
        for pkg in ("gputui", "remote_agent")
        for p in (ROOT / pkg).rglob("*.py")
    }
    missing = sorted(expected - names)
    assert missing == [], (
        f"not in the wheel (list new packages in pyproject's [tool.setuptools] packages): {missing}"
    )
    assert {f"gputui/themes/{n}.toml" for n in BUILTIN} <= names and "gputui/ui/gputui.tcss" in names

    python = _clean_venv(tmp_path / "venv", _loader_deps(tmp_path / "deps"))
    _pip("--python", python, "install", "--no-deps", "--no-index", wheel)
    shutil.rmtree(src)  # nothing may come from the sources any more
    got = _load_builtin_themes(python, cwd=tmp_path)
    assert got["names"] == BUILTIN and got["errors"] == []
    assert Path(got["module"]).is_relative_to(tmp_path / "venv")
    assert Path(got["dir"]).parts[-2:] == ("gputui", "themes") and Path(got["dir"]).is_relative_to(
        tmp_path / "venv"
    )


def test_editable_install_finds_the_top_level_themes(tmp_path: Path) -> None:
    src = _checkout_copy(tmp_path / "src")
    python = _clean_venv(tmp_path / "venv", _loader_deps(tmp_path / "deps"))
    _pip("--python", python, "install", "--no-deps", "--no-build-isolation", "--no-index", "-e", src)
    got = _load_builtin_themes(python, cwd=tmp_path)
    assert got["names"] == BUILTIN and got["errors"] == []
    assert Path(got["module"]) == src / "gputui" / "ui" / "themes.py" and Path(got["dir"]) == src / "themes"

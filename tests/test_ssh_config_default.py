"""ssh_config: ~/.ssh/config is honoured when present and fine when missing, even when named; other names must exist."""

from __future__ import annotations

import json

import pytest
from conftest import SshHome


def _config_with(ssh_home: SshHome, ssh_config: str) -> None:
    settings = "\n".join(f"{k} = {json.dumps(v)}" for k, v in ssh_home.host_settings().items())
    ssh_home.write_config(f'ssh_config = "{ssh_config}"\n[hosts.box]\n{settings}\n')


@pytest.mark.parametrize("spelled", ["tilde", "absolute"])
def test_the_default_ssh_config_may_be_missing_even_when_named(ssh_home: SshHome, spelled: str) -> None:
    """docs/ssh-hosts.md's example line (`ssh_config = "~/.ssh/config"`, the default) on a HOME without that file."""
    default = ssh_home.root / ".ssh" / "config"
    assert not default.exists()
    _config_with(ssh_home, "~/.ssh/config" if spelled == "tilde" else str(default))
    res = ssh_home.cli("jobs", "box")
    assert res.returncode == 0, res.stderr
    assert "no such file" not in res.stderr


def test_a_named_missing_ssh_config_is_a_config_error(ssh_home: SshHome) -> None:
    missing = ssh_home.root / "elsewhere" / "ssh_config"
    _config_with(ssh_home, str(missing))
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == 2, res.stderr
    assert f"ssh_config {missing}: no such file" in res.stderr

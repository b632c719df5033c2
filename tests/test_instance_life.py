"""Issue 40: a provider instance's life from this machine. ``gputui start HOST`` starts a stopped RunPod pod /
vast.ai instance with the user's key here, follows it to the SSH port the start gave it (no config edit) and
connects there; the host's agent names its instance so that gputui knows it once the host is stopped. The
providers are played by tests/provider_standin.py, the host by the real sshd (a fault proxy is the new port)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import provider_standin as standin
import pytest
from conftest import Home, SshHome, stop_host, wait_for
from faultproxy import FaultProxy
from provider_standin import RUNPOD_KEY, VAST_KEY, StandIn

from gputui.core.money import lifecycle
from gputui.core.transport import instances
from remote_agent.host import boot
from remote_agent.host import provider as pv
from remote_agent.jobs import restart

POD, VAST_ID = "xedezhzb9la3ye", "2181204"


@pytest.fixture
def api() -> Iterator[StandIn]:
    state, server = standin.start()
    try:
        yield state
    finally:
        standin.stop(state, server)


def writes(api: StandIn) -> list[str]:
    return [m for m in api.methods() if not m.startswith("GET")]


def record_file(home: Home) -> Path:
    return home.root / ".local" / "state" / "gputui" / instances.NAME


def pod_box(ssh_home: SshHome, api: StandIn, port: int, status: str = "EXITED", **extra: object) -> None:
    """Host ``box`` is RunPod pod POD (config), its SSH mapped to ``port``; the user's key is in the environment."""
    api.pods[POD] = standin.runpod_pod(POD, status, ip="127.0.0.1", port=port)
    ssh_home.env["RUNPOD_API_KEY"] = RUNPOD_KEY
    path = ssh_home.configure(provider="runpod", instance_id=POD, **extra)
    with path.open("a") as f:
        f.write(f'[providers.runpod]\napi_url = "{api.base("runpod")}"\n')


def test_start_follows_the_pod_to_its_new_port_and_connects_there(
    ssh_home: SshHome, api: StandIn, proxy: FaultProxy
) -> None:
    """The done-when of issue 40: a stopped pod started from gputui comes back on another port; gputui follows
    it with no config edit (the config's address stays as written), and a second start starts nothing."""
    pod_box(ssh_home, api, ssh_home.sshd.port)
    api.start_ports = [proxy.port]  # the start maps SSH to the proxy's port
    config_before = (ssh_home.root / ".config" / "gputui" / "config.toml").read_bytes()
    res = ssh_home.cli("start", "box", "--timeout", "120", timeout=180)
    assert res.returncode == 0, res.stderr
    assert f"runpod {POD} (the config): stopped (EXITED)" in res.stderr
    assert f"box's SSH moved: 127.0.0.1:{ssh_home.sshd.port} -> 127.0.0.1:{proxy.port} (from runpod's API)" in res.stderr
    assert "box: started; 0 jobs running, 0 to resume by their restart policy, 0 queued; no autostop" in res.stdout
    assert writes(api) == [f"POST /runpod/pods/{POD}/start"]
    assert (ssh_home.root / ".config" / "gputui" / "config.toml").read_bytes() == config_before
    kept = json.loads(record_file(ssh_home).read_text())["box"]
    assert (kept["endpoint"], kept["base"]) == (["127.0.0.1", proxy.port], ["127.0.0.1", ssh_home.sshd.port])
    assert oct(record_file(ssh_home).stat().st_mode & 0o777) == "0o600"

    # Every later connection goes to the new port (the proxy counts them); the old one is not used.
    accepted = proxy.accepted
    status = ssh_home.cli("status", "--json", timeout=120)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["hosts"][0]["state"] == "connected"
    assert proxy.accepted > accepted

    again = ssh_home.cli("start", "box", "--timeout", "60", timeout=120)
    assert again.returncode == 0, again.stderr
    assert "box: was already running" in again.stdout
    assert writes(api) == [f"POST /runpod/pods/{POD}/start"]  # nothing started twice


def test_a_config_edit_wins_over_the_moved_endpoint(
    ssh_home: SshHome, api: StandIn, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod_box(ssh_home, api, ssh_home.sshd.port)
    api.start_ports = [proxy.port]
    assert ssh_home.cli("start", "box", timeout=180).returncode == 0
    from gputui.core.config import file as cfg
    from gputui.core.transport.ssh import SSHTransport

    monkeypatch.setenv("HOME", str(ssh_home.root))  # this process reads the same record and config
    host = cfg.load(str(ssh_home.root / ".config" / "gputui" / "config.toml")).host("box")
    assert SSHTransport(host).resolved().port == proxy.port
    terminal = " ".join(SSHTransport(host).terminal_prefix())
    assert f"HostName=127.0.0.1 -p {proxy.port} -o HostKeyAlias=[127.0.0.1]:{ssh_home.sshd.port}" in terminal
    edited = cfg.load(str(ssh_home.configure(port=ssh_home.sshd.port + 1, provider="runpod", instance_id=POD))).host("box")
    assert SSHTransport(edited).resolved().port == ssh_home.sshd.port + 1  # the user's new address wins


def test_a_moved_endpoint_trusts_the_key_trusted_where_the_config_says_and_no_other(tmp_path: Path) -> None:
    from gputui.core.transport import known_hosts as kh
    from gputui.core.transport.sshlib import asyncssh

    pod_key, other = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(2))
    line = pod_key.export_public_key("openssh").decode().split()
    known = asyncssh.import_known_hosts(f"[203.0.113.7]:22022 {line[0]} {line[1]}\n")
    match = kh.also_trusting(known, "203.0.113.7", 22022)
    [trusted, _, revoked, *_] = match("203.0.113.7", "203.0.113.7", 40111)
    assert [k.public_data for k in trusted] == [pod_key.public_data] and list(revoked) == []
    assert other.public_data not in [k.public_data for k in trusted]
    [none, *_] = kh.also_trusting(known, "203.0.113.8", 22022)("203.0.113.7", "203.0.113.7", 40111)
    assert list(none) == []  # another endpoint's key is no proof


def test_a_pod_back_without_its_gpus_is_a_loud_warning(ssh_home: SshHome, api: StandIn) -> None:
    pod_box(ssh_home, api, ssh_home.sshd.port)
    api.start_gpus = 0
    res = ssh_home.cli("start", "box", "--timeout", "120", timeout=180)
    assert res.returncode == 1, res.stderr
    assert f"WARNING: box: runpod brought {POD} back with 0 GPUs" in res.stderr
    assert "SSH moved" not in res.stderr  # the same port: nothing moved, nothing kept
    assert "endpoint" not in json.loads(record_file(ssh_home).read_text())["box"]


@pytest.mark.parametrize(
    "case, expect",
    [
        ("refused", "runpod refused to start it"),
        ("terminated", "was terminated; it cannot start"),
        ("no key", "no runpod API key on this machine: set $RUNPOD_API_KEY or ~/.runpod/config.toml"),
        ("unknown", "gputui does not know which RunPod pod or vast.ai instance it is"),
        ("lambda", "Lambda cannot stop an instance (only terminate it), so there is nothing to start"),
    ],
)
def test_a_start_that_cannot_happen_says_why_and_changes_nothing(
    ssh_home: SshHome, api: StandIn, case: str, expect: str
) -> None:
    pod_box(ssh_home, api, ssh_home.sshd.port, status="TERMINATED" if case == "terminated" else "EXITED")
    if case == "refused":
        api.refuse_start = "There are not enough free GPUs on the host machine to start this pod."
    elif case == "no key":
        del ssh_home.env["RUNPOD_API_KEY"]
    elif case == "unknown":
        ssh_home.configure(provider="runpod")
    elif case == "lambda":
        ssh_home.configure(provider="lambda")
    res = ssh_home.cli("start", "box", "--timeout", "30", timeout=90)
    assert res.returncode in (1, 2), res.stderr
    assert expect in res.stderr, res.stderr
    if case == "refused":  # in the provider's words
        assert "There are not enough free GPUs on the host machine to start this pod." in res.stderr
    assert [w for w in writes(api) if not w.endswith("/start")] == []
    assert api.pods[POD]["desiredStatus"] == ("TERMINATED" if case == "terminated" else "EXITED")


def test_the_hosts_agent_names_its_instance_and_gputui_keeps_it(
    home: Home, api: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running pod's agent says which pod it is (never its key): ``start`` knows it once the pod is stopped."""
    api.pods[POD] = standin.runpod_pod(POD)
    home.env.update(RUNPOD_POD_ID=POD, RUNPOD_API_KEY=RUNPOD_KEY)
    home.write_config(f'[hosts.pod]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    res = home.cli("status", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    kept = json.loads(record_file(home).read_text())
    assert kept["pod"]["provider"] == "runpod" and kept["pod"]["instance_id"] == POD
    assert RUNPOD_KEY not in record_file(home).read_text() and RUNPOD_KEY not in res.stdout
    home.write_config(f'[hosts.pod]\ntransport = "local"\nremote_dir = "{home.state_dir}"\nprovider = "none"\n')
    monkeypatch.setenv("HOME", str(home.root))
    from gputui.core.config import file as cfg

    config = cfg.load(str(home.root / ".config" / "gputui" / "config.toml"))
    assert lifecycle.known(config.host("pod")) is None  # provider = "none": not this host's instance


def test_the_providers_answers_give_endpoints_spot_gpus_and_the_stopped_rate() -> None:
    pod = pv._runpod_instance({**standin.runpod_pod(POD, "EXITED"), "interruptible": True}, POD)
    assert (pod.state, pod.endpoints, pod.interruptible, pod.gpus) == (
        "stopped", (("direct", "213.173.109.39", 13007),), True, 1,
    )
    assert pod.stopped_per_hour == pytest.approx(20 * 0.20 / 730)
    vast = pv._vast_instance({"instances": {**standin.vast_instance(int(VAST_ID)), "is_bid": True}}, VAST_ID)
    assert vast is not None and vast.endpoints == (("direct", "63.135.50.11", 40123), ("proxy", "ssh2281.vast.ai", 10882))
    assert vast.interruptible is True and vast.stopped_per_hour == pytest.approx(32 * 0.15 / 730)
    assert lifecycle.endpoint_of(vast, "ssh2281.vast.ai") == ("ssh2281.vast.ai", 10882)  # the relay the config uses
    assert lifecycle.endpoint_of(vast, "63.135.50.11") == ("63.135.50.11", 40123)

    # A field of the wrong type is unknown, and blocks only what needs it (a start needs the state).
    odd = {**standin.runpod_pod(POD), "publicIp": "1.2.3.4; rm -rf /", "portMappings": {"22": "x"},
           "gpu": {"count": -1}, "interruptible": "yes", "volumeInGb": 1e300}
    found = pv._runpod_instance(odd, POD).needed("start")
    assert (found.endpoints, found.gpus, found.interruptible, found.stopped_per_hour) == ((), None, None, None)
    assert {name for name, _ in found.unusable} == {"endpoints", "gpus", "interruptible", "stopped_per_hour"}
    with pytest.raises(pv.ProviderError):
        pv._runpod_instance({**standin.runpod_pod(POD), "desiredStatus": 5}, POD).needed("start")


def test_vastai_start_from_here(api: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    api.vast[VAST_ID] = standin.vast_instance(int(VAST_ID), "stopped", "stopped")
    api.start_ports = [40999]
    k = lifecycle.Known("vastai", VAST_ID, "the config")
    env = {"CONTAINER_ID": VAST_ID, "CONTAINER_API_KEY": VAST_KEY}
    detected = pv.Detected("vastai", VAST_ID, pv.ENVIRONMENT)
    pv.start(detected, api.base("vastai"), env)
    assert api.requests[-1].body == {"state": "running"} and k.provider == "vastai"
    pv.instance(detected, api.base("vastai"), env)  # the start settles after one read
    back = pv.instance(detected, api.base("vastai"), env)
    assert back.state == "running" and back.endpoints[0] == ("direct", "63.135.50.11", 40999)
    api.refuse_start = "no_such_ask: machine is rented"
    with pytest.raises(pv.ProviderError, match="vastai refused to start it: no_such_ask: machine is rented"):
        pv.start(detected, api.base("vastai"), env)


def test_a_release_is_of_one_life_a_started_pod_resumes_its_jobs(tmp_path: Path) -> None:
    """A pod stopped and started keeps the machine's boot: its jobs' restart policies count from PID 1's start
    (the container's), so a release before it no longer holds them back."""
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    stat.write_text(f"1 (tini) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {500 * ticks} 1000 10")
    booted = boot.boot_time()
    assert booted is not None and boot.life_start(str(stat)) == pytest.approx(booted + 500)
    assert boot.life_start(str(tmp_path / "missing")) == booted
    (tmp_path / "watchdog_state.json").write_text(json.dumps({"action": "released", "t": boot.life_start() - 1}))
    assert restart.released(str(tmp_path)) is False  # released in an earlier life: jobs resume
    (tmp_path / "watchdog_state.json").write_text(json.dumps({"action": "released", "t": boot.life_start() + 1}))
    assert restart.released(str(tmp_path)) is True


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "pod_state, interruptible, key, state, detail",
    [
        ("EXITED", False, True, "stopped", "runpod says EXITED; its disk bills 0.0055/h while stopped; gputui start box starts it"),
        ("EXITED", True, True, "preempted", "runpod says EXITED: a spot instance the provider took back"),
        ("gone", False, True, "terminated", f"runpod no longer lists {POD}"),
        ("RUNNING", False, True, "running", "runpod says RUNNING: the instance runs, its SSH does not answer"),
        ("EXITED", False, False, "unknown", "no runpod API key on this machine"),
    ],
)
def test_a_host_that_does_not_answer_shows_what_its_provider_says(
    ssh_home: SshHome, api: StandIn, pod_state: str, interruptible: bool, key: bool, state: str, detail: str
) -> None:
    """stopped, not down: status asks the provider (with the key here) about a host whose SSH does not answer."""
    pod_box(ssh_home, api, ssh_home.sshd.port, status="EXITED" if pod_state == "gone" else pod_state)
    api.pods[POD]["interruptible"] = interruptible
    if pod_state == "gone":
        del api.pods[POD]
    if not key:
        del ssh_home.env["RUNPOD_API_KEY"]
    path = ssh_home.root / ".config" / "gputui" / "config.toml"
    path.write_text(path.read_text().replace(f"port = {ssh_home.sshd.port}", f"port = {_closed_port()}"))
    res = ssh_home.cli("status", "--json", timeout=120)
    [host] = json.loads(res.stdout)["hosts"]
    assert host["state"] == "error" and host["instance"]["state"] == state, res.stdout
    assert detail in host["instance"]["detail"]
    short = ssh_home.cli("status", "--short", timeout=120).stdout
    assert short.strip() == (f"box {state}" if state != "unknown" else short.strip())
    text = ssh_home.cli("status", timeout=120).stdout
    assert f"  {state}  " in text
    assert writes(api) == []  # asking starts and stops nothing
    book = ssh_home.root / ".local" / "state" / "gputui" / "ledger.json"
    ledger = json.loads(book.read_text()) if book.exists() else {"hosts": {}}
    stopped = [iv for iv in ledger["hosts"].get("box", {}).get("intervals", []) if iv.get("kind") == "stopped"]
    if state in ("stopped", "preempted"):
        assert stopped and stopped[-1]["price"] == pytest.approx(20 * 0.20 / 730) and stopped[-1]["end"] is None
    else:
        assert stopped == []


def test_the_ledger_bills_a_stopped_instance_at_its_disk_rate_and_a_started_one_again(tmp_path: Path) -> None:
    from gputui.core.money.cost import Ledger

    ledger = Ledger(tmp_path / "ledger.json")
    ledger.observe("pod", 1000.0, 2.0, "boot-a", 1000.0)
    ledger.observe("pod", 4600.0, 2.0, "boot-a", 1000.0)  # up for an hour, seen last at 4600
    ledger.close("pod", 4600.0)  # gputui released it (stop)
    ledger.stopped("pod", 8200.0, 0.01)  # the provider says stopped, disk at 0.01/h
    assert ledger.spent("pod", 11800.0, live=False) == pytest.approx(2.0 * 1 + 0.01 * 2)  # stopped since 4600
    assert ledger.spent("pod", 11800.0, live=False, since=4600.0) == pytest.approx(0.01 * 2)
    ledger.started("pod", 11800.0)
    ledger.observe("pod", 11800.0, 2.0, "boot-a", 0.0)  # the same boot id (a pod keeps the machine's): billed
    ledger.observe("pod", 15400.0, 2.0, "boot-a", 0.0)
    assert ledger.spent("pod", 15400.0, live=True) == pytest.approx(2.0 + 0.02 + 2.0)
    ledger.save(force=True)
    again = Ledger(tmp_path / "ledger.json")
    assert [iv.kind for iv in again.intervals("pod")] == ["running", "stopped", "running"]

    # Started from the provider's console (no gputui start): seen up after a stopped look is a new run too.
    other = Ledger(tmp_path / "other.json")
    other.observe("pod", 0.0, 1.0, "b", 0.0)
    other.close("pod", 100.0)
    other.stopped("pod", 200.0, None)  # rate unknown: counted as 0 while stopped
    other.observe("pod", 3700.0, 1.0, "b", 0.0)
    other.observe("pod", 7300.0, 1.0, "b", 0.0)
    assert other.spent("pod", 7300.0, live=True) == pytest.approx(100 / 3600 + 1.0)


def test_the_app_says_a_host_was_preempted() -> None:
    from gputui.core.session import model as M
    from gputui.ui import notices

    down = M.HostSnapshot("pod", state=M.ERROR, error="connection refused")
    look = M.InstanceLook("runpod", POD, "preempted", "runpod says EXITED: a spot instance the provider took back")
    [notice] = notices.diff(down, M.HostSnapshot("pod", state=M.ERROR, error="connection refused", instance=look))
    assert notice.severity == "error" and notice.message.startswith("pod was preempted by its provider: runpod says")
    same = M.HostSnapshot("pod", state=M.ERROR, error="connection refused", instance=look)
    assert notices.diff(same, same) == []  # said once


def test_the_providers_price_is_used_without_autostop_and_a_typed_one_wins(home: Home, api: StandIn) -> None:
    """Where the config sets no price, the pod's own price (read there with its own key at every connect) is
    shown and billed at all times, not only while autostop is armed; a new price is the new one's."""
    api.pods[POD] = standin.runpod_pod(POD)
    home.env.update(RUNPOD_POD_ID=POD, RUNPOD_API_KEY=RUNPOD_KEY)
    table = f'[providers.runpod]\napi_url = "{api.base("runpod")}"\n[hosts.pod]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
    home.write_config(table)
    [host] = json.loads(home.cli("status", "--json", check=True, timeout=120).stdout)["hosts"]
    assert (host["cost"]["price_per_hour"], host["cost"]["price_source"]) == (0.74, "runpod")
    api.pods[POD]["costPerHr"] = "0.9"
    [host] = json.loads(home.cli("status", "--json", check=True, timeout=120).stdout)["hosts"]
    assert host["cost"]["price_per_hour"] == 0.9
    api.pods[POD]["costPerHr"] = ["0.9"]  # unusable: unknown, said why
    [host] = json.loads(home.cli("status", "--json", check=True, timeout=120).stdout)["hosts"]
    assert host["cost"]["price_per_hour"] is None and "costPerHr must be a number" in host["cost"]["price_unknown"]
    home.write_config(table + "price_per_hour = 2.0\n")
    asked = len(api.methods())
    [host] = json.loads(home.cli("status", "--json", check=True, timeout=120).stdout)["hosts"]
    assert (host["cost"]["price_per_hour"], host["cost"]["price_source"]) == (2.0, "config")
    assert len(api.methods()) == asked and writes(api) == []  # a typed price: the provider is not asked


JOB = """\
import json, os, sys, time
ckpt, finish = sys.argv[1], sys.argv[2]
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
print("from step %d" % step, flush=True)
while not os.path.exists(finish):
    step += 1
    with open(ckpt + ".new", "w") as f:
        json.dump({"step": step}, f)
    os.replace(ckpt + ".new", ckpt)
    time.sleep(0.05)
print("done at step %d" % step, flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a pod's PID namespace needs root (unshare), as CI has")
def test_a_pod_stopped_and_started_from_gputui_resumes_its_job_from_its_checkpoint(tmp_path: Path, api: StandIn) -> None:
    """The done-when of issue 40 end to end. The pod is an sshd that is PID 1 of its own PID namespace: its stop
    kills every process in it (agent, tmux, the job), its files stay (the volume). Stopped from gputui, it shows
    `stopped` and bills its disk; started from gputui it comes back on another port, which gputui follows with
    no config edit and no new host key to trust (the pod's key is the one trusted at the old port), and its
    restart-policy job resumes from its checkpoint. Only the two calls the user asked for reach the provider."""
    from sshd import Sshd, free_port

    pod = Sshd(tmp_path / "pod", pod=True)
    pod.client_key("ok", env={"RUNPOD_POD_ID": POD, "RUNPOD_API_KEY": RUNPOD_KEY})  # the pod's own variables
    home = SshHome(tmp_path / "home", pod.start())
    try:
        pod_box(home, api, pod.port, status="RUNNING")
        config, known = home.root / ".config" / "gputui" / "config.toml", home.known_hosts.read_bytes()
        config_before = config.read_bytes()
        job, ckpt, finish = tmp_path / "job.py", tmp_path / "ckpt.json", tmp_path / "finish"
        job.write_text(JOB)
        run = home.cli("run", "box", "--restart", "on-failure:3", "--", "python3", str(job), str(ckpt), str(finish))
        assert run.returncode == 0, run.stderr
        jid = run.stdout.split()[-1]
        wait_for(lambda: ckpt.exists() and json.loads(ckpt.read_text())["step"] >= 3, what="the job's checkpoints")
        assert home.cli("status", "--json", timeout=120).returncode == 0  # seen running: the ledger bills it

        api.on_release = pod.kill  # the provider stops the container: everything in it dies at once
        released = home.cli("release", "box", "--yes", "--force", "--no-pull", timeout=180)
        assert released.returncode == 0, released.stderr
        assert "released (confirmed: runpod: EXITED" in released.stdout
        at_stop = json.loads(ckpt.read_text())["step"]

        stopped = home.cli("status", "--json", timeout=120)
        [host] = json.loads(stopped.stdout)["hosts"]
        assert host["instance"]["state"] == "stopped", stopped.stdout

        new_port = free_port()
        api.start_ports = [new_port]
        api.on_start = lambda: (pod.move(new_port), pod.start())
        started = home.cli("start", "box", "--timeout", "120", timeout=180)
        assert started.returncode == 0, started.stderr
        assert f"-> 127.0.0.1:{new_port} (from runpod's API)" in started.stderr
        output = home.remote_job_dir(jid) / "output.log"
        wait_for(lambda: f"from step {at_stop}" in output.read_text(), timeout=60, what="the job to resume")
        assert "after the instance's stop lost the job, 0 s backoff" in output.read_text()
        finish.write_text("")
        wait_for(lambda: "done at step" in output.read_text(), what="the resumed job to finish")
        assert int(output.read_text().rsplit("done at step ", 1)[1].split()[0]) > at_stop
        assert home.cli("status", "--json", timeout=120).returncode == 0

        assert config.read_bytes() == config_before and home.known_hosts.read_bytes() == known
        assert writes(api) == [f"POST /runpod/pods/{POD}/stop", f"POST /runpod/pods/{POD}/start"]
        ledger = json.loads((home.root / ".local" / "state" / "gputui" / "ledger.json").read_text())
        billed = [(iv.get("kind", "running"), iv["price"]) for iv in ledger["hosts"]["box"]["intervals"]]
        assert billed == [("running", 0.74), ("stopped", pytest.approx(20 * 0.20 / 730)), ("running", 0.74)]
    finally:
        pod.kill()
        stop_host(home.remote_dir)


class Reconnects:
    """The stopped host's session in the app: counts the reconnects the start asks for."""

    def __init__(self) -> None:
        self.asked = 0

    def reconnect_now(self) -> None:
        self.asked += 1


async def test_the_apps_start_key_asks_first_then_starts_and_reconnects(
    home: Home, api: StandIn, sshd: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``S`` on a host whose provider says stopped: a confirmation naming the instance and its rate; a cancel
    starts nothing; a yes starts it (the real core, the provider played by the stand-in), says so and has the
    session reconnect at once. On a host that is not stopped it says so and asks nothing."""
    from test_ui_app import until
    from ui_fixtures import static_factory

    from gputui.core.config import file as cfg
    from gputui.core.session import model as M
    from gputui.ui.app import GpuTuiApp
    from gputui.ui.screens.confirm import ConfirmScreen

    api.pods[POD] = standin.runpod_pod(POD, "EXITED", ip="127.0.0.1", port=sshd.port)  # type: ignore[attr-defined]
    api.settle_reads = 0
    monkeypatch.setenv("RUNPOD_API_KEY", RUNPOD_KEY)
    monkeypatch.setenv("HOME", str(home.root))
    config = cfg.load(str(home.write_config(
        f'[providers.runpod]\napi_url = "{api.base("runpod")}"\n'
        f'[hosts.box]\nhost = "127.0.0.1"\nport = {sshd.port}\nprovider = "runpod"\ninstance_id = "{POD}"\n'  # type: ignore[attr-defined]
        '[hosts.up]\nhost = "127.0.0.2"\n'
    )))
    look = M.InstanceLook("runpod", POD, "stopped", "runpod says EXITED; its disk bills 0.0055/h while stopped")
    cost = M.CostInfo(price_per_hour=0.74)
    snaps = [M.HostSnapshot("box", state=M.ERROR, error="connection refused", instance=look, cost=cost),
             M.HostSnapshot("up", state=M.CONNECTED)]
    session = Reconnects()
    app = GpuTuiApp(config, source_factory=static_factory(snaps, session), state_path=home.root / "ui.json")

    def said(text: str) -> bool:
        return any(text in n.message for n in app._notifications)

    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.hosts["box"].instance is not None, what="the snapshots")
        await pilot.press("S")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        body = app.screen.body  # type: ignore[attr-defined]
        assert body.startswith("Start box?") and f"runpod {POD} (stopped)" in body and "0.74 USD/h" in body
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the cancel")
        assert writes(api) == [] and session.asked == 0
        await pilot.press("S")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: said("box started: reconnecting"), what="the start")
        assert said("runpod accepted the start") and said(f"waiting for SSH at 127.0.0.1:{sshd.port}")  # type: ignore[attr-defined]
        assert writes(api) == [f"POST /runpod/pods/{POD}/start"] and session.asked == 1

        await pilot.press("down")
        await until(pilot, lambda: app.selected_host == "up", what="the other host")
        await pilot.press("S")
        await until(pilot, lambda: said("gputui does not know which RunPod pod or vast.ai instance up is"), what="why not")
        assert not isinstance(app.screen, ConfirmScreen) and writes(api) == [f"POST /runpod/pods/{POD}/start"]


async def test_a_session_reconnects_at_once_when_asked_where_its_instance_came_back(
    ssh_home: SshHome, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A down host's session waits out its backoff (an hour here); a started instance is reconnected at once,
    to the endpoint the start learnt. A host given up on (an error retrying would not fix) is tried again."""
    import asyncio

    from gputui.core.config.file import HostConfig
    from gputui.core.session import host as session_module
    from gputui.core.session import model as M
    from gputui.core.transport.ssh import SSHTransport

    hour = session_module.Backoff
    monkeypatch.setattr(session_module, "Backoff", lambda: hour(base=3600.0, cap=3600.0))
    monkeypatch.setenv("HOME", str(ssh_home.root))
    closed = _closed_port()
    conf = HostConfig(name="box", **ssh_home.host_settings(port=closed))
    session = session_module.HostSession("box", SSHTransport(conf))
    session.run_in_background()
    try:
        for _ in range(600):
            if session.snapshot.state == M.RECONNECTING:
                break
            await asyncio.sleep(0.05)
        assert session.snapshot.state == M.RECONNECTING and "connection refused" in (session.snapshot.error or "")
        instances.put("box", instances.Record("runpod", POD, ("127.0.0.1", ssh_home.sshd.port), ("127.0.0.1", closed)))
        session.reconnect_now()
        await session.wait_connected(timeout=60)
        assert session.snapshot.state == M.CONNECTED
        session.reconnect_now()  # connected: left alone
        assert session.snapshot.state == M.CONNECTED
    finally:
        await session.close()

    key = ssh_home.root / "id_box"
    key.write_bytes(ssh_home.sshd.keys["stranger"].read_bytes())
    key.chmod(0o600)
    conf = HostConfig(name="box", **ssh_home.host_settings(identity_file=str(key)))
    session = session_module.HostSession("box", SSHTransport(conf))
    task = session.run_in_background()
    try:
        await asyncio.wait_for(asyncio.shield(task), 60)  # a refused key: given up on, not retried
        assert session.snapshot.state == M.ERROR and "authentication failed" in (session.snapshot.error or "")
        key.write_bytes(ssh_home.sshd.keys["ok"].read_bytes())  # the user fixed it meanwhile
        session.reconnect_now()
        await session.wait_connected(timeout=60)
    finally:
        await session.close()

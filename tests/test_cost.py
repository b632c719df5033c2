"""Money arithmetic and the idle rule, on sample sequences (pure functions, no I/O beyond a temp ledger)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gputui.core.config import file as cfg
from gputui.core.money import autostop, cost, spend
from gputui.core.session import model as M
from remote_agent.watchdog.activity import ActivityLog, busy_reasons, idle_status

H = 3600.0


def host(**kw) -> cfg.HostConfig:
    return cfg.HostConfig(name="a100", **kw)


def test_ledger_accrues_from_boot_and_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    led = cost.Ledger(path)
    led.observe("a100", now=10 * H, price=2.0, boot_id="b1", start=8 * H)  # booted 2 h before first seen
    assert led.spent("a100", now=10 * H, live=True) == pytest.approx(4.0)
    led.save(force=True)
    # client closed for 5 hours, then a new client process sees the same boot
    led2 = cost.Ledger(path)
    assert led2.spent("a100", now=15 * H, live=False) == pytest.approx(4.0)  # not seen since: bounded
    led2.observe("a100", now=15 * H, price=2.0, boot_id="b1", start=8 * H)
    assert led2.spent("a100", now=15 * H, live=True) == pytest.approx(14.0)  # the closed-laptop hours count


def test_reboot_closes_at_last_seen_and_restarts_at_new_boot(tmp_path: Path) -> None:
    led = cost.Ledger(tmp_path / "l.json")
    led.observe("h", 0.0, 1.0, "b1", 0.0)
    led.observe("h", 1 * H, 1.0, "b1", 0.0)
    # unseen for a while, then the host comes back with a new boot id 3 h later, booted at 3.5 h
    led.observe("h", 4 * H, 1.0, "b2", 3.5 * H)
    ivs = led.intervals("h")
    assert [(iv.start, iv.end) for iv in ivs] == [(0.0, 1 * H), (3.5 * H, None)]
    assert led.spent("h", 4 * H, live=True) == pytest.approx(1.5)  # the gap between is not billed


def test_price_change_splits_the_interval(tmp_path: Path) -> None:
    led = cost.Ledger(tmp_path / "l.json")
    led.observe("h", 0.0, 2.0, "b", 0.0)
    led.observe("h", 1 * H, 4.0, "b", 0.0)
    assert led.spent("h", 2 * H, live=True) == pytest.approx(2.0 + 4.0)


def test_release_closes_the_interval_until_a_new_instance(tmp_path: Path) -> None:
    led = cost.Ledger(tmp_path / "l.json")
    led.observe("h", 0.0, 2.0, "b", 0.0)
    led.close("h", 1 * H)
    assert led.released("h")
    led.observe("h", 1.1 * H, 2.0, "b", 0.0)  # still shutting down: ignored
    assert led.spent("h", 5 * H, live=True) == pytest.approx(2.0)
    led.observe("h", 6 * H, 2.0, "b2", 5.5 * H)  # a new instance under the same name
    assert not led.released("h") and led.spent("h", 6 * H, live=True) == pytest.approx(3.0)


def test_gap_in_observation_is_bounded_by_last_seen(tmp_path: Path) -> None:
    led = cost.Ledger(tmp_path / "l.json")
    led.observe("h", 0.0, 1.0, "b", 0.0)
    assert led.spent("h", 10 * H, live=False) == 0.0  # seen once at boot: nothing known beyond


def test_by_day_splits_at_local_midnight(tmp_path: Path) -> None:
    led = cost.Ledger(tmp_path / "l.json")
    start = dt.datetime(2026, 11, 28, 22, 0).timestamp()
    led.observe("h", start, 1.0, "b", start)
    now = start + 4 * H
    days = led.by_day("h", now, live=True)
    assert days == {"2026-11-28": pytest.approx(2.0), "2026-11-29": pytest.approx(2.0)}
    assert led.spent("h", now, True, since=cost.day_start(now)) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"hosts": {"h": {"intervals": [{"start": NaN, "end": null, "price": 1, "boot_id": "b", '
     '"last_seen": 0}]}}}', '{"hosts": {"h": {"intervals": [{"start": 0}]}}}', '{"hosts": []}', "[1]", "\xff"],
)
def test_unreadable_ledger_is_kept_aside_said_once_and_replaced(tmp_path: Path, content: str) -> None:
    path = tmp_path / "ledger.json"
    path.write_bytes(content.encode("latin-1"))
    led = cost.Ledger(path)
    [aside] = tmp_path.glob("ledger.json.bad-*")
    assert aside.read_bytes() == content.encode("latin-1") and not path.exists()
    assert led.notice is not None and "unreadable ledger" in led.notice and aside.name in led.notice
    led.observe("h", now=H, price=2.0, boot_id="b", start=0.0)
    led.save(force=True)
    again = cost.Ledger(path)
    assert again.notice is None and again.spent("h", H, live=False) == pytest.approx(2.0)


def test_ledger_is_fsynced_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    led = cost.Ledger(tmp_path / "ledger.json")
    led.observe("h", now=H, price=2.0, boot_id="b", start=0.0)
    led.save(force=True)
    assert events == ["fsync", "replace"]


def test_non_finite_prices_never_reach_the_ledger(tmp_path: Path) -> None:
    led = cost.Ledger(tmp_path / "ledger.json")
    led.observe("h", now=H, price=float("nan"), boot_id="b", start=0.0)
    led.observe("h", now=H, price=float("inf"), boot_id="b", start=0.0)
    led.save(force=True)
    assert led.intervals("h") == [] and cost.Ledger(tmp_path / "ledger.json").notice is None


def test_a_release_another_process_saved_is_never_undone_by_a_longer_lived_ledger(tmp_path: Path) -> None:
    """The app or the session service keeps its ledger for hours while commands save theirs: each save takes
    in what the others saved, so a command's release stays released, and each process's own decisions and
    observations of other hosts are kept too."""
    path = tmp_path / "ledger.json"
    service = cost.Ledger(path)  # long-lived: watches both hosts
    for now in (1 * H, 2 * H):
        service.observe("a", now=now, price=2.0, boot_id="ba", start=0.0)
        service.observe("b", now=now, price=1.0, boot_id="bb", start=0.0)
    service.save(force=True)
    command = cost.Ledger(path)  # ``gputui release a``: closes a's interval and marks it released
    command.close("a", 3 * H, boot_id="ba")
    command.save(force=True)
    service.observe("a", now=3.5 * H, price=2.0, boot_id="ba", start=0.0)  # still shutting down: not billed
    service.observe("b", now=4 * H, price=1.0, boot_id="bb", start=0.0)
    service.close("b", 4 * H, boot_id="bb")  # the service's own release of b
    other = cost.Ledger(path)  # meanwhile another command saw b up (its view is older than the service's release)
    other.observe("b", now=3.9 * H, price=1.0, boot_id="bb", start=0.0)
    other.save(force=True)
    service.save(force=True)
    after = cost.Ledger(path)
    assert after.released_since("a", 3 * H) and after.spent("a", now=10 * H, live=True) == pytest.approx(6.0)
    assert after.released_since("b", 4 * H) and after.spent("b", now=10 * H, live=True) == pytest.approx(4.0)
    service.merge_saved()  # the service's own view (what ``status`` answers from) has a's release too
    assert service.released("a") and service.spent("a", now=10 * H, live=True) == pytest.approx(6.0)


def test_price_from_gpu_models() -> None:
    gpus = tuple(M.GpuSample(index=i, name="NVIDIA H100 80GB HBM3") for i in range(8))
    prices = {"H100": 2.0, "H100 80GB HBM3": 2.49}
    assert cost.price_per_hour(host(), gpus, prices) == pytest.approx(8 * 2.49)  # the most specific key
    assert cost.price_per_hour(host(), gpus, {"A100": 1.0}) is None  # unknown model: no guess
    assert cost.price_per_hour(host(price_per_hour=30.0), gpus, prices) == 30.0  # explicit wins


def test_budget_thresholds() -> None:
    budget = cfg.Budget(daily=100.0, monthly=1000.0, warn_fraction=0.8)
    assert spend.budget_alerts(budget, 79.0, 500.0, "USD") == []
    [warn] = spend.budget_alerts(budget, 80.0, 500.0, "USD")
    assert (warn.period, warn.level) == ("daily", "warn") and "80%" in warn.message
    alerts = spend.budget_alerts(budget, 120.0, 1000.0, "USD")
    assert [(a.period, a.level) for a in alerts] == [("daily", "exceeded"), ("monthly", "exceeded")]


def test_deadline_from_release_after_hours() -> None:
    h = host(release_after_hours=10.0)
    assert autostop.deadline(h, boot_time=1000.0) == 1000.0 + 10 * H
    at = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    assert autostop.deadline(host(release_at=at, release_after_hours=10.0), 1000.0) == 1000.0 + 10 * H
    assert autostop.deadline(host(release_at=at), None) == at.timestamp()



def test_the_deadline_countdown_is_the_hosts_when_it_holds_one() -> None:
    """The host's watchdog may hold a deadline later than the config's (one past when set waits a grace):
    the countdown shows when the host will really act."""
    h = host(release_after_hours=10.0)
    now = 1000.0 + 11 * H  # the config's deadline passed an hour ago
    assert autostop.deadline_in_s({}, h, 1000.0, now) == 0.0
    held = {"watchdog": {"release_at": now + 600.0}}
    assert autostop.deadline_in_s(held, h, 1000.0, now) == 600.0  # type: ignore[arg-type]
    assert autostop.deadline_in_s({}, host(), 1000.0, now) is None

GPU_BUSY = {"index": 2, "util_percent": 43.0, "processes": [{"pid": 4411, "job": "7", "name": "python"}]}
GPU_FOREIGN = {"index": 0, "util_percent": 0.0, "processes": [{"pid": 4411, "job": None, "name": "jupyter"}]}


def test_reasons_text() -> None:
    jobs = [{"id": "7", "state": "running"}, {"id": "6", "state": "succeeded"}]
    sample = {"gpus": [GPU_FOREIGN, GPU_BUSY]}
    sessions = [{"user": "ana", "tty": "pts/0", "from": "10.1.2.3"}]
    assert busy_reasons(sample, jobs, 5.0, sessions) == [
        "job 7 running",
        "pid 4411 (jupyter) uses GPU 0",
        "GPU 2 at 43%",
        "login ana on pts/0 from 10.1.2.3",
    ]
    assert busy_reasons({"gpus": [{"index": 0, "util_percent": 4.9, "processes": []}]}, [], 5.0) == []


def test_idle_window_from_sample_sequence(tmp_path: Path) -> None:
    log = ActivityLog(str(tmp_path))
    facts = {"boot_id": "b", "boot_time": 0.0}
    idle_gpu = {"gpus": [{"index": 0, "util_percent": 1.0, "processes": []}]}
    busy_gpu = {"gpus": [{"index": 0, "util_percent": 90.0, "processes": []}]}
    seq = [(100.0, idle_gpu), (200.0, idle_gpu), (300.0, busy_gpu), (400.0, idle_gpu), (1000.0, idle_gpu)]
    out = [idle_status(s, [], log, facts, 5.0, False, now=t) for t, s in seq]
    # the clock starts at the first sample (time before it is unknown); one busy sample resets it
    assert [o["idle_seconds"] for o in out] == [0.0, 100.0, 0.0, 100.0, 700.0]
    assert out[2]["reasons"] == ["GPU 0 at 90%"]
    # the last busy time survives an agent restart
    assert ActivityLog(str(tmp_path)).last_busy == 300.0


def test_time_nobody_observed_never_counts_as_idle(tmp_path: Path) -> None:
    facts = {"boot_id": "b", "boot_time": 0.0}
    quiet = {"gpus": []}
    first = ActivityLog(str(tmp_path))
    for t in (100.0, 130.0, 160.0):  # an agent watches the host idle, then goes away
        idle_status(quiet, [], first, facts, 5.0, False, now=t)
    soon = idle_status(quiet, [], ActivityLog(str(tmp_path)), facts, 5.0, False, now=200.0)
    assert soon["idle_seconds"] == 100.0  # a new observer right after: the stretch goes on
    later = ActivityLog(str(tmp_path))  # ... but hours later nobody knows what happened meanwhile
    out = idle_status(quiet, [], later, facts, 5.0, False, now=200.0 + 3600.0)
    assert out["idle_seconds"] == 0.0
    assert idle_status(quiet, [], later, facts, 5.0, False, now=200.0 + 3700.0)["idle_seconds"] == 100.0


def test_job_end_and_reboot_bound_the_idle_stretch(tmp_path: Path) -> None:
    log = ActivityLog(str(tmp_path))
    quiet = {"gpus": []}
    idle_status(quiet, [], log, {"boot_id": "b", "boot_time": 0.0}, 5.0, False, now=100.0)  # first sight
    jobs = [{"id": "1", "state": "succeeded", "ended_at": 500.0}]
    out = idle_status(quiet, jobs, log, {"boot_id": "b", "boot_time": 0.0}, 5.0, False, now=800.0)
    assert out["idle_seconds"] == 300.0  # since the job ended, not since the first sample
    out = idle_status(quiet, [], log, {"boot_id": "b2", "boot_time": 790.0}, 5.0, False, now=800.0)
    assert out["idle_seconds"] == 0.0  # a reboot: nothing known about the new boot yet


def test_cost_info_combines_price_ledger_and_idle(tmp_path: Path) -> None:
    config = cfg.Config(path=None, hosts={"a100": host(price_per_hour=2.0, idle_minutes=10)})
    led = cost.Ledger(tmp_path / "l.json")
    sample = M.MetricsSample(
        seq=1, t=0, host=M.HostStats(), gpus=(), activity={"reasons": [], "idle_seconds": 900.0}
    )
    snap = M.HostSnapshot(
        name="a100", state=M.CONNECTED, facts={"boot_id": "b", "boot_time": 0.0}, metrics=sample
    )
    info = cost.cost_info(snap, config.hosts["a100"], config, led, now=2 * H)
    assert info.price_per_hour == 2.0 and info.accrued == pytest.approx(4.0)
    assert info.idle and info.idle_seconds == 900.0 and info.idle_cost == pytest.approx(0.5)
    busy = M.MetricsSample(seq=2, t=0, host=M.HostStats(), gpus=(), activity={"reasons": ["job 1 running"]})
    info = cost.cost_info(
        M.HostSnapshot(name="a100", state=M.CONNECTED, metrics=busy), config.hosts["a100"], config, led
    )
    assert not info.idle and info.reasons == ("job 1 running",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[hosts.a]\nprice_per_hour = -2\n", "hosts.a.price_per_hour: must not be negative"),
        ('[hosts.a]\nprice_per_hour = "2.49"\n', "hosts.a.price_per_hour: must be a number"),
        ('currency = "dollars"\n', "currency: 'dollars' is not an ISO 4217 code"),
        ('[prices]\n"H100" = "cheap"\n', "prices.H100: must be a non-negative number"),
        ("[budget]\ndaily = -1\n", "budget.daily: must not be negative"),
        ("[hosts.a]\nrelease = 5\n", "hosts.a.release: must be a command"),
        ("[hosts.a]\nautostop_minutes = 30\nprovider = \"none\"\n", "hosts.a.autostop_minutes: needs release_remote"),
        ('[hosts.a]\nrelease_at = "tomorrow"\n', "hosts.a.release_at: must be a TOML date-time"),
    ],
)
def test_bad_money_config(text: str, message: str) -> None:
    with pytest.raises(cfg.ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        cfg.parse(text, Path("c.toml"))


def test_release_idle_on_budget_exceeded_picks_only_idle_releasable_hosts() -> None:
    hosts = {
        "idle": host(release=("true",)),
        "busy": host(release=("true",)),
        "norelease": host(),
        "gone": host(release=("true",)),
    }
    hosts = {k: cfg.HostConfig(name=k, release=v.release) for k, v in hosts.items()}
    config = cfg.Config(path=None, hosts=hosts, budget=cfg.Budget(daily=10.0, on_exceed="release-idle"))
    job = M.Job(host="busy", id="1", name="x", state=M.JOB_RUNNING, command=("x",))

    def snap(name: str, idle: bool, released: bool = False, jobs: tuple = ()) -> M.HostSnapshot:
        return M.HostSnapshot(name=name, jobs=jobs, cost=M.CostInfo(today=4.0, idle=idle, released=released))

    snaps = [snap("idle", True), snap("busy", False, jobs=(job,)), snap("norelease", True), snap("gone", True, True)]
    alerts = spend.fleet_spend(snaps, config).alerts
    assert [(a.period, a.level, a.spent) for a in alerts] == [("daily", "exceeded", 16.0)]
    assert spend.idle_release_candidates(snaps, config, alerts) == ["idle"]
    warn_only = cfg.Config(path=None, hosts=hosts, budget=cfg.Budget(daily=10.0))
    assert spend.idle_release_candidates(snaps, warn_only, alerts) == []


def test_fleet_spend_keeps_currencies_apart_and_budgets_count_their_own() -> None:
    def snap(name: str, currency: str, per_hour: float, today: float, state: str = M.CONNECTED) -> M.HostSnapshot:
        c = M.CostInfo(currency=currency, price_per_hour=per_hour, accrued=10 * today, today=today, month=5 * today)
        return M.HostSnapshot(name=name, state=state, cost=c)

    snaps = [snap("a", "USD", 2.0, 6.0), snap("b", "EUR", 3.0, 50.0), snap("c", "USD", 1.0, 3.0, M.ERROR)]
    config = cfg.Config(path=None, hosts={}, budget=cfg.Budget(daily=10.0))
    fleet = spend.fleet_spend(snaps, config)
    assert fleet.single is None  # mixed: no total over both
    assert [s.to_json() for s in fleet.by_currency] == [
        {"currency": "USD", "accrued": 90.0, "today": 9.0, "month": 45.0, "burn_per_hour": 2.0, "burning": 1},
        {"currency": "EUR", "accrued": 500.0, "today": 50.0, "month": 250.0, "burn_per_hour": 3.0, "burning": 1},
    ]
    [alert] = fleet.alerts  # the 50 EUR never count against a USD budget
    assert (alert.level, alert.spent, alert.currency) == ("warn", 9.0, "USD")
    eur = cfg.Config(path=None, hosts={}, currency="EUR", budget=cfg.Budget(daily=10.0))
    assert [(a.level, a.spent, a.currency) for a in spend.fleet_spend(snaps, eur).alerts] == [("exceeded", 50.0, "EUR")]
    assert spend.fleet_spend([], config).single == spend.Spend("USD")

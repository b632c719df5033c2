"""The wire schema (remote_agent/protocol.py) is what both GPU samplers produce, field for field and type for
type, on readings recorded on real GPUs, and what the real agent answers to every op; the client keeps every
GPU field of it."""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, wait_for

from gputui.core.session import model as M
from remote_agent import protocol as P
from remote_agent.metrics import sampler as metrics
from remote_agent.metrics.sampler import MetricsSampler

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
sys.path.insert(0, str(FIXTURES))
from fake_nvidia_smi import sections  # noqa: E402
from nvml_double import NvmlDouble  # noqa: E402
from test_metrics_smi import H100, RTX4080, NoNvml, fake_smi  # noqa: E402

A100_X8 = FIXTURES / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt"


def conforms(value: Any, tp: Any) -> bool:
    """``value`` (parsed JSON) is of type ``tp`` as the schema writes types: TypedDicts with exactly their keys."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if origin is typing.Union:
        return any(conforms(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(v, args[1]) for v in value.values())
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp)
        return (
            isinstance(value, dict)
            and tp.__required_keys__ <= value.keys() <= hints.keys()
            and all(conforms(v, hints[k]) for k, v in value.items())
        )
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is type(None):
        return value is None
    return isinstance(value, tp)


def _nvml(tmp_path: Path, recording: str) -> MetricsSampler:
    return MetricsSampler(str(tmp_path), nvidia_smi=str(tmp_path / "unused"), nvml=NvmlDouble(recording))


def _smi(tmp_path: Path, capture: Path, state: str) -> MetricsSampler:
    return MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, capture, state), nvml=NoNvml())


SAMPLERS = {
    "nvml a100 x8": lambda tmp: _nvml(tmp, A100_X8.read_text()),
    "nvml h100 load": lambda tmp: _nvml(tmp, sections(H100.read_text())["load :: query (-q)"]),
    "smi h100 load": lambda tmp: _smi(tmp, H100, "load"),
    "smi h100 idle": lambda tmp: _smi(tmp, H100, "idle"),
    "smi rtx4080 idle": lambda tmp: _smi(tmp, RTX4080, "idle"),
}


@pytest.fixture(autouse=True)
def no_local_proc_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "process_name", lambda pid: None)


@pytest.mark.parametrize("source", SAMPLERS)
def test_samplers_produce_exactly_the_schema(tmp_path: Path, source: str) -> None:
    sampler = SAMPLERS[source](tmp_path)
    try:
        sample = sampler.sample({11345: "job-7"}.get)
        facts = sampler.facts()
    finally:
        sampler.close()
    assert sample["gpu_source"] == source.split()[0].replace("smi", "nvidia-smi") and sample["gpus"]
    for gpu in sample["gpus"]:
        assert set(gpu) == set(P.GPU_FIELDS), sorted(set(gpu) ^ set(P.GPU_FIELDS))
        assert conforms(gpu, P.Gpu), gpu
    assert conforms(dict(sample, seq=1, activity={"reasons": [], "idle_seconds": 0.0}), P.MetricsSample)
    assert set(facts) == set(P.GpuFacts.__annotations__) | {"gpu_source", "gpu_error"}
    assert conforms({k: facts[k] for k in P.GpuFacts.__annotations__}, P.GpuFacts), facts


def test_schema_checker_refuses_extra_missing_and_mistyped_fields() -> None:
    gpu = dict.fromkeys(P.GPU_FIELDS, None) | {"index": 0, "processes": [], "faults": [], "state": "ok"}
    assert conforms(gpu, P.Gpu)
    assert not conforms(gpu | {"state": "broken"}, P.Gpu)
    assert not conforms(gpu | {"driver_version": "590"}, P.Gpu)
    assert not conforms({k: v for k, v in gpu.items() if k != "pstate"}, P.Gpu)
    assert not conforms(gpu | {"throttle_reasons": "gpu_idle"}, P.Gpu)
    assert not conforms(gpu | {"processes": [{"pid": 1, "mem_mib": 2}]}, P.Gpu)


def test_client_gpu_sample_has_every_schema_field_and_gives_them_back(tmp_path: Path) -> None:
    assert {f.name for f in dataclasses.fields(M.GpuSample)} == set(P.GPU_FIELDS)
    sampler = SAMPLERS["nvml h100 load"](tmp_path)
    try:
        wire = sampler.sample({11345: "job-7"}.get)["gpus"]
    finally:
        sampler.close()
    gpus = [M.GpuSample.from_wire(g) for g in wire]
    assert any(g.processes for g in gpus)
    assert gpus[0].throttle_reasons == () and gpus[0].pstate == "P0" and gpus[0].mem_clock_mhz == 2619
    assert gpus[0].persistence_mode is True and gpus[0].ecc_errors_uncorrected == 0
    shown = json.loads(json.dumps([M._gpu_json(g) for g in gpus]))  # as `gputui status --json` prints
    assert [g.pop("problems") for g in shown] == [[]] * len(gpus) and shown == wire  # plus what is wrong: nothing


def test_job_states_and_doctor_statuses_are_the_schema_literals() -> None:
    assert set(typing.get_args(P.JobState)) == {P.JOB_QUEUED, P.JOB_RUNNING} | P.JOB_ENDED_STATES
    assert typing.get_args(P.DoctorStatus) == P.DOCTOR_STATUSES


def test_the_real_agent_answers_every_op_and_event_in_the_schema(agent: AgentProc, tmp_path: Path) -> None:
    answered: set[str] = set()

    def result(op: str, tp: Any, **args: Any) -> Any:
        assert tp is P.OPS[op].result  # the type the op table gives it
        reply = agent.call(op, timeout=120, **args)
        assert reply["ok"], reply
        assert conforms(reply["result"], tp), (op, reply["result"])
        answered.add(op)
        return reply["result"]

    def event(name: str, tp: Any, **match: Any) -> None:
        data = agent.wait_event(name, **match)["data"]
        assert conforms(data, tp), (name, data)

    assert conforms(agent.hello["data"], P.Hello), agent.hello
    result(P.OP_PING, P.PingResult)
    code = "import time; print('step 1/2 loss=0.5', flush=True); time.sleep(300)"
    job = result(
        P.OP_JOBS_START, P.JobRecord, argv=[sys.executable, "-c", code], name="schema", price_per_hour=1.5
    )
    event(P.EV_JOB, P.JobRecord, id=job["id"])
    wait_for(lambda: agent.call(P.OP_JOBS_GET, job=job["id"])["result"]["log_size"] > 0, what="job output")
    result(P.OP_JOBS_GET, P.JobRecord, job=job["id"])
    result(P.OP_LOGS_READ, P.ReadResult, job=job["id"], offset=0)
    result(P.OP_LOGS_READ, P.ReadResult, job=job["id"], tail_lines=1)
    result(P.OP_LOGS_TIMES, P.TimesResult, job=job["id"], start=0, end=100)
    result(P.OP_LOGS_TAILS, P.TailsResult, jobs=[job["id"], "999"], max_bytes=1000)
    result(P.OP_LOGS_SERIES, P.SeriesResult, job=job["id"])
    result(P.OP_LOGS_FOLLOW, P.FollowResult, job=job["id"], offset=0)
    event(P.EV_LOG, P.LogData, job=job["id"])
    result(P.OP_METRICS_SAMPLE, P.MetricsSample, idle_util_percent=5.0, count_sessions=True)
    result(P.OP_METRICS_SUBSCRIBE, P.SubscribeResult, interval=0.2)
    event(P.EV_METRICS, P.MetricsSample)
    result(P.OP_METRICS_SUBSCRIBE, P.SubscribeResult, interval=None)
    result(P.OP_JOBS_KILL, P.JobRecord, job=job["id"], grace_s=5)
    event(P.EV_LOG_END, P.LogEndData, job=job["id"])
    assert agent.call(P.OP_LOGS_UNFOLLOW, job=job["id"])["result"] is None
    result(P.OP_JOBS_LIST, P.ListResult, after=0, limit=10)
    blocker = result(P.OP_JOBS_START, P.JobRecord, argv=["sleep", "300"])  # the queued jobs wait for it
    queued = [result(P.OP_JOBS_START, P.JobRecord, argv=["true"], queue={"gpus": "none", "after": [blocker["id"]]})
              for _ in range(2)]
    event(P.EV_JOB, P.JobRecord, id=queued[0]["id"])
    result(P.OP_QUEUE_LIST, P.QueueListResult)
    result(P.OP_QUEUE_MOVE, P.QueueListResult, job=queued[1]["id"], to=1)
    result(P.OP_JOBS_LIST, P.ListResult, after=0, limit=10)  # with queue marks
    result(P.OP_JOBS_KILL, P.JobRecord, job=queued[0]["id"])
    result(P.OP_EXEC, P.ExecResult, argv=["true"], timeout_s=10)
    result(P.OP_WATCHDOG_CONFIGURE, P.WatchdogConfigureResult, config={})
    result(P.OP_NOTIFY_TEST, P.NotifyTestResult, notify={"command": ["true"]})
    result(P.OP_RELEASE_CHECK, P.ReleaseCheckResult, release_remote=["true"], provider="auto")
    result(P.OP_RELEASE_PROVIDER, P.ReleaseProviderResult, provider="none")  # none here: released False
    result(P.OP_RELEASE_INSTANCE, P.ReleaseInstanceResult, provider="none")  # none here: found False
    result(P.OP_DOCTOR, P.DoctorResult, python=sys.executable, timeout_s=60)
    result(P.OP_JOBS_GROUP_CHECK, P.GroupCheckResult, argv=["true"], ports=True, peers=["127.0.0.2"])
    result(P.OP_SLURM_INFO, P.ClusterInfo)  # with no Slurm here: its error (tests/test_slurm.py has a cluster)
    # Every op of the table with a typed result was answered here (files.* in tests/test_carry_*.py, and
    # logs.unfollow above; shutdown ends the agent).
    typed = {op for op, spec in P.OPS.items() if spec.result is not None and typing.get_origin(spec.result) is not dict}
    assert typed - answered == set()

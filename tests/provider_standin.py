"""A local stand-in for the RunPod, vast.ai and Lambda APIs (test-only): 127.0.0.1, a free port, a thread.

It answers the documented endpoints with bodies shaped as the providers' API references show them:

- RunPod REST v1 (base ``/runpod``): ``GET /pods/{id}``, ``POST /pods/{id}/stop``, ``POST /pods/{id}/start``,
  ``DELETE /pods/{id}``
- vast.ai v0 (base ``/vastai``): ``GET``/``PUT``/``DELETE /instances/{id}/`` (``PUT`` stops or starts)
- Lambda v1 (base ``/lambda``): ``GET /instances``, ``POST /instance-operations/terminate``

A release or a start takes effect after ``settle_reads`` further reads of the instance (as a real one takes a
while), so a confirm must poll. A start gives the next port of ``start_ports`` (as RunPod gives new port
mappings) and ``start_gpus`` GPUs where set (RunPod may bring a pod back with 0); ``refuse_start`` makes the
provider refuse it with those words. ``fault`` makes the next ``fault_count`` requests (None: all) fail one way: ``401``,
``404``, ``429``, ``500``, ``slow`` (no answer until the test ends), ``drip`` (a valid start, then a byte every
50 ms for ever), ``redirect`` (302 to another host), ``wrongtype`` (a price and a status of the wrong JSON type), ``huge``
(2 MiB without a Content-Length), ``hugelength`` (a Content-Length of 2 MiB), ``notjson`` (an HTML page that echoes the Authorization header), ``echo`` (a 500 whose JSON echoes the
Authorization header as sent and URL-quoted). Every request is
recorded (method, path, the Authorization header, the JSON body) in ``requests``.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RUNPOD_KEY, VAST_KEY, LAMBDA_KEY = (
    "rpa_STANDINKEY0123456789",
    "vastkey-0123456789abcdef",
    "secret_lambda_0123456789",
)


def runpod_pod(
    pod_id: str, status: str = "RUNNING", volume: str | None = None, ip: str = "213.173.109.39", port: int = 13007
) -> dict[str, Any]:
    """A Pod as docs.runpod.io/api-reference/pods/GET/pods/podId shows it (costPerHr a string there)."""
    return {
        "adjustedCostPerHr": 0.69, "aiApiId": None, "consumerUserId": "user_2PyTJrLzeuwfZilRZ7JhCQDuSqo",
        "containerDiskInGb": 50, "costPerHr": "0.74", "cpuFlavorId": "cpu3c", "desiredStatus": status,
        "env": {"ENV_VAR": "value"}, "gpu": {"id": "NVIDIA A40", "count": 1, "displayName": "A40"},
        "id": pod_id, "image": "runpod/pytorch:2.1.0-py3.10-cuda11.8.0-devel-ubuntu22.04",
        "interruptible": False, "lastStartedAt": "2024-07-12T19:14:40.144Z",
        "lastStatusChange": "Rented by User: Fri Jul 12 2024 15:14:40 GMT-0400", "locked": False,
        "networkVolumeId": volume, "ports": ["8888/http", "22/tcp"], "volumeInGb": 20,
        "publicIp": ip, "portMappings": {"22": port, "8888": 13008},
    }


def vast_instance(instance_id: int, actual: str | None = "running", cur: str = "running") -> dict[str, Any]:
    """An instance as docs.vast.ai/api-reference/instances/show-instance shows it (trimmed)."""
    return {
        "id": instance_id, "actual_status": actual, "intended_status": cur, "cur_state": cur,
        "next_state": cur, "label": None, "image_uuid": "pytorch/pytorch", "ssh_host": "ssh2281.vast.ai",
        "ssh_port": 10882, "machine_id": 178, "start_date": 1761008618.225083, "gpu_name": "RTX A5000",
        "num_gpus": 1, "dph_total": 0.3312, "public_ipaddr": "63.135.50.11", "is_bid": False,
        "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40123"}]}, "disk_space": 32.0, "storage_cost": 0.15,
    }


def lambda_instance(instance_id: str, ip: str, status: str = "active", cents: int = 129) -> dict[str, Any]:
    """An instance as Lambda's v1 reference shows it (GET /instances)."""
    return {
        "id": instance_id, "name": "trainer", "ip": ip, "private_ip": "10.19.60.24", "status": status,
        "ssh_key_names": ["laptop"], "file_system_names": [], "hostname": f"{ip.replace('.', '-')}.cloud.lambdalabs.com",
        "region": {"name": "us-east-1", "description": "Virginia, USA"},
        "instance_type": {
            "name": "gpu_1x_a100_sxm4", "description": "1x A100 (40 GB SXM4)", "gpu_description": "A100 (40 GB SXM4)",
            "price_cents_per_hour": cents,
            "specs": {"vcpus": 30, "memory_gib": 200, "storage_gib": 512, "gpus": 1},
        },
    }


@dataclass
class Recorded:
    method: str
    path: str
    auth: str
    body: Any


@dataclass
class StandIn:
    """The stand-in's state; the server thread reads and changes it under ``lock``."""

    url: str = ""
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    vast: dict[str, dict[str, Any]] = field(default_factory=dict)
    lambdas: dict[str, dict[str, Any]] = field(default_factory=dict)
    settle_reads: int = 1  # reads of an instance after a release before its new state shows
    fault: str | None = None
    fault_count: int | None = None
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ended: threading.Event = field(default_factory=threading.Event)
    pending: dict[str, tuple[int, Any]] = field(default_factory=dict)  # instance: (reads left, new state)
    on_release: Callable[[], None] | None = None  # run on an accepted stop/terminate, before its answer
    on_start: Callable[[], None] | None = None  # run on an accepted start, before its answer
    start_ports: list[int] = field(default_factory=list)  # the SSH port each start gives, in turn
    start_gpus: int | None = None  # the GPUs a start gives (None: as before)
    refuse_start: str | None = None  # the provider's words refusing a start

    def base(self, provider: str) -> str:
        return f"{self.url}/{provider}"

    def take_fault(self) -> str | None:
        with self.lock:
            if self.fault is None or self.fault_count == 0:
                return None
            if self.fault_count is not None:
                self.fault_count -= 1
            return self.fault

    def methods(self, prefix: str = "") -> list[str]:
        """``METHOD path`` of each request so far whose path starts with ``prefix``."""
        return [f"{r.method} {r.path}" for r in self.requests if r.path.startswith(prefix)]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _fault(self, fault: str) -> bool:
        """Answer with ``fault``; False for ``wrongtype`` (the route answers, badly)."""
        st = self.server.state
        if fault in ("401", "404", "429", "500"):
            body = {"error": "standin " + fault}
            self._send(int(fault), body, {"Retry-After": "7"} if fault == "429" else None)
        elif fault == "slow":
            st.ended.wait(120)
        elif fault == "drip":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"id": ')
            while not st.ended.wait(0.05):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return True
        elif fault == "redirect":
            self.send_response(302)
            self.send_header("Location", "https://evil.example/steal\x1b[31m")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif fault in ("huge", "hugelength"):
            self.send_response(200)
            if fault == "hugelength":
                self.send_header("Content-Length", str(2 * 1024 * 1024))
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                self.wfile.write(b'{"pad": "' + b"x" * (2 * 1024 * 1024) + b'"}')
            except OSError:
                pass
            self.close_connection = True
        elif fault == "echo":
            auth = self.headers.get("Authorization", "")
            self._send(500, {"error": "cannot use " + auth, "request": "/pods?auth=" + urllib.parse.quote(auth)})
        elif fault == "notjson":
            echo = self.headers.get("Authorization", "").encode()  # a broken proxy echoing the request
            data = b"<html>Bad gateway: " + echo + b"</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            return False
        return True

    def _route(self, method: str) -> None:
        st = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("latin-1")
        auth = self.headers.get("Authorization", "")
        with st.lock:
            st.requests.append(Recorded(method, self.path, auth, body))
        fault = st.take_fault()
        if fault and self._fault(fault):
            return
        wrong = fault == "wrongtype"
        provider, _, rest = self.path.lstrip("/").partition("/")
        key = {"runpod": RUNPOD_KEY, "vastai": VAST_KEY, "lambda": LAMBDA_KEY}.get(provider)
        if key is None:
            self._send(404, {"error": "no such API"})
        elif auth != f"Bearer {key}":
            self._send(401, {"error": "Unauthorized"})
        elif provider == "runpod":
            self._runpod(method, "/" + rest, wrong)
        elif provider == "vastai":
            self._vast(method, "/" + rest, body, wrong)
        else:
            self._lambda(method, "/" + rest, body, wrong)

    def _settle(self, name: str, table: dict[str, dict[str, Any]]) -> None:
        """A pending release becomes visible after ``settle_reads`` reads."""
        st = self.server.state
        with st.lock:
            if name not in st.pending:
                return
            left, change = st.pending[name]
            if left > 0:
                st.pending[name] = (left - 1, change)
                return
            del st.pending[name]
            if change is None:
                table.pop(name.split(":", 1)[1], None)
            else:
                table[name.split(":", 1)[1]].update(change)

    def _released(self) -> None:
        if self.server.state.on_release is not None:
            self.server.state.on_release()

    def _runpod(self, method: str, path: str, wrong: bool) -> None:
        st = self.server.state
        parts = path.strip("/").split("/")
        if len(parts) < 2 or parts[0] != "pods":
            return self._send(404, {"error": "not found"})
        pod_id = parts[1]
        if method == "GET" and len(parts) == 2:
            self._settle("runpod:" + pod_id, st.pods)
            pod = st.pods.get(pod_id)
            if pod is None:
                return self._send(404, {"error": "pod not found"})
            if wrong:
                pod = {**pod, "costPerHr": ["0.74"], "desiredStatus": 5}
            return self._send(200, pod)
        if pod_id not in st.pods:
            return self._send(404, {"error": "pod not found"})
        if method == "POST" and parts[2:] == ["stop"]:
            st.pending["runpod:" + pod_id] = (st.settle_reads, {"desiredStatus": "EXITED"})
            self._released()
            return self._send(200, None)
        if method == "DELETE" and len(parts) == 2:
            st.pending["runpod:" + pod_id] = (st.settle_reads, None)
            return self._send(204, None)
        if method == "POST" and parts[2:] == ["start"]:
            if st.refuse_start:
                return self._send(400, {"error": st.refuse_start})
            change: dict[str, Any] = {"desiredStatus": "RUNNING"}
            if st.start_ports:
                change["portMappings"] = {"22": st.start_ports.pop(0)}
            if st.start_gpus is not None:
                change["gpu"] = {**st.pods[pod_id]["gpu"], "count": st.start_gpus}
            st.pending["runpod:" + pod_id] = (st.settle_reads, change)
            if st.on_start is not None:
                st.on_start()
            return self._send(200, None)
        self._send(404, {"error": "not found"})

    def _vast(self, method: str, path: str, body: Any, wrong: bool) -> None:
        st = self.server.state
        parts = path.strip("/").split("/")
        if len(parts) != 2 or parts[0] != "instances" or not path.endswith("/"):
            return self._send(404, {"error": "not found"})
        iid = parts[1]
        if method == "GET":
            self._settle("vastai:" + iid, st.vast)
            inst = st.vast.get(iid)
            if inst is None:
                return self._send(404, {"success": False, "error": "no_such_instance"})
            if wrong:
                inst = {**inst, "dph_total": "lots", "actual_status": {"x": 1}}
            return self._send(200, {"instances": inst})
        if iid not in st.vast:
            return self._send(404, {"success": False, "error": "no_such_instance"})
        if method == "PUT" and body == {"state": "running"}:
            if st.refuse_start:
                return self._send(200, {"success": False, "msg": st.refuse_start})
            started: dict[str, Any] = {"actual_status": "running", "cur_state": "running"}
            if st.start_ports:
                started["ports"] = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(st.start_ports.pop(0))}]}
            st.pending["vastai:" + iid] = (st.settle_reads, started)
            return self._send(200, {"success": True})
        if method == "PUT":
            if body != {"state": "stopped"}:
                return self._send(400, {"success": False, "msg": "bad state"})
            st.pending["vastai:" + iid] = (
                st.settle_reads,
                {"actual_status": "stopped", "cur_state": "stopped"},
            )
            self._released()
            return self._send(200, {"success": True})
        if method == "DELETE":
            st.pending["vastai:" + iid] = (st.settle_reads, None)
            return self._send(200, {"success": True, "msg": "Instance destroyed successfully"})
        self._send(404, {"error": "not found"})

    def _lambda(self, method: str, path: str, body: Any, wrong: bool) -> None:
        st = self.server.state
        if method == "GET" and path == "/instances":
            for iid in list(st.lambdas):
                self._settle("lambda:" + iid, st.lambdas)
            data = list(st.lambdas.values())
            if wrong:
                data = [{**d, "status": 5, "instance_type": {"price_cents_per_hour": "129"}} for d in data]
            return self._send(200, {"data": data})
        if method == "POST" and path == "/instance-operations/terminate":
            ids = body.get("instance_ids") if isinstance(body, dict) else None
            if not isinstance(ids, list) or not all(i in st.lambdas for i in ids):
                return self._send(
                    404, {"error": {"code": "global/object-does-not-exist", "message": "no such instance"}}
                )
            done = []
            for iid in ids:
                st.lambdas[iid]["status"] = "terminating"
                st.pending["lambda:" + iid] = (st.settle_reads, {"status": "terminated"})
                done.append(st.lambdas[iid])
            return self._send(200, {"data": {"terminated_instances": done}})
        self._send(404, {"error": "not found"})

    def do_GET(self) -> None:  # noqa: N802
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._route("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: StandIn


def start() -> tuple[StandIn, _Server]:
    """A running stand-in on 127.0.0.1 and a free port; stop it with ``stop``."""
    server = _Server(("127.0.0.1", 0), _Handler)
    state = StandIn(url=f"http://127.0.0.1:{server.server_address[1]}")
    server.state = state
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return state, server


def stop(state: StandIn, server: _Server) -> None:
    state.ended.set()  # frees the slow and dripping answers
    server.shutdown()
    server.server_close()

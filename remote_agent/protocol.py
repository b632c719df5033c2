"""The wire protocol between the gputui client and the remote agent (one source of truth for both sides).

Frames are single lines of JSON (UTF-8, ``\\n`` terminated) over the agent's stdin/stdout:

* request  ``{"id": 7, "op": "jobs.start", "args": {...}}``   (client -> agent)
* reply    ``{"id": 7, "ok": true, "result": ...}`` or ``{"id": 7, "ok": false, "error": {"code", "message"}}``
* event    ``{"event": "metrics", "data": {...}}``             (agent -> client, unsolicited)

The first frame the agent sends is the ``hello`` event. Raw log bytes travel base64-encoded so that
non-UTF-8 output survives byte for byte. This module must stay stdlib-only and Python 3.8 compatible.
"""

import base64
import json
import math
from typing import Any, Dict, Optional

PROTOCOL_VERSION = 1

#: Longest frame either side accepts; longer input is rejected as malformed, never buffered unbounded.
MAX_FRAME_BYTES = 4 * 1024 * 1024
#: Largest raw log chunk the agent puts in one frame (base64 grows it by 4/3).
LOG_CHUNK_BYTES = 256 * 1024
#: Bounds of numbers in requests (the CLI refuses others as usage errors, the agent as bad arguments).
MAX_KILL_GRACE_S = 3600.0
MAX_SNOOZE_MIN = 7 * 24 * 60
#: Most jobs, and most bytes of JSON, one jobs.list page carries; the client asks for pages until none remain.
LIST_PAGE_JOBS = 2000
LIST_PAGE_BYTES = 1024 * 1024
#: Largest raw file chunk in one files.read/files.write frame.
FILE_CHUNK_BYTES = 512 * 1024

# Operations the agent answers.
OP_PING = "ping"
OP_HOST_INFO = "host.info"
OP_JOBS_START = "jobs.start"
OP_JOBS_LIST = "jobs.list"  # args: after (job id), limit; result: {"jobs": [listing records], "more": bool}
OP_JOBS_GET = "jobs.get"  # one job's full record (listings cut long commands)
OP_JOBS_KILL = "jobs.kill"
OP_LOGS_READ = "logs.read"
OP_LOGS_FOLLOW = "logs.follow"
OP_LOGS_UNFOLLOW = "logs.unfollow"
OP_LOGS_TIMES = "logs.times"  # when the log's bytes were written (remote_agent/logclock.py)
OP_METRICS_SUBSCRIBE = "metrics.subscribe"
OP_METRICS_SAMPLE = "metrics.sample"
OP_SHUTDOWN = "shutdown"
OP_EXEC = "host.exec"  # run an argv on the host with a timeout (release_remote)
OP_WATCHDOG_CONFIGURE = "watchdog.configure"
OP_WATCHDOG_SNOOZE = "watchdog.snooze"
OP_WATCHDOG_CANCEL = "watchdog.cancel"
OP_DOCTOR = "doctor"  # host checks, each ok/warn/fail/skip with a fix (remote_agent/doctor.py)
# Files carried to and from the host (remote_agent/files.py).
OP_FILES_LIST = "files.list"  # args: base, patterns; result: {base, files: [{path, rel, size, mtime, mode}]}
OP_FILES_READ = "files.read"  # args: path, offset, max_bytes; result: {offset, size, mtime, b64}
OP_FILES_HASH = "files.hash"  # args: path; result: {sha256, size, mtime}
OP_FILES_WRITE = "files.write"  # args: target, rel, offset, b64, truncate, commit {sha256, mode, mtime_ns}
OP_FILES_MANIFEST = "files.manifest"  # args: target, after; result: {target, entries, more}
OP_FILES_DELETE = "files.delete"  # args: target, rels (only files sync wrote and nobody changed since)

# Events the agent pushes.
EV_HELLO = "hello"
EV_HEARTBEAT = "heartbeat"
EV_METRICS = "metrics"
EV_LOG = "log"  # data: {"job", "offset", "b64"}
EV_LOG_END = "log_end"  # data: {"job", "offset", "job_state"}; the follow is over
EV_JOB = "job"  # data: a job record whose state changed

# Error codes in replies.
E_MALFORMED = "malformed"
E_UNKNOWN_OP = "unknown_op"
E_BAD_ARGS = "bad_args"
E_NOT_FOUND = "not_found"
E_FAILED = "failed"


class ProtocolError(ValueError):
    """A frame that does not follow the protocol."""


class Raw(str):
    """A reply result that is JSON text already (ASCII): ``encode`` splices it in as it is."""


def encode(frame: Dict[str, Any]) -> bytes:
    """Serialise one frame to a newline-terminated line."""
    if isinstance(frame.get("result"), Raw):
        head = json.dumps({k: v for k, v in frame.items() if k != "result"}, separators=(",", ":"))
        return (head[:-1] + ',"result":' + frame["result"] + "}\n").encode("ascii")
    data = frame.get("data")
    if frame.get("event") == EV_LOG and isinstance(data, dict) and len(data.get("b64") or "") > 4096:
        # Fast path for big log chunks: base64 needs no JSON escaping, so splice it in unscanned.
        rest = {k: v for k, v in data.items() if k != "b64"}
        head = json.dumps({"event": EV_LOG, "data": rest}, separators=(",", ":"), ensure_ascii=True)
        return (head[:-2] + ',"b64":"' + data["b64"] + '"}}\n').encode("ascii")
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def decode(line: bytes, finite: bool = False) -> Dict[str, Any]:
    """Parse one line into a frame dict, raising ProtocolError with a readable reason.

    ``finite`` (the agent reading requests) refuses NaN, Infinity and numbers beyond a float's range.
    """
    if len(line) > MAX_FRAME_BYTES:
        raise ProtocolError("frame of %d bytes exceeds the %d byte limit" % (len(line), MAX_FRAME_BYTES))
    hooks = {"parse_constant": _no_constant, "parse_float": _finite_float} if finite else {}
    try:
        frame = json.loads(line.decode("utf-8"), **hooks)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("not a JSON line: %s" % exc) from None
    except RecursionError:
        raise ProtocolError("JSON nested too deeply") from None
    if not isinstance(frame, dict):
        raise ProtocolError("frame is %s, not an object" % type(frame).__name__)
    return frame


def _no_constant(name: str) -> float:
    raise ValueError("%s is not a number JSON allows" % name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number %s is out of range" % text[:40])
    return value


def number_arg(args: Dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    """``args[key]`` as a finite number within [lo, hi] (``default`` when absent); ValueError otherwise."""
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("%s must be a number, not %s" % (key, type(value).__name__))
    try:
        number = float(value)
    except ValueError:
        raise ValueError("%s must be a number, not %r" % (key, str(value)[:40])) from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise ValueError("%s must be between %g and %g, not %s" % (key, lo, hi, str(value)[:40]))
    return number


def int_arg(args: Dict[str, Any], key: str, default: int, lo: int = 0, hi: int = 2**62) -> int:
    """``args[key]`` as a whole number within [lo, hi] (``default`` when absent); ValueError otherwise."""
    number = number_arg(args, key, default, lo, hi)
    if number != int(number):
        raise ValueError("%s must be a whole number, not %s" % (key, str(args.get(key))[:40]))
    return int(number)


def request(req_id: int, op: str, args: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"id": req_id, "op": op, "args": args or {}}


def reply_ok(req_id: Any, result: Any = None) -> Dict[str, Any]:
    return {"id": req_id, "ok": True, "result": result}


def reply_error(req_id: Any, code: str, message: str) -> Dict[str, Any]:
    return {"id": req_id, "ok": False, "error": {"code": code, "message": message}}


def event(name: str, data: Any = None) -> Dict[str, Any]:
    return {"event": name, "data": data}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)

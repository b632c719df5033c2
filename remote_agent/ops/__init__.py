"""The agent's operations, one module per family, each op a named function ``(agent, args) -> result``.

``HANDLERS`` maps every op of ``protocol.OPS`` to its function: ``host`` (ping, host.exec, shutdown, doctor,
slurm.info), ``jobs`` (jobs.*, queue.*), ``logs`` (logs.*), ``metrics`` (metrics.*), ``watchdog``
(watchdog.*, notify.test), ``release`` (release.*), ``files`` (files.*). The server decodes and checks a request's args against
``protocol.OPS`` before its function runs.
"""

from typing import Any, Callable, Dict

from . import files, host, jobs, logs, metrics, release, watchdog

Handler = Callable[[Any, Dict[str, Any]], Any]

HANDLERS: Dict[str, Handler] = {
    **host.HANDLERS, **jobs.HANDLERS, **logs.HANDLERS, **metrics.HANDLERS, **watchdog.HANDLERS, **release.HANDLERS,
    **files.HANDLERS,
}

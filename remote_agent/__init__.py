"""gputui remote agent: runs on a GPU host, stdlib only (+ optional pynvml), Python 3.8+."""

import os


def build_id() -> str:
    """This build's id: the hash in the name of the folder or zipapp holding the package
    (``gputui-agent-<hash>``, ``gputui-agent-<hash>.pyz``), or ``dev`` from source."""
    name = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    name = name[: -len(".pyz")] if name.endswith(".pyz") else name
    return name[len("gputui-agent-") :] if name.startswith("gputui-agent-") else "dev"

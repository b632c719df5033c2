"""A Slurm login node's cluster view (op ``slurm.info``: one sinfo) in words, for the app and the CLI."""

from __future__ import annotations

import collections

from remote_agent import protocol as P


def cluster_text(info: P.ClusterInfo, most: int = 6) -> str:
    """A Slurm login node in one line: partitions (default starred) with nodes and GPUs in use, nodes by state."""
    if info.get("error"):
        return f"slurm: {info['error']}"
    parts = [
        f"{p['name']}{'*' if p['default'] else ''} {p['available']} {p['nodes']} nodes"
        + (f" GPUs {p['gpus_used']}/{p['gpus']}" if p["gpus"] else "")
        for p in info["partitions"][:most]
    ]
    total = max(len(info["partitions"]), info.get("partitions_total") or 0)  # (an older agent: no total)
    if total > most:
        parts.append(f"+{total - most} more")
    states = collections.Counter(n["state"] for n in info["nodes"])
    nodes = ", ".join(f"{count} {state}" for state, count in states.most_common())
    shown = "" if info["nodes_total"] <= len(info["nodes"]) else f" (of the first {len(info['nodes'])})"
    return f"slurm: {' · '.join(parts)} · nodes {nodes or 'none'}{shown}"

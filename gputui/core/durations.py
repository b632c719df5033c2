"""The one way gputui writes a duration, in the app and on the command line."""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h03m``, ``3d04h``; ``-`` when unknown (or not finite)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"

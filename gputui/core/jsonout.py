"""JSON for people's pipelines: strict JSON only (NaN and Infinity are not JSON; they become null)."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (from a host, a ledger, a bug) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, indent: int | None = 2) -> str:
    return json.dumps(finite(obj), indent=indent, allow_nan=False)

"""Plain-text formatting shared by the widgets: durations, money, sizes, bars and sparklines."""

from __future__ import annotations

from collections.abc import Sequence

from gputui.core.durations import duration as duration  # the one duration format (app and CLI)
from gputui.core.session.model import job_name as job_name  # what a job is called where it is shown

BLOCKS = " ▏▎▍▌▋▊▉█"
SPARKS = "▁▂▃▄▅▆▇█"


def money(value: float | None, currency: str = "USD", per_hour: bool = False) -> str:
    if value is None:
        return "-"
    unit = "/h" if per_hour else ""
    if currency == "USD":
        return f"${value:,.2f}{unit}"
    return f"{value:,.2f} {currency}{unit}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def gib(mib: float | None) -> str:
    """A MiB figure as GiB with one decimal below 100 GiB."""
    if mib is None:
        return "-"
    g = mib / 1024
    return f"{g:.1f}" if g < 100 else f"{g:.0f}"


def mem_pair(used_mib: float | None, total_mib: float | None) -> str:
    if used_mib is None and total_mib is None:
        return "-"
    return f"{gib(used_mib)}/{gib(total_mib)} GiB"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return max(0.0, min(1.0, a / b))


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar of ``width`` cells in eighths; blanks when unknown."""
    if fraction is None or width <= 0:
        return " " * max(width, 0)
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (BLOCKS[part] if part else "")
    return text.ljust(width)


def spark(values: Sequence[float | None], width: int, lo: float = 0.0, hi: float | None = None) -> str:
    """The last ``width`` buckets of ``values`` (oldest first) as block characters.

    ``values`` longer than ``width`` are averaged into ``width`` buckets, so a long history fits.
    """
    vals = [v for v in values if v is not None]
    if not vals or width <= 0:
        return ""
    if len(vals) > width:
        step = len(vals) / width
        vals = [
            sum(chunk) / len(chunk)
            for i in range(width)
            if (chunk := vals[int(i * step) : max(int((i + 1) * step), int(i * step) + 1)])
        ]
    top = hi if hi is not None else max(vals)
    span = (top - lo) or 1.0
    last = len(SPARKS) - 1
    return "".join(SPARKS[max(0, min(last, int((v - lo) / span * last + 0.5)))] for v in vals)


def short_gpu_name(name: str | None) -> str:
    if not name:
        return "GPU"
    for prefix in ("NVIDIA ", "GeForce ", "Tesla "):
        name = name.replace(prefix, "")
    return name.strip()


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"



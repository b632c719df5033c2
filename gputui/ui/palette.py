"""Colours the widgets paint with, resolved from the current theme's variables."""

from __future__ import annotations

from dataclasses import dataclass

from textual.theme import Theme

from . import themes

TEMP_WARM_C, TEMP_HOT_C = 75.0, 85.0
MEM_WARM, MEM_HOT = 0.80, 0.95
UTIL_BUSY, UTIL_IDLE = 60.0, 15.0


@dataclass(frozen=True)
class Palette:
    """The colours the app draws with, taken from the theme."""

    ok: str = "#6CB37E"
    warm: str = "#E0A84E"
    hot: str = "#D9675F"
    empty: str = "#2E343D"
    spark: str = "#7FA7CF"
    muted: str = "#8A939E"
    marker: str = "#C792EA"
    match: str = "#E0A84E"
    primary: str = "#5B9BD5"

    @classmethod
    def from_theme(cls, theme: Theme) -> Palette:
        v = theme.variables
        base = cls()
        return cls(
            ok=v.get(themes.LEVEL_OK) or theme.success or base.ok,
            warm=v.get(themes.LEVEL_WARM) or theme.warning or base.warm,
            hot=v.get(themes.LEVEL_HOT) or theme.error or base.hot,
            empty=v.get(themes.BAR_EMPTY) or theme.panel or base.empty,
            spark=v.get(themes.SPARK) or theme.primary or base.spark,
            muted=v.get(themes.MUTED) or base.muted,
            marker=v.get(themes.MARKER) or theme.accent or base.marker,
            match=v.get(themes.MATCH) or theme.warning or base.match,
            primary=theme.primary or base.primary,
        )

    def temp(self, c: float | None) -> str:
        if c is None:
            return self.muted
        return self.hot if c >= TEMP_HOT_C else self.warm if c >= TEMP_WARM_C else self.ok

    def mem(self, fraction: float | None) -> str:
        if fraction is None:
            return self.muted
        return self.hot if fraction >= MEM_HOT else self.warm if fraction >= MEM_WARM else self.ok

    def util(self, percent: float | None) -> str:
        """Busy GPUs are good news (money well spent); idle ones are the warning."""
        if percent is None:
            return self.muted
        return self.ok if percent >= UTIL_BUSY else self.warm if percent >= UTIL_IDLE else self.muted

"""Themes as data: TOML files loaded into Textual themes, and the user's choice kept across runs.

Built-in theme files live in the checkout's top-level ``themes/``, installed as ``gputui/themes/`` (see
pyproject.toml); a user may add more in ``$XDG_CONFIG_HOME/gputui/themes/``. The choice is stored in
``$XDG_STATE_HOME/gputui/ui.json``.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from textual.theme import Theme

from gputui.core import paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_THEME = "gputui-dark"


def _builtin_dir() -> Path:
    """``gputui/themes`` where a wheel is installed; the top-level ``themes/`` in a checkout or editable install."""
    installed = Path(__file__).parents[1] / "themes"
    return installed if installed.is_dir() else Path(__file__).parents[2] / "themes"


BUILTIN_DIR = _builtin_dir()

_THEME_KEYS = {f.name for f in fields(Theme)}
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # shown in the palette and used in CSS class names: never markup

# Colours the widgets read from the theme (with the theme's own colours as fallbacks).
LEVEL_OK, LEVEL_WARM, LEVEL_HOT = "gputui-level-ok", "gputui-level-warm", "gputui-level-hot"
BAR_EMPTY, SPARK, MUTED, MARKER, MATCH = (
    "gputui-bar-empty",
    "gputui-spark",
    "gputui-muted",
    "gputui-marker",
    "gputui-match",
)


def user_theme_dir() -> Path:
    return paths.config_dir() / "themes"


def state_path() -> Path:
    return paths.state_dir() / "ui.json"


def load_theme(path: Path) -> Theme:
    """One theme file; raises ValueError naming the file and the problem."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    unknown = sorted(set(data) - _THEME_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown theme keys: {', '.join(unknown)}")
    if "primary" not in data:
        raise ValueError(f"{path}: a theme needs at least 'primary'")
    data.setdefault("name", path.stem)
    if not isinstance(data["name"], str) or not _NAME.fullmatch(data["name"]):
        raise ValueError(f"{path}: a theme's name is letters, digits, '-' and '_' (got {data['name']!r})")
    data["variables"] = {str(k): str(v) for k, v in (data.get("variables") or {}).items()}
    try:
        return Theme(**data)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def load_themes(*dirs: Path) -> tuple[list[Theme], list[str]]:
    """Every ``*.toml`` theme in ``dirs`` (later ones override by name), and the errors met."""
    themes: dict[str, Theme] = {}
    errors: list[str] = []
    for folder in dirs or (BUILTIN_DIR, user_theme_dir()):
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            try:
                theme = load_theme(path)
            except ValueError as exc:
                errors.append(str(exc))
            else:
                themes[theme.name] = theme
    return list(themes.values()), errors


@dataclass
class UiState:
    """What the app remembers between runs."""

    theme: str | None = None
    config_theme: str | None = None  # the config's theme when the choice was made

    @classmethod
    def load(cls, path: Path) -> UiState:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls()
        if not isinstance(data, dict):
            return cls()
        return cls(theme=data.get("theme"), config_theme=data.get("config_theme"))

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename); a failure to save is not worth a crash."""
        try:
            data = {"theme": self.theme, "config_theme": self.config_theme}
            paths.write_atomic(path, json.dumps(data).encode())
        except OSError:
            pass


def pick_theme(config_theme: str | None, state: UiState, available: set[str]) -> str:
    """The saved choice while the config still says what it said then; else the config; else the default."""
    if state.theme in available and state.config_theme == config_theme:
        return state.theme  # type: ignore[return-value]
    if config_theme in available:
        return config_theme  # type: ignore[return-value]
    return DEFAULT_THEME

"""Every key of the app in one table: the footer and palette bindings (the app's, the log pane's, the confirm and
release dialogs') and the help screen's rows, which are built from the same bindings (``help_sections``)."""

from __future__ import annotations

from collections.abc import Sequence

from textual.binding import Binding

Section = tuple[str, Sequence[tuple[str, str]]]  # a help section: its title and (key, what it does) rows

APP_KEYS = [
    Binding("n", "new_job", "New job", tooltip="Start a job on the selected host"),
    Binding("plus", "add_host", "Add host", key_display="+", show=False, tooltip="Add an SSH host: connect, trust, check, save"),
    Binding("k", "kill_job", "Kill", tooltip="Kill the selected job (asks first)"),
    Binding(
        "a", "attach", "Attach", tooltip="Attach this terminal to the job's tmux session; detach to return"
    ),
    Binding("r", "release", "Release", tooltip="Release the selected host (asks first)"),
    Binding("S", "start_instance", "Start instance", show=False,
            tooltip="Start the selected host's stopped RunPod pod or vast.ai instance (asks first)"),
    Binding(
        "o", "forward_url", "Open URL", show=False,
        tooltip="Forward the web URL the job printed (TensorBoard, Jupyter) to 127.0.0.1 here; token kept",
    ),
    Binding(
        "z", "snooze_autostop", "Snooze autostop", tooltip="Postpone the host's idle autostop by an hour"
    ),
    Binding(
        "x", "cancel_autostop", "Cancel autostop", show=False, tooltip="No autostop until the host reboots"
    ),
    Binding("d", "doctor", "Doctor", show=False, tooltip="Check the host: driver, CUDA, torch, tmux, disk"),
    Binding("h", "history", "History", show=False, tooltip="Finished runs with their records and cost"),
    Binding("l", "toggle_log", "Log", tooltip="Full-screen log on/off"),
    Binding("c", "chart", "Chart", show=False, tooltip="The selected job's metrics as a chart (live while it runs)"),
    Binding("C", "compare_runs", "Compare runs", show=False, tooltip="Mark 2-8 finished runs and compare them"),
    Binding("g", "gpu_chart", "GPU chart", show=False, tooltip="The selected host's GPU history as a chart"),
    Binding("slash", "search", "Search", tooltip="Search the log"),
    Binding("t", "change_theme", "Theme", tooltip="Pick a theme (remembered)"),
    Binding("question_mark", "help", "Help", key_display="?", tooltip="Every key"),
    Binding("q", "quit", "Quit"),
    Binding("1", "focus_pane('hosts')", "Hosts", show=False),
    Binding("2", "focus_pane('jobs')", "Jobs", show=False),
    Binding("3", "focus_pane('log-view')", "Log view", show=False),
    Binding("4", "focus_pane('procs')", "GPU processes", show=False),
]
# z and x with no autostop armed: the armed bindings above are off then, this says why (not in help/palette)
APP_BINDINGS = [*APP_KEYS, Binding("z,x", "autostop_unarmed", show=False)]

LOG_KEYS = [
    Binding("f", "follow", "Follow", tooltip="Jump to the end and keep following new output"),
    Binding("slash", "search", "Search", tooltip="Search the log (case-insensitive)"),
    Binding("n", "next_match", "Next match"),
    Binding("N", "previous_match", "Prev match"),
    Binding("escape", "clear_search", "Clear search", show=False),
]

CONFIRM_KEYS = [  # a kill or a release, confirmed
    Binding("y", "answer(True)", "Yes"),
    Binding("n,escape", "answer(False)", "No"),
]
RELEASE_KEYS = [  # the release dialog when artifacts would be lost
    Binding("p", "answer('pull')", "Pull first"),
    # not "y": the plain release confirmation's yes must never mean "without them" here (muscle memory)
    Binding("d", "answer('release')", "Release without"),
    Binding("n,escape", "answer(None)", "Cancel"),
]

# keys Textual's widgets and the dialogs' fields handle (no binding of ours): the help lists them as they read
NAV_KEYS: list[tuple[str, str]] = [
    ("↑ ↓ / click", "move in a table (hosts: pick the host; jobs: pick the job whose log shows)"),
    ("enter", "hosts: go to its jobs; jobs: full-screen log"),
    ("pgup pgdn home end", "page / jump in tables and the log (scrolling up stops following)"),
    ("← →", "scroll long log lines sideways"),
    ("tab shift+tab", "next / previous pane"),
    ("ctrl+p", "command palette: every action, themes"),
    ("ctrl+q", "quit"),
]
DIALOG_KEYS: list[tuple[str, str]] = [
    ("enter", "new job: start it (from any field)"),
    ("tab", "next field"),
    ("y / n", "confirm / cancel a kill or release"),
    ("esc", "cancel, close"),
]


def key_label(binding: Binding) -> str:
    """How a binding's key reads in the help and the palette (``/``, ``?``, ``esc``; ``a / b`` for several)."""
    names = {"slash": "/", "question_mark": "?", "escape": "esc", "enter": "enter"}
    keys = [names.get(k, k) for k in binding.key.split(",")]
    return binding.key_display or " / ".join(keys)


def help_rows(bindings: Sequence[Binding]) -> list[tuple[str, str]]:
    """The help's rows for ``bindings``: the key, then its tooltip (else its footer text)."""
    return [(key_label(b), b.tooltip or b.description) for b in bindings]


def help_sections() -> list[Section]:
    """The help screen's table, grouped by where the keys work."""
    return [
        ("Everywhere", help_rows(APP_KEYS)),
        ("Log pane", help_rows(LOG_KEYS)),
        ("Moving around", NAV_KEYS),
        ("Dialogs", DIALOG_KEYS),
    ]

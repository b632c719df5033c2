"""The session service: one long-lived process per user and config file that keeps the fleet's connections warm,
so that ``gputui status`` (``watch -n 1 gputui status``, a tmux status line, a shell prompt) answers from a
warm connection: no asyncio or asyncssh import in the command, no SSH handshake, no agent start.

- ``address``: where a service listens (a 0600 Unix socket in a 0700 dir of the user's) and which build it is;
- ``client``: the command's side, light (stdlib only): ask the service, start one when there is none;
- ``server``: the process itself (``python -m gputui.service.server CONFIG``).

A command that cannot reach a service (none yet, another build, a broken config, anything unexpected) goes on
directly as before and says nothing: the service only ever makes an answer faster. ``GPUTUI_DIRECT=1`` or
``--direct`` bypasses it; ``gputui service [status|stop]`` shows or stops it."""

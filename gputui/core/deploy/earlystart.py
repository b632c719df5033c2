"""Imported first by ``gputui/cli.py``: when this process is the ``gputui`` command, the local agent of the
command's hosts starts now, while the CLI's own imports load (``agentproc.start_early``)."""

import os
import sys

from gputui.core.deploy import agentproc

if os.path.basename(sys.argv[0]) == "gputui" or sys.argv[0].endswith(os.path.join("gputui", "__main__.py")):
    agentproc.start_early(sys.argv[1:])

"""gputui remote agent: runs on a GPU host, stdlib only (+ optional pynvml), Python 3.8+."""

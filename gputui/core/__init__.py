"""Headless core of gputui: transports, sessions, state. Never imports textual."""

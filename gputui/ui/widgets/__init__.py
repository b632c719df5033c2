"""Widgets of the app: they render snapshots handed to them and never do I/O."""

"""Files between here and a host: sync (up), pull (down), what was pulled, artifacts to bring back before a release, and port forwards."""

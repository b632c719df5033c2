"""Byte streams to an agent: the Link (the client's end of the agent protocol), the local subprocess transport, the SSH transport over one asyncssh connection, and known_hosts files."""

"""Files carried to and from the host over the agent's channel, by role: ``pull`` reads (listings, chunks, hashes,
raw streams), ``sync`` writes (part files, the manifest, deletions, the raw upload stream)."""

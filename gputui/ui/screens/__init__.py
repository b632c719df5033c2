"""Modal screens: new job, confirmations, help."""

"""The user's config file: where it is, what it may hold, and errors that name file, line and field."""

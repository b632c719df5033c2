"""The user's config file: where it is, what it may hold (provider settings too), and errors that name file, line
and field."""

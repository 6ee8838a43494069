"""One router per resource: search and health."""

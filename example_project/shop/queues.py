"""Message handlers for the queue worker live here: one function per topic this app consumes."""

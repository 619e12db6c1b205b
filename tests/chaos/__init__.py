"""The chaos run: real workers and publishers under injected faults, and a report of what
was lost, duplicated or reordered (``make chaos``; see docs/reliability.md).

This package is also the Django app whose ``queues.py`` holds the chaos handlers.
"""

"""Recurring schedules: cron ticks, definitions, and firing them (docs/scheduling.md)."""

"""An installed app whose queues.py cannot be imported (see tests/broken_settings.py)."""

"""Vendor differences live here, so table modules can stay portable."""

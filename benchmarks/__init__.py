"""The django-sqlqueue benchmark suite: ``python benchmarks/run.py`` (or ``make bench``)."""

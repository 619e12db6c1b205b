"""Database clusters on this machine, for the failover runs and for trying topologies out.

- :mod:`clusters.pg`: a PostgreSQL primary and a synchronous streaming replica
  (``make cluster-pg``);
- :mod:`clusters.galera`: three MariaDB Galera nodes behind HAProxy, one writer node
  (``make cluster-galera``).

Each starts from Debian's packages on ports and data directories of its own (never the
servers on 3306 and 5432), prints its connection URLs, and stops with ``--stop``.
``python -m clusters pg run -- CMD`` runs a command with a fresh cluster up and stops it
after. Only the standard library is used: the scripts run before any virtualenv exists.
docs/operating.md has the settings each topology needs; docs/reliability.md the failover
runs built on them.
"""

"""The queue's tables on a plain DB-API connection, for processes without Django settings.

Spark executors (and a Spark driver) talk to the database directly: no settings module, no
JDBC driver. Each module owns one table's SQL, as the model managers do for Django code;
:mod:`.connection` opens the connection from a ``DATABASE_URL``-style URL and holds the
vendor differences.
"""

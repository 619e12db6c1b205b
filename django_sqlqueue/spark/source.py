"""The ``sqlqueue`` data source: Spark's entry point, choosing a reader or a writer."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .options import Options, SparkOptionError, parse
from .reading import SqlQueueReader
from .tables import ddl


class SqlQueueDataSource(DataSource):
    """``spark.read.format("sqlqueue")``, ``df.write.format("sqlqueue")`` and their
    streaming forms; see docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "sqlqueue"

    def _options(self) -> Options:
        return parse(self.options)

    def schema(self) -> str:
        return ddl(self._options().table)

    def reader(self, schema: StructType) -> SqlQueueReader:
        options = self._options()
        if options.table == "messages" and not options.topics:
            raise SparkOptionError(
                'option topic is required to read messages: .option("topic", "orders") or a '
                "comma-separated list")
        return SqlQueueReader(options)

    def writer(self, schema: StructType, overwrite: bool):  # type: ignore[no-untyped-def]
        from .writing import SqlQueueWriter, check_overwrite, plan_write

        check_overwrite(overwrite)
        return SqlQueueWriter(plan_write(self._options(), schema))

    def streamWriter(self, schema: StructType, overwrite: bool):  # type: ignore[no-untyped-def]  # noqa: N802 - Spark's name
        from .writing import SqlQueueStreamWriter, check_overwrite, plan_write

        check_overwrite(overwrite)
        return SqlQueueStreamWriter(plan_write(self._options(), schema))

    def streamReader(self, schema: StructType):  # type: ignore[no-untyped-def]  # noqa: N802 - Spark's name
        from .streaming import SqlQueueStreamReader

        options = self._options()
        if options.table != "messages" or not options.topics:
            raise SparkOptionError(
                'a stream reads messages of named topics: .option("topic", "orders"), no table option')
        return SqlQueueStreamReader(options)

"""The consuming worker, as small pieces: leasing, the poll cycle, dispatch, GC, shutdown."""

"""How long each test file takes, per backend: recorded by a suite run, kept in
``tests/durations.json``, and read by ``tests/shard.py`` to deal the files into parts.

A suite run writes its files' wall times (``SQLQUEUE_TEST_TIMES``, set by tests/matrix.py
for every suite); ``make test-durations`` folds the last ``make test``'s times into
``tests/durations.json``::

    python tests/file_times.py record BACKEND TIMES.json...

The times are those of the CI matrix (every suite at once on two CPUs), which is the load
the parts are balanced for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
BACKENDS = ("sqlite", "mysql", "postgres")


def write(path: str, seconds: dict[str, float]) -> None:
    """One suite run's times, file by file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({f: round(s, 1) for f, s in sorted(seconds.items())},
                                     indent=1) + "\n")


def recorded(backend: str) -> dict[str, float]:
    """The kept times of a backend's files ({} when none are kept)."""
    try:
        return json.loads(DURATIONS.read_text()).get(backend, {})
    except FileNotFoundError:
        return {}


def record(backend: str, runs: list[Path]) -> dict[str, float]:
    """Fold the runs' times (the parts of one backend's suite) into the kept ones: a file
    a run timed gets its new time, the others keep theirs; deleted files are dropped."""
    if backend not in BACKENDS:
        raise SystemExit(f"file_times: unknown backend {backend!r}: expected one of {BACKENDS}")
    kept = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    times = dict(kept.get(backend, {}))
    for run in runs:
        times.update(json.loads(run.read_text()))
    tests = DURATIONS.parent
    kept[backend] = {f: s for f, s in sorted(times.items())
                     if (tests.parent / f).exists()}
    DURATIONS.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    return kept[backend]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "record":
        print("usage: python tests/file_times.py record BACKEND TIMES.json...", file=sys.stderr)
        return 2
    runs = [Path(a) for a in argv[2:] if Path(a).exists()]
    if not runs:
        print(f"file_times: no recorded times for {argv[1]} (run make test first)", file=sys.stderr)
        return 1
    times = record(argv[1], runs)
    print(f"file_times: {argv[1]}: {len(times)} files, {sum(times.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Print the test files of one part of a backend's suite, so ``make test`` can run the
suite as several pytest processes at once (each against a database of its own).

    python tests/shard.py PARTS PART [BACKEND]     # PART counts from 1

The files are dealt out longest first, each to the part with the least time so far, so
every file is in exactly one part and the parts take about as long. A file's time is the
one ``tests/durations.json`` keeps for the backend (see tests/file_times.py); a file
without one (new, or no times kept) is estimated from its size at the backend's average
seconds per byte. Stable for a given tree and durations file.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python tests/shard.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import file_times  # noqa: E402

TESTS = Path(__file__).resolve().parent


def estimated_seconds(backend: str) -> dict[str, float]:
    """Every test file's expected time on the backend."""
    files = {f"tests/{p.name}": p.stat().st_size for p in TESTS.glob("test_*.py")}
    kept = {f: s for f, s in file_times.recorded(backend).items() if f in files}
    known_bytes = sum(files[f] for f in kept)
    per_byte = sum(kept.values()) / known_bytes if known_bytes else 1.0
    return {f: kept.get(f, size * per_byte) for f, size in files.items()}


def parts(count: int, backend: str = "") -> list[list[str]]:
    seconds = estimated_seconds(backend)
    dealt: list[list[str]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for name in sorted(seconds, key=lambda f: (-seconds[f], f)):
        least = loads.index(min(loads))
        dealt[least].append(name)
        loads[least] += seconds[name]
    return [sorted(files) for files in dealt]


def main(argv: list[str]) -> int:
    if (len(argv) not in (2, 3) or not all(a.isdigit() for a in argv[:2])
            or not 1 <= int(argv[1]) <= int(argv[0])):
        print("usage: python tests/shard.py PARTS PART [BACKEND] (1 <= PART <= PARTS)",
              file=sys.stderr)
        return 2
    backend = argv[2] if len(argv) == 3 else ""
    print(" ".join(parts(int(argv[0]), backend)[int(argv[1]) - 1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

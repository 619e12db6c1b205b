"""Run the code samples of the tutorial and the how-to guides, as a reader would.

A fenced block right after an HTML comment ``<!-- sample -->`` is run; every other block is
only shown. The tutorial's pages (``docs/tutorial/``, in the order of mkdocs.yml's nav) run
one after another in a new directory, from ``django-admin startproject`` on; each how-to
guide (``docs/how-to/``) then runs in a copy of the project the tutorial built. What a
marked block does depends on its kind:

- ``console``: its lines run in bash (``set -e``), in the directory the previous block
  left, with this interpreter's ``bin`` first on ``PATH`` (so ``python`` and
  ``django-admin`` are this virtualenv's). A ``$ `` prompt is dropped.
- ``python`` with ``title="PATH"``: the file PATH is written (``<!-- sample: append -->``:
  appended to).
- ``python`` without a title: run with ``python manage.py shell -c``.

``<!-- sample: expect TEXT -->`` also requires TEXT in what the block printed. The first
failing block stops the run, with its page, line and output: exit status 1.

    python docs/run_samples.py [--work DIR] [--keep]

The project uses SQLite (``startproject``'s default) and nothing else: no server, no
network. Measured on this machine (2 CPUs, 2026-11-29, 26 samples): 20 s quiet, 30 s beside
other work (load average 2.3); each ``manage.py`` run is most of it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
MARKER = re.compile(r"^<!--\s*sample(?::\s*(append|expect\s+(.+?)))?\s*-->\s*$")
FENCE = re.compile(r"^(`{3,})(\w+)?(.*)$")
TITLE = re.compile(r'title="([^"]+)"')
TIMEOUT = 120  # seconds one block may take: a worker left running would hang the run


@dataclass
class Sample:
    page: str
    line: int
    kind: str  # console or python
    title: str | None
    append: bool
    expect: str | None
    code: str


class SampleFailed(Exception):
    pass


def samples(page: Path) -> list[Sample]:
    """The marked blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    found: list[Sample] = []
    index = 0
    while index < len(lines):
        marker = MARKER.match(lines[index].strip())
        index += 1
        if marker is None:
            continue
        while index < len(lines) and not lines[index].strip():
            index += 1
        fence = FENCE.match(lines[index].strip()) if index < len(lines) else None
        if fence is None:
            raise SystemExit(f"{page.name}:{index}: <!-- sample --> is not followed by a fenced block")
        start, ticks = index + 1, fence.group(1)
        end = start
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        title = TITLE.search(fence.group(3) or "")
        found.append(Sample(
            page=page.relative_to(DOCS).as_posix(), line=start, kind=fence.group(2) or "",
            title=title.group(1) if title else None, append=marker.group(1) == "append",
            expect=marker.group(2), code="\n".join(lines[start:end]) + "\n"))
        index = end + 1
    return found


def nav_pages(section: str) -> list[Path]:
    """The pages under ``docs/<section>/`` in the order mkdocs.yml's nav lists them."""
    text = (ROOT / "mkdocs.yml").read_text()
    listed = re.findall(rf"^\s*-\s*[^:]+:\s*({re.escape(section)}/[\w/-]+\.md)\s*$", text, re.M)
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / section).glob("*.md"))
    missing = sorted(set(on_disk) - set(listed))
    if missing:
        raise SystemExit(f"mkdocs.yml's nav does not list {', '.join(missing)}")
    return [DOCS / path for path in listed]


class Runner:
    def __init__(self, directory: Path) -> None:
        self.cwd = directory
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        for name in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"):
            self.env.pop(name, None)

    def run(self, sample: Sample) -> str:
        if sample.kind == "python" and sample.title:
            path = self.cwd / sample.title
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a" if sample.append else "w") as out:
                out.write(("\n" if sample.append else "") + sample.code)
            return ""
        if sample.kind == "console":
            state = self.cwd / ".sample-cwd"
            script = "\n".join(line[2:] if line.startswith("$ ") else line
                               for line in sample.code.splitlines())
            output = self._call(["bash", "-c", f"set -euo pipefail\n{script}\npwd > '{state}'"])
            self.cwd = Path(state.read_text().strip())
            state.unlink()
            return output
        if sample.kind == "python":
            return self._call([sys.executable, "manage.py", "shell", "-c", sample.code])
        raise SampleFailed(f"cannot run a {sample.kind or 'plain'} block")

    def _call(self, command: list[str]) -> str:
        try:
            # The documentation's own samples, run on purpose in a throwaway directory.
            done = subprocess.run(command, cwd=self.cwd, env=self.env, capture_output=True,  # noqa: S603
                                  text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise SampleFailed(f"still running after {TIMEOUT} s") from exc
        output = done.stdout + done.stderr
        if done.returncode:
            raise SampleFailed(f"exit status {done.returncode}\n{output}")
        return output


def run_page(runner: Runner, page: Path) -> int:
    count = 0
    for sample in samples(page):
        started = time.monotonic()
        try:
            output = runner.run(sample)
            if sample.expect and sample.expect not in output:
                raise SampleFailed(f"expected {sample.expect!r} in the output:\n{output}")
        except SampleFailed as exc:
            print(f"docs/{sample.page}:{sample.line}: the sample failed: {exc}", file=sys.stderr)
            raise SystemExit(1) from exc
        count += 1
        print(f"  docs/{sample.page}:{sample.line} ok ({time.monotonic() - started:.1f} s)")
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None,
                        help="Directory for the throwaway projects (emptied first; default: a "
                             "temporary directory).")
    parser.add_argument("--keep", action="store_true", help="Keep the projects afterwards.")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="sqlqueue-samples-"))
    shutil.rmtree(work, ignore_errors=True)
    (work / "tutorial").mkdir(parents=True)
    started, count = time.monotonic(), 0
    try:
        runner = Runner(work / "tutorial")
        for page in nav_pages("tutorial"):
            count += run_page(runner, page)
        project = runner.cwd  # where the tutorial left off: the project's directory
        for page in nav_pages("how-to"):
            copy = work / page.stem / project.name
            shutil.copytree(project, copy)
            count += run_page(Runner(copy), page)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"docs samples: {count} passed, 0 failed in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()

"""Build the sdist and the wheel, install the wheel into a fresh virtualenv and run the
example project against it: what a user installing from an index gets.

    python tests/wheel/check.py [--work DIR]

Steps: ``python -m build`` on a copy of the files a clone would have (the wheel is built
from the sdist, so a file the sdist leaves out is missing from the wheel too); every file
of the package in the source tree must be in both archives, and the wheel must declare the
test helpers' pytest plugin (its ``pytest11`` entry point), and its METADATA the README,
the license and the project's addresses; a virtualenv without system site-packages gets the
wheel (not editable) and Django, and quickstart.md's first section is followed command by
command in a new ``django-admin startproject``; then, with django-environ added, from a copy
of the example
project outside the checkout, ``check``, ``migrate``, the admin's overview and dead-letters
pages with a logged-in superuser, and a message published, handled by ``runqueueworker
--burst`` and recorded by its handlers; last, the example's own tests (``manage.py test
shop``, written with the test helpers).
Exits non-zero with the reason on the first failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "django_sqlqueue"
PLUGIN = "django_sqlqueue.testing.pytest_plugin"  # the pytest11 entry point's module
SCRIPT = Path(__file__).resolve().with_name("in_venv.py")
# Files the source tree has that an installed package does not need.
SKIPPED_SUFFIXES = (".pyc",)


class Failed(Exception):
    pass


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
        quiet: bool = False) -> str:
    """Run a command, echo it, and fail with its output when it fails."""
    started = time.monotonic()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if not quiet:
        print(f"+ ({time.monotonic() - started:.1f}s)", " ".join(str(a) for a in args), flush=True)
    if done.returncode != 0:
        raise Failed(f"{' '.join(map(str, args))} exited {done.returncode}:\n"
                     f"{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return done.stdout


def package_files() -> list[str]:
    """The package's files in the source tree, relative to the root (what the app needs)."""
    files = []
    for path in sorted((ROOT / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(
                SKIPPED_SUFFIXES):
            files.append(path.relative_to(ROOT).as_posix())
    return files


def source_copy(target: Path) -> Path:
    """The files a fresh clone would have (tracked, or new and not ignored), copied to
    ``target``: a build in the checkout would reuse its egg-info, whose file list can hold
    files the package data no longer names."""
    shutil.rmtree(target, ignore_errors=True)
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                 cwd=ROOT, quiet=True)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a deleted, not yet committed file is still listed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def build(work: Path) -> tuple[Path, Path]:
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    source = source_copy(work / "source")
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], cwd=source)
    sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise Failed(f"expected one sdist and one wheel in {dist}, found {sdists + wheels}")
    return sdists[0], wheels[0]


def check_archives(sdist: Path, wheel: Path) -> None:
    wanted = package_files()
    with tarfile.open(sdist) as archive:
        # Members are "<name>-<version>/django_sqlqueue/...".
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    for where, names in (("sdist", in_sdist), ("wheel", in_wheel)):
        missing = [name for name in wanted if name not in names]
        if missing:
            raise Failed(f"the {where} lacks {len(missing)} file(s) of the package: "
                         + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
    check_entry_points(wheel)
    templates = [name for name in in_wheel if name.startswith(f"{PACKAGE}/templates/")]
    print(f"sqlqueue: both archives hold all {len(wanted)} package files "
          f"({len(templates)} templates)")


def check_entry_points(wheel: Path) -> None:
    """The wheel declares the test helpers' pytest plugin, so installing it is enough for
    pytest to find the fixtures."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(names[0]).decode() if names else ""
    lines = [line.replace(" ", "") for line in text.splitlines()]
    if "[pytest11]" not in lines or f"sqlqueue={PLUGIN}" not in lines:
        raise Failed(f"the wheel declares no pytest11 entry point 'sqlqueue = {PLUGIN}'; "
                     f"its entry_points.txt: {text!r}")


def check_metadata(wheel: Path) -> None:
    """What an index shows of the wheel: the README as its description, the license, the
    project's addresses; and no dependency that only an extra needs."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(names[0]).decode() if names else ""
        licenses = [n for n in archive.namelist() if "/licenses/" in n and n.endswith("LICENSE")]
    headers, _, body = text.partition("\n\n")
    fields: dict[str, list[str]] = {}
    for line in headers.splitlines():
        name, _, value = line.partition(": ")
        fields.setdefault(name, []).append(value)
    problems = []
    if fields.get("Description-Content-Type") != ["text/markdown"]:
        problems.append(f"Description-Content-Type {fields.get('Description-Content-Type')}")
    readme_title = (ROOT / "README.md").read_text().splitlines()[0]
    if not body.startswith(readme_title):
        problems.append(f"the long description does not start with {readme_title!r}")
    if fields.get("License-Expression") != ["BSD-3-Clause"] or not licenses:
        problems.append(f"License-Expression {fields.get('License-Expression')}, "
                        f"license files {licenses}")
    urls = dict(v.split(", ", 1) for v in fields.get("Project-URL", []))
    if not {"Source", "Documentation", "Issues"} <= urls.keys():
        problems.append(f"Project-URL {sorted(urls)}")
    unconditional = [r for r in fields.get("Requires-Dist", []) if "extra ==" not in r]
    if any(r.lower().startswith("django-environ") for r in unconditional):
        problems.append("django-environ is required without an extra")
    if problems:
        raise Failed("the wheel's METADATA: " + "; ".join(problems))
    print(f"sqlqueue: METADATA has the README, {fields['License-Expression'][0]}, "
          f"{len(urls)} project URLs; requires {', '.join(unconditional)}")


def quickstart_steps() -> list[tuple[str, str]]:
    """The blocks of quickstart.md's first section, in order: ("console", commands) or
    (path, Python source to write, or to add at the end when the path says so)."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    start = text.index("## Your first message, start to finish")
    section = text[start:text.index("\n## ", start + 1)]
    steps = []
    for language, block in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        if language == "console":
            steps.append(("console", block))
        else:
            first, _, rest = block.partition("\n")
            steps.append((first.removeprefix("# "), rest))
    return steps


def follow_the_quickstart(python: Path, work: Path) -> None:
    """quickstart.md's first section, command by command, in a new ``startproject``
    with only the wheel and Django installed (no database driver, no django-environ)."""
    venv_bin = python.parent
    where = work / "quickstart"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    env = clean_environment()
    env.update({"PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONDONTWRITEBYTECODE": "1"})
    cwd = where
    output = ""
    for kind, content in quickstart_steps():
        if kind != "console":
            path, _, how = kind.partition(": ")
            target = cwd / path
            if how == "add at the end":
                target.write_text(target.read_text() + "\n" + content)
            else:
                target.write_text(content)
            continue
        for command in filter(None, content.splitlines()):
            if command.startswith(("python -m venv", "pip install")):
                continue  # this virtualenv has the wheel, as pip install would give
            if command.startswith("cd "):
                cwd = cwd / command[3:].strip()
                continue
            output = run(["bash", "-c", command], cwd=cwd, env=env)
    if "hello, Ada" not in output:
        raise Failed(f"the quickstart's worker did not print 'hello, Ada':\n{output[-2000:]}")
    print("sqlqueue: quickstart.md's first message, in a new startproject: 'hello, Ada'")


def clean_environment() -> dict[str, str]:
    """This process's environment without what would let the checkout leak in."""
    return {key: value for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONHOME")}


def make_venv(venv: Path, wheel: Path) -> Path:
    """A virtualenv of its own (no system site-packages) with the wheel and this Django."""
    import django

    shutil.rmtree(venv, ignore_errors=True)
    # Without pip: this interpreter's pip installs into it (pip --python), with its cache.
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=ROOT)
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling Django's few thousand modules is most of an install.
    # Without PYTHONPATH: a checkout on it (its egg-info) would make pip find the package
    # installed already and skip the wheel.
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
         "--disable-pip-version-check", str(wheel), f"Django=={django.__version__}"], cwd=ROOT,
        env=clean_environment())
    return python


def add_example_requirements(python: Path) -> None:
    """The example project's settings read DATABASE_URL with django-environ."""
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
         "--disable-pip-version-check", "django-environ>=0.11"], cwd=ROOT,
        env=clean_environment())


def exercise(python: Path, venv: Path, work: Path) -> None:
    """Run the example project from a copy outside the checkout against the wheel."""
    project = work / "project"
    shutil.rmtree(project, ignore_errors=True)
    shutil.copytree(ROOT / "example_project", project / "example_project",
                    ignore=shutil.ignore_patterns("__pycache__", "*.sqlite3*"))
    cwd = project  # neither it nor the project copy holds django_sqlqueue
    env = clean_environment()
    env.update({
        "DATABASE_URL": f"sqlite:///{project / 'db.sqlite3'}",
        "ALLOWED_HOSTS": "testserver,localhost",
        "SQLQUEUE_WHEEL_VENV": str(venv),
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    manage = [str(python), str(project / "example_project" / "manage.py")]
    script = [str(python), str(SCRIPT), str(project / "example_project")]
    print(run([*script, "where"], cwd=cwd, env=env), end="")
    run([*manage, "check", "--fail-level", "WARNING"], cwd=cwd, env=env)
    run([*manage, "migrate", "--noinput"], cwd=cwd, env=env)
    print(run([*script, "admin"], cwd=cwd, env=env), end="")
    print(run([*script, "publish"], cwd=cwd, env=env), end="")
    run([*manage, "runqueueworker", "--burst", "--topic", "orders"], cwd=cwd, env=env)
    print(run([*script, "handled"], cwd=cwd, env=env), end="")
    # The example's own tests, written with django_sqlqueue.testing, on the installed wheel.
    run([*manage, "test", "shop", "--noinput"], cwd=cwd, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / ".test-data" / "wheel",
                        help="where the archives, the virtualenv and the project copy go")
    work = parser.parse_args().work.resolve()
    started = time.monotonic()
    try:
        sdist, wheel = build(work)
        check_archives(sdist, wheel)
        check_metadata(wheel)
        python = make_venv(work / "venv", wheel)
        follow_the_quickstart(python, work)
        add_example_requirements(python)
        exercise(python, work / "venv", work)
    except Failed as exc:
        print(f"sqlqueue: wheel check FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"sqlqueue: wheel check passed in {time.monotonic() - started:.1f}s ({wheel.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

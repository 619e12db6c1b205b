#!/usr/bin/env python
"""Run the example project: ``python example_project/manage.py demo`` from the repository root."""

import os
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROJECT_DIR.parent


def main() -> None:
    # The repository root makes ``django_sqlqueue`` importable without installing it; the
    # project directory makes ``example_project`` and ``shop`` importable from any cwd.
    for path in (str(REPO_ROOT), str(PROJECT_DIR)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()

"""WSGI entry point, e.g. ``gunicorn --chdir example_project example_project.wsgi``.

Unlike manage.py, this does not add the repository to ``sys.path``: install the package
first (``pip install -e .`` from the repository root).
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_wsgi_application()

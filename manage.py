#!/usr/bin/env python
"""Django's command-line utility for FabricPool."""
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A configuration mistake (missing SECRET_KEY, bad DATABASE_URL): one line, no traceback.
        sys.stderr.write(f"configuration error: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()

import sys

from django.core.management.base import BaseCommand, CommandError

from fabric.ibnetdiscover import TopologyError
from fabric.importer import import_file
from fabric.models import FabricNameError


class Command(BaseCommand):
    help = "Import an ibnetdiscover topology file (or - for standard input) as a diff against the fabric."

    def add_arguments(self, parser):
        parser.add_argument("file", help="topology file written by ibnetdiscover, or - for stdin")
        parser.add_argument("--fabric", default="default", help="fabric name (created if new; default: %(default)s)")

    def handle(self, *args, file, fabric, **options):
        source = sys.stdin.buffer if file == "-" else file
        try:
            result = import_file(source, fabric, source_name="stdin" if file == "-" else file)
        except FileNotFoundError:
            raise CommandError(f"{file}: no such file") from None
        except IsADirectoryError:
            raise CommandError(f"{file}: is a directory") from None
        except PermissionError:
            raise CommandError(f"{file}: permission denied") from None
        except FabricNameError as exc:
            raise CommandError(str(exc)) from None
        except TopologyError as exc:
            raise CommandError(f"{file}: {exc} (nothing was imported)") from None
        for warning in result.warnings:
            self.stderr.write(f"warning: {warning}")
        self.stdout.write(result.summary())
        if not result.first_import:
            for line in result.messages:
                self.stdout.write(f"  {line}")

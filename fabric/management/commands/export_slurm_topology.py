from django.core.management.base import BaseCommand

from fabric.management.commands.fabric_summary import resolve_fabric
from fabric.slurm import topology_block, topology_tree


class Command(BaseCommand):
    help = "Write Slurm's topology.conf for a fabric (tree or block format) to stdout or --output."

    def add_arguments(self, parser):
        parser.add_argument("--fabric", default=None, help="fabric name (default: the only fabric)")
        parser.add_argument("--format", choices=["tree", "block"], default="tree")
        parser.add_argument("--output", "-o", default=None, help="file to write (default: stdout)")

    def handle(self, *args, fabric, format, output, **options):
        obj = resolve_fabric(fabric)
        text = topology_tree(obj) if format == "tree" else topology_block(obj)
        if output:
            with open(output, "w") as fh:
                fh.write(text)
            self.stderr.write(f"wrote {output}")
        else:
            self.stdout.write(text, ending="")

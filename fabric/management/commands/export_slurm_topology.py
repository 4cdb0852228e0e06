from django.core.management.base import BaseCommand, CommandError

from fabric.management.commands.fabric_summary import resolve_fabric
from fabric.slurm import gres_conf, topology_block, topology_tree


def gpus_by_host(fabric) -> dict[str, list[tuple[int, str]]]:
    """The present GPUs of the fabric's hosts. The pool app knows them; fabric's own code
    reads no pool model, so this command (where the apps meet) imports it here."""
    from pool.models import Gpu

    gpus = {}
    rows = Gpu.objects.filter(host__fabric=fabric, present=True).values_list("host__name", "index", "model").order_by()
    for host, index, model in rows:
        gpus.setdefault(host, []).append((index, model))
    return gpus


class Command(BaseCommand):
    help = ("Write Slurm's topology.conf for a fabric (tree or block format) to stdout or --output, "
            "and with --gres-out also gres.conf for the GPUs of its hosts.")

    def add_arguments(self, parser):
        parser.add_argument("--fabric", default=None, help="fabric name (default: the only fabric)")
        parser.add_argument("--format", choices=["tree", "block"], default="tree")
        parser.add_argument("--output", "-o", default=None, help="file to write (default: stdout)")
        parser.add_argument("--gres-out", metavar="FILE", default=None,
                            help="also write gres.conf lines (Name=gpu Type=<chip> File=/dev/nvidia[...]) to FILE "
                                 "('-' for stdout, after the topology)")

    def handle(self, *args, fabric, format, output, gres_out, **options):
        obj = resolve_fabric(fabric)
        text = topology_tree(obj) if format == "tree" else topology_block(obj)
        gres = None
        if gres_out:
            gpus = gpus_by_host(obj)
            if not gpus:
                raise CommandError(f"--gres-out: no GPUs are known for the hosts of fabric {obj.name!r} "
                                   "(they appear once the hosts are registered and their agents report); nothing written")
            gres = gres_conf(obj.name, gpus)
        # Both texts are ready before anything is written: a failure leaves no half output.
        for path, content in ((output, text), (gres_out, gres)):
            if content is None:
                continue
            if path and path != "-":
                try:
                    with open(path, "w") as fh:
                        fh.write(content)
                except OSError as exc:
                    raise CommandError(f"cannot write {path}: {exc.strerror}") from None
                self.stderr.write(f"wrote {path}")
            else:
                self.stdout.write(content, ending="")

from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_slug
from django.db import transaction

from fabric import fattree
from fabric.importer import import_topology
from pool.models import Gpu
from pool.services import register_hosts_from_fabric


class Command(BaseCommand):
    help = (
        "Build a synthetic InfiniBand fat tree, import it as a fabric (as a diff, like a discovery) "
        "and register its hosts and GPUs. Re-running with the same arguments changes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("--fabric", required=True, help="fabric name (created if new)")
        parser.add_argument("--spines", type=int, required=True, help="spine switches (all pods together)")
        parser.add_argument("--leaves", type=int, required=True, help="leaf switches (all pods together)")
        parser.add_argument("--hosts-per-leaf", type=int, required=True, help="host cables per leaf")
        parser.add_argument("--gpus-per-host", type=int, default=8, help="default: %(default)s")
        parser.add_argument("--hcas-per-host", type=int, default=1,
                            help="HCAs (rails) per host; above 1 the fabric is rail-optimized (default: %(default)s)")
        parser.add_argument("--pods", type=int, default=0, help="above 1: a 3-tier fabric of this many pods (default: 2-tier)")
        parser.add_argument("--cores", type=int, default=None, help="core switches of a 3-tier fabric (default: spines / pods)")
        parser.add_argument("--speed", default="NDR", help=f"link speed, one of {', '.join(fattree.LANE_GBPS)} (default: %(default)s)")
        parser.add_argument("--gpu-model", default=fattree.DEFAULT_GPU_MODEL, help='default: "%(default)s"')
        parser.add_argument("--gpu-memory-mib", type=int, default=fattree.DEFAULT_GPU_MEMORY_MIB, help="default: %(default)s")
        parser.add_argument("--ibsim-net", metavar="FILE", help="also write the fabric as an ibsim net file")
        parser.add_argument("--ibnetdiscover-out", metavar="FILE", help="also write the fabric as ibnetdiscover output")

    def handle(self, *args, **opts):
        name = opts["fabric"]
        try:
            validate_slug(name)
        except ValidationError:
            raise CommandError(f"--fabric {name!r}: use letters, digits, '-' and '_' only") from None
        if len(name) > 64:
            raise CommandError(f"--fabric {name!r}: at most 64 characters")
        model = opts["gpu_model"].strip()
        if not model or len(model) > Gpu._meta.get_field("model").max_length:
            raise CommandError(f"--gpu-model {opts['gpu_model']!r}: give 1 to {Gpu._meta.get_field('model').max_length} characters")
        if opts["gpu_memory_mib"] < 1:
            raise CommandError(f"--gpu-memory-mib must be at least 1, got {opts['gpu_memory_mib']}")
        try:
            tree = fattree.build(
                spines=opts["spines"], leaves=opts["leaves"], hosts_per_leaf=opts["hosts_per_leaf"],
                gpus_per_host=opts["gpus_per_host"], hcas_per_host=opts["hcas_per_host"], pods=opts["pods"],
                cores=opts["cores"], speed=opts["speed"],
            )
        except ValueError as exc:
            raise CommandError(f"cannot build that fat tree: {exc} (nothing was changed)") from None

        # Files first: a path that cannot be written fails before the database changes.
        for option, render in (("ibsim_net", lambda: fattree.to_ibsim_net(tree)),
                               ("ibnetdiscover_out", lambda: fattree.to_ibnetdiscover(tree.topology))):
            if opts[option]:
                try:
                    Path(opts[option]).write_text(render())
                except OSError as exc:
                    raise CommandError(f"--{option.replace('_', '-')} {opts[option]}: {exc.strerror} (nothing was changed)") from None

        with transaction.atomic():
            result = import_topology(tree.topology, name, source_name=f"build_fattree: {tree.describe()}")
            hosts = register_hosts_from_fabric(result.fabric, gpus_per_host=tree.gpus_per_host, gpu_model=model,
                                               memory_mib=opts["gpu_memory_mib"])
        if opts["verbosity"] < 1:
            return
        self.stdout.write(tree.describe())
        self.stdout.write(result.summary())
        self.stdout.write(hosts.summary())
        for option, label in (("ibsim_net", "ibsim net file"), ("ibnetdiscover_out", "ibnetdiscover file")):
            if opts[option]:
                self.stdout.write(f"wrote {label} {opts[option]}")


from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from pool.models import Pool
from scheduler import services
from scheduler.models import Job, Tenant


class Command(BaseCommand):
    help = (
        "Queue a job: python manage.py submit_job --tenant T --pool P --gpus N [options] -- COMMAND ARGS... "
        "The next allocation cycle (asked for now) proposes GPUs for it."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--pool", required=True)
        parser.add_argument("--gpus", required=True, type=int)
        parser.add_argument("--name", default="")
        parser.add_argument("--model", action="append", default=[], metavar="MODEL",
                            help="a GPU model it may run on, e.g. H100 (repeat for several)")
        parser.add_argument("--min-memory-mib", type=int, default=0)
        parser.add_argument("--fp64", choices=[v for v in Job.Fp64.values if v])
        parser.add_argument("--site", default="")
        parser.add_argument("--task-class", choices=Job.TaskClass.values, default=Job.TaskClass.TRAINING)
        parser.add_argument("--priority", type=int, default=0, help="higher runs first (default: %(default)s)")
        parser.add_argument("--no-gang", action="store_true", help="may start on fewer GPUs than asked for")
        parser.add_argument("--estimated-runtime", type=int, metavar="SECONDS")
        parser.add_argument("--max-runtime", type=int, metavar="SECONDS")
        parser.add_argument("--preemptible", action="store_true")
        parser.add_argument("--max-leaves", type=int, metavar="K", help="at most K leaf switches")
        parser.add_argument("--topology-hard", action="store_true", help="never relax --max-leaves")
        parser.add_argument("--max-wait", type=int, default=0, metavar="SECONDS",
                            help="a soft --max-leaves is dropped after this wait (default: %(default)s)")
        parser.add_argument("--gpu-share", type=int, default=0, metavar="MILLI",
                            help="a share of one GPU in thousandths, 1-999 (with --gpus 1)")
        parser.add_argument("--gpu-memory", type=int, default=0, metavar="MIB", help="GPU memory of the share, MiB")
        parser.add_argument("--mig", default="", metavar="PROFILE", help="a MIG instance, e.g. 1g.10gb (with --gpus 1)")
        parser.add_argument("--restartable", action="store_true", help="may be stopped and restarted elsewhere")
        parser.add_argument("--allow-remote-site", action="store_true",
                            help="may run at another site after --max-wait (needs --site)")
        parser.add_argument("--grace", type=int, default=30, metavar="SECONDS",
                            help="SIGTERM to SIGKILL when it is stopped (default: %(default)s)")
        parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
        parser.add_argument("--create-tenant", action="store_true", help="create the tenant if it does not exist (demos)")
        parser.add_argument("argv", nargs="*", metavar="COMMAND", help="what the agents run, after --")

    def handle(self, *args, **opts):
        if not opts["argv"]:
            raise CommandError("give the command to run after --, e.g. submit_job ... -- python train.py")
        env = {}
        for item in opts["env"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"--env {item!r}: expected NAME=VALUE")
            env[name] = value
        if not Pool.objects.filter(name=opts["pool"]).exists():
            known = ", ".join(Pool.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise CommandError(f"no pool named {opts['pool']!r}; known pools: {known}")
        try:
            with transaction.atomic():  # a tenant made for a job that is refused is not kept
                job = services.submit_job(None, tenant=self._tenant(opts), pool=opts["pool"], gpus=opts["gpus"],
                                          command=opts["argv"], env=env, name=opts["name"], gpu_models=opts["model"],
                                          min_memory_mib=opts["min_memory_mib"], fp64=opts["fp64"] or "",
                                          site=opts["site"], task_class=opts["task_class"], priority=opts["priority"],
                                          gang=not opts["no_gang"], estimated_runtime_s=opts["estimated_runtime"],
                                          max_runtime_s=opts["max_runtime"], preemptible=opts["preemptible"],
                                          max_leaves=opts["max_leaves"], topology_hard=opts["topology_hard"],
                                          max_wait_s=opts["max_wait"], gpu_milli=opts["gpu_share"],
                                          gpu_memory_mib=opts["gpu_memory"], mig_profile=opts["mig"],
                                          restartable=opts["restartable"],
                                          allow_remote_site=opts["allow_remote_site"], grace_period_s=opts["grace"])
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
            raise CommandError(f"job not submitted: {problems}") from None
        self.stdout.write(f"job {job.pk} {job.state}: {job.gpus} GPUs in pool {job.pool.name} for tenant "
                          f"{job.tenant.name}")

    def _tenant(self, opts) -> Tenant:
        tenant = Tenant.objects.filter(name=opts["tenant"]).first()
        if tenant is not None:
            return tenant
        if not opts["create_tenant"]:
            known = ", ".join(Tenant.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise CommandError(f"no tenant named {opts['tenant']!r}; known tenants: {known} (--create-tenant makes it)")
        tenant = Tenant(name=opts["tenant"])
        try:
            tenant.full_clean()
        except ValidationError as exc:
            raise CommandError(f"--tenant {opts['tenant']!r}: {'; '.join(exc.messages)}") from None
        tenant.save()
        return tenant

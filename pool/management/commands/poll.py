from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from pool import tasks
from pool.models import Host


class Command(BaseCommand):
    help = (
        "Poll hosts now, in this process (the same fetch and writes as a Celery poll round, without "
        "the round lock or a PollRound record), and print what came back."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", action="append", default=[], metavar="NAME", help="only this host (repeatable)")
        parser.add_argument("--fabric", metavar="NAME", help="only the hosts of this fabric")

    def handle(self, *args, **opts):
        hosts = tasks.pollable_hosts()
        if opts["host"]:
            hosts = hosts.filter(name__in=opts["host"])
            missing = sorted(set(opts["host"]) - set(hosts.values_list("name", flat=True)))
            if missing:
                raise CommandError(f"no pollable host named {', '.join(missing)} (unknown, no agent URL, or agent kind none)")
        if opts["fabric"]:
            hosts = hosts.filter(fabric__name=opts["fabric"])
        ids = list(hosts.order_by("id").values_list("id", flat=True))
        if not ids:
            raise CommandError("no hosts to poll (hosts need an agent URL and an agent kind other than none)")
        size = max(1, int(settings.POLL_CHUNK_SIZE))
        ok = errors = samples = 0
        for start in range(0, len(ids), size):
            stats = tasks.poll_hosts(ids[start:start + size])
            ok, errors, samples = ok + stats.hosts_ok, errors + stats.hosts_error, samples + stats.gpu_samples
        self.stdout.write(f"polled {len(ids)} hosts: {ok} reported ({samples} GPU samples), {errors} did not")
        for name, state, reason in Host.objects.filter(pk__in=ids).exclude(last_error="").order_by("name").values_list(
                "name", "state", "last_error")[:50]:
            self.stdout.write(f"  {name} ({state}): {reason}")

from django.shortcuts import render

from .models import Gpu, Host


def index(request):
    # A placeholder until the pool pages land: real counts, no invented rows.
    return render(request, "pool/index.html", {"hosts": Host.objects.count(), "gpus": Gpu.objects.count()})

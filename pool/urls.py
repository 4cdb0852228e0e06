from django.urls import path

from . import views

app_name = "pool"
urlpatterns = [
    path("", views.index, name="index"),
    # POST to the same URL drains or undrains (operators), so every URL answers a GET.
    path("hosts/<path:host>/", views.host_detail, name="host"),  # any host name, "/" included
]

from django.urls import path

from . import views

app_name = "pool"
urlpatterns = [
    path("", views.index, name="index"),
]

from django.urls import path

from . import views

app_name = "fabric"
urlpatterns = [
    path("", views.index, name="index"),
]

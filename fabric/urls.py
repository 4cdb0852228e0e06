from django.urls import path

from . import views

app_name = "fabric"
urlpatterns = [
    path("", views.index, name="index"),
    path("<str:name>/", views.fabric_detail, name="detail"),
    path("<str:name>/links/", views.link_list, name="links"),
    path("<str:name>/adapters/", views.adapter_list, name="adapters"),
    path("<str:name>/switches/<str:guid>/", views.switch_detail, name="switch"),
]

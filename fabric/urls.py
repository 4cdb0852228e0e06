from django.urls import path

from . import views

app_name = "fabric"
urlpatterns = [
    path("", views.index, name="index"),
    path("<slug:name>/", views.fabric_detail, name="detail"),
    path("<slug:name>/links/", views.link_list, name="links"),
    path("<slug:name>/adapters/", views.adapter_list, name="adapters"),
    path("<slug:name>/switches/<str:guid>/", views.switch_detail, name="switch"),
]

from django.urls import path

from . import views_live

app_name = "live"
urlpatterns = [
    path("topology/", views_live.topology_page, name="topology"),
    path("topology/data/", views_live.topology_json, name="topology-data"),
    path("heatmap/", views_live.heatmap_page, name="heatmap"),
    path("heatmap/data/", views_live.heatmap_json, name="heatmap-data"),
]

from django.urls import path

from . import views

app_name = "scheduler"
urlpatterns = [
    path("", views.index, name="index"),
    # Decisions POST to the page of what they decide (approve/reject to the placement,
    # cancel to the job), so every URL answers a GET.
    path("placements/<int:placement_id>/", views.placement_detail, name="placement"),
    path("placements/<int:placement_id>/override/", views.placement_override, name="override"),
    # JSON for the heatmap's pick mode: a dry run, and the override itself.
    path("placements/<int:placement_id>/override/check/", views.override_check, name="override-check"),
    path("placements/<int:placement_id>/override/confirm/", views.override_confirm, name="override-confirm"),
    path("jobs/", views.job_list, name="jobs"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("cycles/", views.cycle_list, name="cycles"),
    path("cycles/<int:cycle_id>/", views.cycle_detail, name="cycle"),
    path("submit/", views.submit, name="submit"),
]

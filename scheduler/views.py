"""Scheduler pages: the queue, proposals waiting for a decision, running work and recent
cycles; one placement with its decision forms and the override picker; job and cycle
history; the submit form. Plain server-rendered pages (the live dashboard comes later).

Reads go through scheduler.selectors, every change through scheduler.services. Decisions
are POSTs (CSRF-protected) to the page of the thing decided, so every URL answers a GET.
Permissions are checked here and again by the services: a viewer's hand-made POST gets a
403 and changes nothing; a refused decision (stale version, wrong state, a pick that
breaks a rule) comes back as its message, never a 500."""
from __future__ import annotations

import json
import re

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from . import override_preview, selectors, services
from .engine.plan import duration
from .forms import OverrideForm, RejectForm, SubmitJobForm, fieldsets
from .models import AllocationCycle, Job, Placement

PAGE_SIZE = 50
DECIDE_PERMISSION = "scheduler.decide_placement"
SUBMIT_PERMISSION = "scheduler.add_job"
CANCEL_PERMISSION = "scheduler.change_job"


# --- helpers -------------------------------------------------------------------------------


def _pager(request, items, param: str = "page", size: int = PAGE_SIZE) -> dict:
    """A page of `items` and links to its neighbours that keep the other query parameters
    (several lists on one page page independently)."""
    page = Paginator(items, size).get_page(request.GET.get(param))

    def link(number):
        query = request.GET.copy()
        query[param] = number
        return "?" + query.urlencode()

    links = {}
    if page.has_previous():
        links.update(first=link(1), previous=link(page.previous_page_number()))
    if page.has_next():
        links.update(next=link(page.next_page_number()), last=link(page.paginator.num_pages))
    return {"page": page, "links": links}


def _filters(request, *, states) -> tuple[dict, str | None]:
    """tenant, pool and state filters from the query, and a sentence if one is unknown."""
    values = {key: request.GET.get(key, "").strip() for key in ("tenant", "pool", "state")}
    choices = selectors.filter_choices()
    error = selectors.filter_error(**values, choices=choices, states=[str(s) for s in states])
    return {**values, **choices, "states": states}, error


def _safe_next(request, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                  require_https=request.is_secure()):
        return target
    return default


def _refused(request, status: int, message: str, back_url: str, back_label: str):
    return render(request, "scheduler/refused.html",
                  {"message": message, "back_url": back_url, "back_label": back_label}, status=status)


def _actor(request):
    return request.user


# --- the scheduler page --------------------------------------------------------------------


def index(request):
    filters, error = _filters(request, states=selectors.ACTIVE_JOB_STATES)
    context = {"filters": filters, "can_decide": request.user.has_perm(DECIDE_PERMISSION),
               "can_submit": request.user.has_perm(SUBMIT_PERMISSION), "reason_labels": selectors.REASON_LABELS}
    if error:
        # The page comes back with the message, not a 500 or a silently empty list.
        context["error"] = error
        return render(request, "scheduler/index.html", context, status=400)
    tenant, pool, state = filters["tenant"], filters["pool"], filters["state"]
    context["headline"] = selectors.headline(tenant=tenant, pool=pool)
    queued = [s for s in selectors.QUEUED_STATES if state in ("", s)]
    if queued:
        queue = _pager(request, selectors.queue(tenant=tenant, pool=pool, states=queued), "page")
        context["queue"] = {**queue, "rows": selectors.job_rows(queue["page"])}
    if state in ("", Job.State.PROPOSED):
        proposals = _pager(request, selectors.placements(states=[Placement.State.PROPOSED], tenant=tenant, pool=pool,
                                                         order=("expires_at", "id")), "proposals_page")
        context["proposals"] = {**proposals, "rows": selectors.placement_rows(proposals["page"])}
    running_states = [s for s in selectors.RUNNING_PLACEMENT_STATES if state in ("", s)]
    if running_states:
        running = _pager(request, selectors.placements(states=running_states, tenant=tenant, pool=pool),
                         "running_page")
        context["running"] = {**running, "rows": selectors.placement_rows(running["page"])}
    context["cycles"] = selectors.cycle_rows(selectors.recent_cycles())
    return render(request, "scheduler/index.html", context)


# --- one placement -------------------------------------------------------------------------


def _placement(pk) -> Placement:
    return get_object_or_404(
        Placement.objects.select_related("job", "job__tenant", "job__pool", "cycle", "decided_by", "overridden_by"),
        pk=pk)


def _placement_context(request, placement: Placement) -> dict:
    chosen_ids = list(placement.placement_gpus.values_list("gpu_id", flat=True))
    context = {
        "placement": placement,
        "job": placement.job,
        "state_class": selectors.PLACEMENT_STATE_CLASSES.get(placement.state, "state-unknown"),
        "job_state_class": selectors.JOB_STATE_CLASSES.get(placement.job.state, "state-unknown"),
        "can_decide": request.user.has_perm(DECIDE_PERMISSION),
        "decidable": placement.state in Placement.DECIDABLE_STATES,
        "cost": placement.cost_dict(),
        "chosen_groups": selectors.placement_gpu_groups(chosen_ids),
        "gpu_count": len(chosen_ids),
        "history": selectors.audit_events(placement=placement),
    }
    if placement.is_override:
        context["proposed_groups"] = selectors.placement_gpu_groups(placement.proposed_gpus or [])
        context["cost_compare"] = selectors.cost_table([("engine's proposal", placement.proposed_cost or {}),
                                                        ("override", context["cost"])])
    else:
        context["cost_compare"] = selectors.cost_table([("this placement", context["cost"])])
    return context


def placement_detail(request, placement_id):
    placement = _placement(placement_id)
    if request.method == "POST":
        return _decide(request, placement)
    return render(request, "scheduler/placement.html", _placement_context(request, placement))


def _decide(request, placement: Placement):
    """POST action=approve|reject (version, reason) from an operator or admin."""
    back = reverse("scheduler:placement", args=[placement.pk])
    if not request.user.has_perm(DECIDE_PERMISSION):
        # Checked here, not only by hiding the buttons: a viewer's hand-made POST changes nothing.
        return _refused(request, 403, "Only operators and admins may decide placements. Nothing was changed.",
                        back, f"placement {placement.pk}")
    action = request.POST.get("action", "")
    form = RejectForm(request.POST)
    if action not in ("approve", "reject"):
        return _refused(request, 400, f"Unknown action {action[:40]!r}: use approve or reject. Nothing was changed.",
                        back, f"placement {placement.pk}")
    if not form.is_valid():
        if "version" in form.errors:
            message = "The form did not say which version of the proposal it saw; reload the page and decide again."
        else:
            message = " ".join(str(e) for errors in form.errors.values() for e in errors)
        return _decision_refused(request, placement, message, status=400)
    version = form.cleaned_data["version"]
    try:
        if action == "approve":
            services.approve(placement, _actor(request), expected_version=version)
            messages.success(request, f"Approved placement {placement.pk} of {placement.job}.")
        else:
            services.reject(placement, _actor(request), reason=form.cleaned_data["reason"], expected_version=version)
            messages.success(request, f"Rejected placement {placement.pk}; {placement.job} is back in the queue.")
    except PermissionDenied as exc:
        return _refused(request, 403, str(exc) or "You may not decide placements. Nothing was changed.",
                        back, f"placement {placement.pk}")
    except services.DecisionError as exc:
        return _decision_refused(request, placement, str(exc))
    return redirect(_safe_next(request, back))


def _decision_refused(request, placement: Placement, message: str, status: int = 409):
    """The placement page as it is now, with why the decision was not made."""
    placement = _placement(placement.pk)
    context = _placement_context(request, placement)
    context["error"] = message
    return render(request, "scheduler/placement.html", context, status=status)


def placement_override(request, placement_id):
    """GET: the GPU picker. POST step=preview: the pick's cost next to the proposal's, or the
    rules it breaks. POST step=confirm: the override itself (with the version seen)."""
    placement = _placement(placement_id)
    can_decide = request.user.has_perm(DECIDE_PERMISSION)
    back = reverse("scheduler:placement", args=[placement.pk])
    if request.method == "POST" and not can_decide:
        return _refused(request, 403, "Only operators and admins may override placements. Nothing was changed.",
                        back, f"placement {placement.pk}")
    groups = selectors.pool_gpu_choices(placement)
    pool_ids = [g["id"] for group in groups for host in group["hosts"] for g in host["gpus"]]
    context = {
        "placement": placement,
        "job": placement.job,
        "state_class": selectors.PLACEMENT_STATE_CLASSES.get(placement.state, "state-unknown"),
        "can_decide": can_decide,
        "decidable": placement.state in Placement.DECIDABLE_STATES,
        "groups": groups,
        "version": placement.version,
        "proposal_cost": placement.cost_dict(),
    }
    if request.method != "POST":
        return render(request, "scheduler/override.html", context)

    form = OverrideForm(request.POST, gpu_ids=pool_ids)
    step = request.POST.get("step", "preview")
    if not form.is_valid():
        context["form_errors"] = [str(e) for errors in form.errors.values() for e in errors]
        return render(request, "scheduler/override.html", context, status=400)
    picked, version = form.cleaned_data["gpu"], form.cleaned_data["version"]
    _mark_picked(groups, picked)
    context.update(picked=picked, picked_count=len(picked), version=version)
    if version != placement.version or not context["decidable"]:
        # Someone decided, or the cycle expired it, since this operator loaded the page.
        context["error"] = _changed_message(placement)
        context["version"] = placement.version
        return render(request, "scheduler/override.html", context, status=409)

    if step == "confirm":
        try:
            services.override(placement, _actor(request), gpu_ids=picked, expected_version=version)
        except PermissionDenied as exc:
            return _refused(request, 403, str(exc) or "You may not override placements. Nothing was changed.",
                            back, f"placement {placement.pk}")
        except services.DecisionError as exc:
            placement = _placement(placement.pk)
            context.update(placement=placement, version=placement.version, error=str(exc),
                           problems=getattr(exc, "problems", None) or [],
                           state_class=selectors.PLACEMENT_STATE_CLASSES.get(placement.state, "state-unknown"),
                           decidable=placement.state in Placement.DECIDABLE_STATES)
            return render(request, "scheduler/override.html", context, status=409)
        messages.success(request, f"Placement {placement.pk} overridden with the {len(picked)} GPUs you picked.")
        return redirect(back)

    # Preview: the pick's cost, computed as the override itself will, next to the proposal's.
    outcome = selectors.preview_override(placement, picked)
    if isinstance(outcome, list):
        context["problems"] = outcome
        return render(request, "scheduler/override.html", context, status=400)
    proposal_ids = list(placement.placement_gpus.values_list("gpu_id", flat=True))
    context.update(
        preview=True,
        cost_compare=selectors.cost_table([("proposal", context["proposal_cost"]), ("your pick", outcome.as_dict())]),
        proposal_groups=selectors.placement_gpu_groups(proposal_ids), proposal_count=len(proposal_ids),
        pick_groups=selectors.placement_gpu_groups(picked))
    return render(request, "scheduler/override.html", context)


def _mark_picked(groups, picked) -> None:
    chosen = set(picked)
    for group in groups:
        for host in group["hosts"]:
            for gpu in host["gpus"]:
                gpu["chosen"] = gpu["id"] in chosen


def _changed_message(placement: Placement) -> str:
    return (f"Placement {placement.pk} changed under you: it is now {placement.state} (version {placement.version}). "
            f"Nothing was changed; look at it again before you decide.")


# --- picking an override on the heatmap (JSON) ---------------------------------------------


def _pick_request(request, placement_id):
    """(placement, gpu ids, version) of a JSON pick, or the JsonResponse that refuses it."""
    if request.method != "POST":
        return JsonResponse({"error": "POST a JSON pick here."}, status=405, headers={"Allow": "POST"})
    if not request.user.has_perm(DECIDE_PERMISSION):
        # The page hides the controls from viewers; a hand-made request is refused here too.
        return JsonResponse({"error": "Only operators and admins may override placements. Nothing was changed."},
                            status=403)
    placement = Placement.objects.select_related("job", "job__tenant", "job__pool").filter(pk=placement_id).first()
    if placement is None:
        return JsonResponse({"error": f"There is no placement {placement_id}."}, status=404)
    if request.content_type != "application/json":
        # A form post (whose body the CSRF check has already read) is not a pick.
        return JsonResponse({"error": f"Send the pick as application/json, not {request.content_type or 'no type'}. "
                                      "Nothing was changed."}, status=400)
    try:
        payload = json.loads(request.body or b"null")
        gpu_ids, version = override_preview.parse_pick(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        message = str(exc) if isinstance(exc, override_preview.BadPick) else "The request body is not JSON."
        return JsonResponse({"error": message + " Nothing was changed."}, status=400)
    if version != placement.version or placement.state not in Placement.DECIDABLE_STATES:
        return JsonResponse({"error": _changed_message(placement), "changed": True, "version": placement.version,
                             "state": placement.state}, status=409)
    return placement, gpu_ids, version


def override_check(request, placement_id):
    """Dry run of a pick: its cost next to the proposal's, or the rules it breaks. Writes nothing."""
    parsed = _pick_request(request, placement_id)
    if isinstance(parsed, JsonResponse):
        return parsed
    placement, gpu_ids, _version = parsed
    result = override_preview.check(placement, gpu_ids)
    result["table"] = override_preview.cost_rows(result["proposal_cost"], result["cost"])
    return JsonResponse(result)


def override_confirm(request, placement_id):
    """The override itself, from the heatmap's pick panel, with the version the operator saw."""
    parsed = _pick_request(request, placement_id)
    if isinstance(parsed, JsonResponse):
        return parsed
    placement, gpu_ids, version = parsed
    try:
        placement = services.override(placement, _actor(request), gpu_ids=gpu_ids, expected_version=version)
    except PermissionDenied as exc:
        return JsonResponse({"error": str(exc) or "You may not override placements. Nothing was changed."}, status=403)
    except services.DecisionError as exc:
        fresh = _placement(placement.pk)
        return JsonResponse({"error": str(exc), "problems": getattr(exc, "problems", None) or [],
                             "changed": isinstance(exc, (services.ChangedUnderYou, services.NotDecidable)),
                             "version": fresh.version, "state": fresh.state}, status=409)
    messages.success(request, f"Placement {placement.pk} overridden with the {len(gpu_ids)} GPUs you picked.")
    return JsonResponse({"ok": True, "state": placement.state, "version": placement.version,
                         "url": reverse("scheduler:placement", args=[placement.pk])})


# --- jobs ----------------------------------------------------------------------------------


def job_list(request):
    filters, error = _filters(request, states=Job.State.values)
    filters["name"] = request.GET.get("name", "").strip()
    # Why pending jobs wait (the overview links each reason here): a reason code, as stored.
    filters["reason"] = request.GET.get("reason", "").strip()
    if filters["reason"] and not re.fullmatch(r"[a-z_]{1,40}", filters["reason"]):
        error = error or f"reason {filters['reason'][:60]!r} is not a reason code (lower-case letters and '_')"
    context = {"filters": filters, "can_submit": request.user.has_perm(SUBMIT_PERMISSION)}
    if error:
        context["error"] = error
        return render(request, "scheduler/jobs.html", context, status=400)
    jobs = _pager(request, selectors.job_list(tenant=filters["tenant"], pool=filters["pool"], state=filters["state"],
                                              name=filters["name"], reason=filters["reason"]))
    context["jobs"] = {**jobs, "rows": selectors.job_rows(jobs["page"])}
    return render(request, "scheduler/jobs.html", context)


def _job(pk) -> Job:
    return get_object_or_404(Job.objects.select_related("tenant", "pool", "submitted_by"), pk=pk)


def job_detail(request, job_id):
    job = _job(job_id)
    can_cancel = request.user.has_perm(CANCEL_PERMISSION)
    if request.method == "POST":
        back = reverse("scheduler:job", args=[job.pk])
        if not can_cancel:
            return _refused(request, 403, "Only operators and admins may cancel jobs. Nothing was changed.",
                            back, str(job))
        if request.POST.get("action") != "cancel":
            return _refused(request, 400, "Unknown action: use cancel. Nothing was changed.", back, str(job))
        try:
            services.cancel_job(job, _actor(request))
        except PermissionDenied as exc:
            return _refused(request, 403, str(exc) or "You may not cancel jobs. Nothing was changed.", back, str(job))
        except services.DecisionError as exc:
            return _job_page(request, _job(job.pk), can_cancel, error=str(exc), status=409)
        messages.success(request, f"{job} is cancelled.")
        return redirect(back)
    return _job_page(request, job, can_cancel)


def _job_page(request, job: Job, can_cancel: bool, error: str = "", status: int = 200):
    context = {
        "job": job,
        "state_class": selectors.JOB_STATE_CLASSES.get(job.state, "state-unknown"),
        "reason_label": selectors.reason_label(job.pending_reason),
        "can_cancel": can_cancel and not job.is_final,
        "timeline": selectors.audit_events(job=job),
        "placements": selectors.job_placements(job),
        "env_lines": [f"{k}={v}" for k, v in sorted((job.env or {}).items())],
        "durations": {key: duration(seconds) if seconds else "" for key, seconds in (
            ("estimated", job.estimated_runtime_s), ("max", job.max_runtime_s), ("wait", job.max_wait_s))},
        "error": error,
    }
    return render(request, "scheduler/job.html", context, status=status)


def submit(request):
    can_submit = request.user.has_perm(SUBMIT_PERMISSION)
    if request.method == "POST":
        if not can_submit:
            return _refused(request, 403, "Only operators and admins may submit jobs. Nothing was submitted.",
                            reverse("scheduler:index"), "the scheduler")
        form = SubmitJobForm(request.POST)
        if form.is_valid():
            try:
                job = services.submit_job(_actor(request), **form.job_fields())
            except PermissionDenied as exc:
                return _refused(request, 403, str(exc) or "You may not submit jobs. Nothing was submitted.",
                                reverse("scheduler:index"), "the scheduler")
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(request, f"Submitted {job}; the next allocation cycle places it or says why it waits.")
                return redirect("scheduler:job", job_id=job.pk)
        return _submit_page(request, form, can_submit, status=400)
    return _submit_page(request, SubmitJobForm(), can_submit)


def _submit_page(request, form, can_submit: bool, status: int = 200):
    return render(request, "scheduler/submit.html",
                  {"form": form, "fieldsets": fieldsets(form), "can_submit": can_submit}, status=status)


# --- cycles --------------------------------------------------------------------------------


def cycle_list(request):
    cycles = _pager(request, AllocationCycle.objects.all())
    return render(request, "scheduler/cycles.html",
                  {"cycles": {**cycles, "rows": selectors.cycle_rows(cycles["page"])}})


def cycle_detail(request, cycle_id):
    cycle = get_object_or_404(AllocationCycle, pk=cycle_id)
    placements = _pager(request, cycle.placements.select_related("job", "job__tenant", "job__pool")
                        .order_by("id"))
    return render(request, "scheduler/cycle.html", {
        "cycle": cycle,
        "reasons": selectors.reasons_list(cycle.pending_reasons),
        "placements": {**placements, "rows": selectors.placement_rows(placements["page"])},
    })

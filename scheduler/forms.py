"""Forms of the scheduler pages: submitting a job, rejecting and overriding a proposal.
They parse what a person types (a shell-like command, KEY=VALUE lines, durations such as
"1h30m") into the values the services take, with one error per field that names the
problem."""
from __future__ import annotations

import re
import shlex

from django import forms

from pool.models import Pool

from .models import Job, Tenant

# The agent refuses bigger (agent/protocol.py parse_allocation_request).
MAX_ARGS = 256
MAX_ARG_CHARS = 4095
MAX_ENV = 200
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms]?)", re.I)
UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "": 1}
MAX_REASON = 500
MAX_ENV_VALUE = 4095
# services.submit_job's field names that differ from this form's.
SERVICE_FIELDS = {"estimated_runtime_s": "estimated_runtime", "max_runtime_s": "max_runtime", "max_wait_s": "max_wait",
                  "grace_period_s": "grace_period"}
MAX_GRACE_S = 3600  # services.submit_job's limit


def parse_duration(text: str) -> int:
    """"90", "90s", "30m", "1h30m", "2d" -> seconds. ValueError with a sentence otherwise."""
    compact = text.strip().replace(" ", "")
    if not compact:
        raise ValueError("empty")
    seconds, pos = 0.0, 0
    for match in DURATION_PART.finditer(compact):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * UNIT_SECONDS[match.group(2).lower()]
        pos = match.end()
    if pos != len(compact):
        raise ValueError(f"{text.strip()!r} is not a duration: write seconds, or e.g. 45m, 2h, 1h30m, 1d")
    return round(seconds)


class DurationField(forms.CharField):
    """A duration typed as seconds or with units; cleans to whole seconds (None if empty)."""

    def __init__(self, *, minimum: int = 0, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)
        self.widget.attrs.setdefault("size", 10)
        self.minimum = minimum

    def to_python(self, value):
        value = super().to_python(value)
        if not value:
            return None
        if len(value) > 40:
            raise forms.ValidationError("Too long for a duration: write e.g. 45m, 2h, 1h30m, 1d.")
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc).capitalize() + ".") from None
        if seconds < self.minimum:
            raise forms.ValidationError(f"At least {self.minimum} s.")
        if seconds > 10 * 365 * 86400:
            raise forms.ValidationError("More than ten years: check the unit.")
        return seconds


def parse_command(text: str) -> list[str]:
    """A command line as a shell would split it (quotes and backslashes; no expansion)."""
    try:
        argv = shlex.split(text, comments=False, posix=True)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise forms.ValidationError(f"Cannot split the command: {str(exc).lower()}.") from None
    if not argv:
        raise forms.ValidationError("Give the command to run, e.g. python train.py --epochs 3.")
    if len(argv) > MAX_ARGS:
        raise forms.ValidationError(f"{len(argv)} arguments: at most {MAX_ARGS}.")
    for i, arg in enumerate(argv):
        if len(arg) > MAX_ARG_CHARS:
            raise forms.ValidationError(f"Argument {i + 1} is {len(arg)} characters long: at most {MAX_ARG_CHARS}.")
    return argv


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and # comments skipped), errors naming the line."""
    env: dict[str, str] = {}
    errors = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep:
            errors.append(f"Line {number}: expected KEY=VALUE, got {line[:40]!r}.")
        elif not ENV_NAME.match(key):
            errors.append(f"Line {number}: {key[:40]!r} is not a variable name (letters, digits and _, "
                          f"not starting with a digit).")
        elif key in env:
            errors.append(f"Line {number}: {key} is set twice.")
        elif len(value) > MAX_ENV_VALUE:
            errors.append(f"Line {number}: the value of {key} is {len(value)} characters long: at most {MAX_ENV_VALUE}.")
        else:
            env[key] = value
    if len(env) > MAX_ENV:
        errors.append(f"{len(env)} variables: at most {MAX_ENV}.")
    if errors:
        raise forms.ValidationError(errors)
    return env


class SubmitJobForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, help_text="For people; optional.")
    tenant = forms.ModelChoiceField(Tenant.objects.all(), to_field_name="name", empty_label="choose a tenant")
    pool = forms.ModelChoiceField(Pool.objects.all(), to_field_name="name", empty_label="choose a pool")
    gpus = forms.IntegerField(label="GPUs", min_value=1, max_value=100_000)
    # sharing: a fraction of one GPU in thousandths (1-999); the job then asks for 1 GPU.
    gpu_milli = forms.IntegerField(label="Share of one GPU (thousandths)", required=False, min_value=1, max_value=999,
                                   help_text="e.g. 250 for a quarter of a GPU, shared with other jobs; empty: whole GPUs.")
    gpu_memory_mib = forms.IntegerField(label="GPU memory of the share (MiB)", required=False, min_value=1,
                                        max_value=10_000_000,
                                        help_text="Memory it needs on the shared GPU; alone, it asks for that part "
                                                  "of a GPU.")
    mig_profile = forms.CharField(label="MIG profile", required=False, max_length=20,
                                  widget=forms.TextInput(attrs={"size": 10, "placeholder": "1g.10gb"}),
                                  help_text="A MIG instance instead of a share, e.g. 1g.10gb or 3g.40gb "
                                            "(A100, H100...).")
    gpu_models = forms.CharField(
        label="GPU models", required=False, max_length=200,
        help_text="Any of these, separated by commas (e.g. H100, A100); empty: any model.")
    min_memory_mib = forms.IntegerField(label="Minimum memory per GPU (MiB)", required=False, min_value=0,
                                        max_value=10_000_000)
    fp64 = forms.ChoiceField(label="FP64 class", choices=Job.Fp64.choices, required=False)
    site = forms.CharField(max_length=100, required=False, help_text="Empty: any site.")
    allow_remote_site = forms.BooleanField(label="May run at another site", required=False,
                                           help_text="Once it has waited the time below (Topology: relax "
                                                     "after) without starting at its site; needs the site.")
    task_class = forms.ChoiceField(choices=Job.TaskClass.choices, initial=Job.TaskClass.TRAINING)
    priority = forms.IntegerField(initial=0, min_value=-1_000_000, max_value=1_000_000, help_text="Higher first.")
    gang = forms.BooleanField(required=False, initial=True, help_text="All GPUs at once.")
    whole_hosts = forms.BooleanField(required=False, initial=True,
                                     help_text="A job larger than one host takes whole hosts.")
    preemptible = forms.BooleanField(required=False)
    restartable = forms.BooleanField(required=False,
                                     help_text="It may be stopped and started again elsewhere (rebalancing).")
    grace_period = DurationField(label="Grace period on stop", initial="30s",
                                 help_text="After SIGTERM, how long it may take to stop before SIGKILL; e.g. 30s, 2m.")
    estimated_runtime = DurationField(label="Estimated run time", minimum=1,
                                      help_text="e.g. 45m, 2h, 1h30m; lets smaller jobs backfill around it.")
    max_runtime = DurationField(label="Maximum run time", minimum=1)
    max_leaves = forms.IntegerField(label="At most this many leaf switches", required=False, min_value=1,
                                    max_value=100_000)
    topology_hard = forms.BooleanField(label="Hard limit (never relaxed)", required=False)
    max_wait = DurationField(label="Soft limit: relax it after",
                             help_text="e.g. 10m; empty: at once. Also the wait before another site (if allowed).")
    command = forms.CharField(max_length=20_000, widget=forms.TextInput(attrs={"size": 60}),
                              help_text="As in a shell: quotes group words; nothing is expanded.")
    env = forms.CharField(label="Environment", required=False, max_length=50_000,
                          widget=forms.Textarea(attrs={"rows": 4, "cols": 60}), help_text="One KEY=VALUE per line.")

    def clean_gpu_models(self) -> list[str]:
        parts = [p.strip() for p in self.cleaned_data["gpu_models"].split(",")]
        return list(dict.fromkeys(p for p in parts if p))

    def clean_mig_profile(self) -> str:
        return self.cleaned_data["mig_profile"].strip().lower()

    def clean_command(self) -> list[str]:
        return parse_command(self.cleaned_data["command"])

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data["env"])

    def clean(self):
        data = super().clean()
        est, most = data.get("estimated_runtime"), data.get("max_runtime")
        if est is not None and most is not None and est > most:
            self.add_error("estimated_runtime", "Longer than the maximum run time.")
        if data.get("gpu_milli") and data.get("gpus") not in (None, 1):  # sharing
            self.add_error("gpu_milli", "A shared job runs on one GPU: set GPUs to 1.")
        if data.get("mig_profile") and (data.get("gpu_milli") or data.get("gpu_memory_mib")):
            self.add_error("mig_profile", "A MIG profile fixes the share and the memory: leave those two empty.")
        if data.get("grace_period") is not None and data["grace_period"] > MAX_GRACE_S:
            self.add_error("grace_period", f"At most {MAX_GRACE_S // 60} minutes.")
        if data.get("topology_hard") and not data.get("max_leaves"):
            self.add_error("max_leaves", "A hard limit needs the number of leaf switches.")
        # The wait also says when a job that allows another site may go there (policies).
        if data.get("max_wait") and not data.get("max_leaves") and not data.get("allow_remote_site"):
            self.add_error("max_wait", "A wait only applies to a leaf-switch limit: give the limit or leave this empty.")
        elif data.get("max_wait") and data.get("topology_hard") and not data.get("allow_remote_site"):
            self.add_error("max_wait", "A hard limit is never relaxed: leave the wait empty or untick hard.")
        return data

    def add_service_errors(self, error) -> None:
        """services.submit_job's ValidationError({job field: [message]}) on the matching fields."""
        by_field = getattr(error, "message_dict", None) or {None: error.messages}
        for field, errors in by_field.items():
            name = SERVICE_FIELDS.get(field, field)
            for message in errors:
                message = message[:1].upper() + message[1:]
                self.add_error(name if name in self.fields else None, message if message.endswith(".") else message + ".")

    def job_fields(self) -> dict:
        """The cleaned values under the Job field names."""
        d = self.cleaned_data
        return {
            "name": d["name"], "tenant": d["tenant"], "pool": d["pool"], "gpus": d["gpus"],
            "gpu_models": d["gpu_models"], "min_memory_mib": d["min_memory_mib"] or 0, "fp64": d["fp64"] or "",
            "site": d["site"].strip(), "task_class": d["task_class"], "priority": d["priority"] or 0,
            "gang": d["gang"], "whole_hosts": d["whole_hosts"], "preemptible": d["preemptible"], "estimated_runtime_s": d["estimated_runtime"],
            "max_runtime_s": d["max_runtime"], "max_leaves": d["max_leaves"], "topology_hard": d["topology_hard"],
            "max_wait_s": d["max_wait"] or 0, "command": d["command"], "env": d["env"],
            "gpu_milli": d["gpu_milli"] or 0, "gpu_memory_mib": d["gpu_memory_mib"] or 0,
            "mig_profile": d["mig_profile"], "restartable": d["restartable"],
            "allow_remote_site": d["allow_remote_site"],
            "grace_period_s": 30 if d["grace_period"] is None else d["grace_period"],
        }


class RejectForm(forms.Form):
    reason = forms.CharField(max_length=MAX_REASON, required=False)
    version = forms.IntegerField(min_value=1)

    def clean_reason(self) -> str:
        return " ".join(self.cleaned_data["reason"].split())


class OverrideForm(forms.Form):
    """The operator's pick: GPU ids of the placement's pool, and the version it saw."""

    gpu = forms.TypedMultipleChoiceField(coerce=int, required=False)
    version = forms.IntegerField(min_value=1)

    def __init__(self, *args, gpu_ids=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu"].choices = [(i, i) for i in gpu_ids]
        self.fields["gpu"].error_messages["invalid_choice"] = "GPU %(value)s is not in this job's pool."

    def clean_gpu(self) -> list[int]:
        picked = self.cleaned_data["gpu"]
        if not picked:
            raise forms.ValidationError("Pick at least one GPU.")
        return list(dict.fromkeys(picked))


SUBMIT_FIELDSETS = [
    ("The job", ["name", "tenant", "pool", "gpus", "task_class", "priority", "gang", "whole_hosts", "preemptible",
                 "restartable"]),
    ("GPU sharing (a part of one GPU)", ["gpu_milli", "gpu_memory_mib", "mig_profile"]),
    ("Constraints", ["gpu_models", "min_memory_mib", "fp64", "site", "allow_remote_site"]),
    ("Topology", ["max_leaves", "topology_hard", "max_wait"]),
    ("Run time", ["estimated_runtime", "max_runtime", "grace_period"]),
    ("What to run", ["command", "env"]),
]


def fieldsets(form: SubmitJobForm) -> list[dict]:
    return [{"title": title, "fields": [form[name] for name in names]} for title, names in SUBMIT_FIELDSETS]

from .roles import OPERATOR, ADMIN, user_role

NAV = [
    ("Overview", "dashboard:overview"),
    ("Fabric", "fabric:index"),
    ("Pool", "pool:index"),
    ("Scheduler", "scheduler:index"),
    ("Topology", "live:topology"),
    ("GPU heatmap", "live:heatmap"),
]


def navigation(request):
    role = user_role(request.user) if hasattr(request, "user") else None
    return {
        "nav_items": NAV,
        "user_role": role,
        "can_decide": role in (OPERATOR, ADMIN),
        "can_administer": role == ADMIN or getattr(getattr(request, "user", None), "is_staff", False),
    }

# The scheduler's models (tenants, jobs, placements, cycles) arrive with the scheduler issue.

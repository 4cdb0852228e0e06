"""The reliability suite runs the real stack as processes (bench.stack.Stack): private Redis,
a fresh PostgreSQL database, simulated agents, Celery worker and beat. Slow by nature: every
test here is marked `slow` and `reliability` (CI runs them; `-m "not slow"` skips them)."""
import pytest

from bench.stack import Stack, StackUnavailable, dump


@pytest.fixture
def stack(tmp_path, request):
    try:
        s = Stack(tmp_path / "stack", log=print)
    except StackUnavailable as exc:
        pytest.skip(str(exc))
    try:
        s.setup()
    except StackUnavailable as exc:
        s.close()
        pytest.skip(str(exc))
    except BaseException:
        print(dump(s) if s.procs else "stack set-up failed")
        s.close()  # no redis-server or database left behind
        raise
    yield s
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(dump(s))
    s.close()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)

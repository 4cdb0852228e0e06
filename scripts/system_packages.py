"""Debian packages that `make demo` and `make test` need beside the Python ones: installed
with apt-get when running as root, otherwise named with the command that installs them."""
from __future__ import annotations

import os
import shutil
import subprocess

# Debian package -> a program it provides (checked too, for systems without dpkg).
PROGRAMS = {
    "redis-server": "redis-server",
    "ibsim-utils": "ibsim",
    "infiniband-diags": "ibnetdiscover",
    "opensm": "opensm",
    "chromium": "chromium",
}
# The IB tools live in /usr/sbin, which a non-root PATH often lacks.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])

_updated = False


def is_installed(package: str) -> bool:
    program = PROGRAMS.get(package)
    if program and shutil.which(program, path=SEARCH_PATH):
        return True
    if not shutil.which("dpkg-query"):
        return False
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return result.returncode == 0 and result.stdout.strip() == "install ok installed"


def can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def how_to_install(packages: list[str]) -> str:
    names = " ".join(packages)
    if shutil.which("apt-get"):
        return f"sudo apt-get install -y {names}"
    return f"install {names} (Debian package names) with your system's package manager"


def ensure(packages: list[str], *, log=print) -> list[str]:
    """Install what is missing when we may (root with apt-get: `apt-get update` at most once
    per run). Returns the packages still missing; raises RuntimeError if apt-get fails."""
    global _updated
    missing = [p for p in packages if not is_installed(p)]
    if not missing or not can_install():
        return missing
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    if not _updated:
        log("apt-get update (to install " + ", ".join(missing) + ")")
        if subprocess.run(["apt-get", "update"], env=env, stdin=subprocess.DEVNULL, check=False).returncode:
            raise RuntimeError("apt-get update failed")
        _updated = True
    log("apt-get install -y " + " ".join(missing))
    result = subprocess.run(["apt-get", "install", "-y", *missing], env=env, stdin=subprocess.DEVNULL, check=False)
    if result.returncode:
        raise RuntimeError(f"apt-get install {' '.join(missing)} failed with exit code {result.returncode}")
    return [p for p in missing if not is_installed(p)]

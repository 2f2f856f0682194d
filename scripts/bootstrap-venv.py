"""Create the project's virtual environment and install into it, on any Python 3.11+.

    bootstrap-venv.py VENV [--new] [--with-pip] [PIP INSTALL ARGS...]

``--new`` makes the environment afresh; otherwise an existing one is reused.
``--with-pip`` also puts pip inside it (the tests build wheels with it).

Putting pip into a new environment (ensurepip) costs about 9 s, most of a first
``make demo``. When the interpreter running this script has pip 22.3 or newer, the
environment is made without pip and that pip installs into it (``pip --python``).
Otherwise the environment gets its own pip: from ensurepip, or, where Debian's python3
lacks ``ensurepip`` (no ``python3-venv``), from pip's wheel on PyPI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.request
import venv
from pathlib import Path

QUIET = ["--quiet", "--disable-pip-version-check"]


def host_pip() -> list[str] | None:
    """This interpreter's pip when it can install into another environment."""
    try:
        import pip
    except ImportError:
        return None
    major, minor = (int(p) for p in pip.__version__.split(".")[:2])
    return [sys.executable, "-m", "pip"] if (major, minor) >= (22, 3) else None


def own_pip(target: Path) -> None:
    """Give the environment a pip of its own."""
    python = target / "bin" / "python"
    if subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True,
                      check=False).returncode == 0:
        return
    outside = host_pip()
    if outside is not None:
        subprocess.run([*outside, "--python", str(python), "install", *QUIET, "pip"], check=True)
        return
    try:
        subprocess.run([str(python), "-m", "ensurepip", "--upgrade", "--default-pip"],
                       check=True, capture_output=True)
        return
    except subprocess.CalledProcessError as exc:
        print(f"ensurepip failed ({exc}); installing pip from PyPI instead", file=sys.stderr)
    with urllib.request.urlopen("https://pypi.org/pypi/pip/json", timeout=60) as resp:
        meta = json.load(resp)
    wheel = next(f for f in meta["urls"] if f["filename"].endswith("-py3-none-any.whl"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / wheel["filename"]
        with urllib.request.urlopen(wheel["url"], timeout=120) as resp:
            path.write_bytes(resp.read())
        # A pip wheel can run itself: python pip.whl/pip install pip.
        subprocess.run([str(python), f"{path}/pip", "install", "--no-cache-dir", str(path)],
                       check=True)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    target, rest = Path(argv[0]), argv[1:]
    new = "--new" in rest
    with_pip = "--with-pip" in rest
    install = [a for a in rest if a not in ("--new", "--with-pip")]
    python = target / "bin" / "python"
    if new or not python.exists():
        venv.EnvBuilder(with_pip=False, clear=True).create(target)
    outside = host_pip()
    if with_pip or outside is None:
        own_pip(target)
    if install:
        pip = [*outside, "--python", str(python)] if outside else [str(python), "-m", "pip"]
        subprocess.run([*pip, "install", *QUIET, *install], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

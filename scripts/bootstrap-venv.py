"""Create the project's virtual environment with pip in it, on any Python 3.11+.

Debian's python3 ships without ``ensurepip`` unless ``python3-venv`` is installed,
so ``python3 -m venv`` alone fails on a fresh machine. When it does, we make the
environment without pip and install pip from its wheel on PyPI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.request
import venv
from pathlib import Path


def main() -> int:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".venv")
    python = target / "bin" / "python"
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(target)
        return 0
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"venv with pip failed ({exc}); installing pip from PyPI instead", file=sys.stderr)
    venv.EnvBuilder(with_pip=False, clear=True).create(target)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``recovery_client/client.py`` and the sans-IO core it builds on, ``core.py``, stay two
standard-library files a runtime can vendor (issue 10: the async client lives in
``aclient.py`` so that they do): copied together into a package of the runtime's own,
outside this SDK (as ``bench/bench_http.py`` loads them), they import neither Django nor
httpx nor anything of the project."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import recovery_client.client

#: What a runtime copies: ``client.py`` imports ``core`` relatively, nothing else of the SDK.
VENDORED = ("core.py", "client.py")

PROBE = """
import importlib, sys
module = importlib.import_module(sys.argv[1])
store = module.HttpCheckpointStore("http://127.0.0.1:9", "acme", "t", retries=0)
assert store.max_body_bytes == 1024 * 1024
third_party = sorted(name for name in sys.modules
                     if name.split(".")[0] in ("django", "httpx", "checkpoints", "recovery",
                                               "recovery_client"))
print(module.__file__, third_party)
"""


def test_client_py_and_core_py_load_alone_with_the_standard_library_only(tmp_path):
    package = tmp_path / "acme_runtime" / "vendor"  # a runtime's own package
    package.mkdir(parents=True)
    for parent in (package.parent, package):
        (parent / "__init__.py").write_text("")
    source = Path(recovery_client.client.__file__).parent
    for name in VENDORED:
        shutil.copy(source / name, package / name)
    result = subprocess.run([sys.executable, "-c", PROBE, "acme_runtime.vendor.client"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(package / "client.py"), "[]"]

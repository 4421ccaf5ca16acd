"""``recovery_client/client.py`` stays one standard-library file a runtime can vendor
(issue 10: the async client lives in ``aclient.py`` so that it does): loaded from its
path alone, outside the package (as ``bench/bench_http.py`` loads it), it imports
neither Django nor httpx nor anything of the project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import recovery_client.client

PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("vendored_client", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
store = module.HttpCheckpointStore("http://127.0.0.1:9", "acme", "t", retries=0)
assert store.max_body_bytes == 1024 * 1024
third_party = sorted(name for name in sys.modules
                     if name.split(".")[0] in ("django", "httpx", "checkpoints", "recovery",
                                               "recovery_client"))
print(third_party)
"""


def test_client_py_loads_alone_with_the_standard_library_only(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE, Path(recovery_client.client.__file__)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

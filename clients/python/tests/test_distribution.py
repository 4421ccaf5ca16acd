"""The distribution ``recovery-client`` installs no Django (issue 18, item 3): its own
requirements never name it, nothing it pulls in (extras ``langgraph`` and ``async``, as
installed here) does, and its wheel alone, in an empty virtual environment, imports the
client and the protocol without importing Django.

Offline: the wheel is built with ``--no-build-isolation`` and installed with
``--no-index --no-deps``; the closure is read from the installed distributions'
metadata (``importlib.metadata``)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parents[1]  # clients/python
FORBIDDEN = {"django", "djangorestframework"}
EXTRAS = ("langgraph", "async")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools builds in the source tree (build/, *.egg-info), and
    # a stale build/ could put a module that is gone into the wheel.
    source = out / "src"
    shutil.copytree(HERE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "tests"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", str(source), "-w", str(out)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("recovery_client-*.whl")
    return built


def metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(z.read(name).decode("utf-8"))


def test_the_wheel_holds_the_sdk_and_nothing_of_the_server(wheel):
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        modules = {n for n in z.namelist() if n.startswith("recovery_client/")}
    assert tops == {"recovery_client", wheel.name.split("-py3")[0] + ".dist-info"}
    assert {f"recovery_client/{m}.py" for m in ("__init__", "core", "client", "aclient",
                                                  "_saverwire", "langgraph", "effects",
                                                  "protocol")} <= modules


def test_its_requirements_never_name_django(wheel):
    meta = metadata(wheel)
    assert meta["Name"] == "recovery-client"
    assert set(meta.get_all("Provides-Extra")) >= set(EXTRAS)
    named = {canonicalize_name(Requirement(r).name) for r in meta.get_all("Requires-Dist")}
    assert named, "the extras name their requirements"
    assert not named & FORBIDDEN, named


def closure(requirements: list[Requirement], extras: set[str]) -> tuple[set[str], set[str]]:
    """Names of the distributions ``requirements`` (markers evaluated for ``extras``)
    pull in, transitively, over the installed distributions' metadata; and those that
    are required but not installed here."""
    seen: set[str] = set()
    missing: set[str] = set()
    todo = [(r, extras) for r in requirements]
    while todo:
        req, wanted = todo.pop()
        if req.marker is not None and not any(
                req.marker.evaluate({"extra": extra}) for extra in (wanted or {""})):
            continue
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.add(name)
            continue
        todo.extend((Requirement(r), set(req.extras)) for r in dist.requires or [])
    return {k.split("[")[0] for k in seen} - missing, missing


def test_nothing_it_pulls_in_is_django(wheel):
    requirements = [Requirement(r) for r in metadata(wheel).get_all("Requires-Dist")]
    names, missing = closure(requirements, set(EXTRAS))
    assert {"httpx", "langgraph-checkpoint", "langchain-core"} <= names, names
    assert not missing, f"required but not installed here, so not checked: {missing}"
    assert not names & FORBIDDEN, sorted(names)


def test_the_wheel_alone_imports_without_django(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
         "--no-deps", "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = ("import recovery_client.client, recovery_client.effects, recovery_client.protocol,"
             " sys; assert not any(m.split('.')[0] == 'django' for m in sys.modules); "
             "print(recovery_client.client.__file__)")
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: only the venv's own packages
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(venv)), done.stdout
    done = subprocess.run([str(python), "-c", "import django"], capture_output=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode != 0, "the fresh environment must not see Django at all"

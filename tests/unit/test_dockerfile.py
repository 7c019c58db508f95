"""The Dockerfile, checked without a container engine (none exists on these machines).

What a build would need is checked statically: every file the Dockerfile copies from the
context exists and passes .dockerignore; both stages use the slim Python 3.11 base; wheels
are built with the pinned constraints; the final image carries libvirt's client library
only, runs as a non-root user, has the OCI labels, and its entrypoint (`capl manager`)
resolves to code that imports and parses its flags.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import capl
from capl.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
BASE = "python:3.11-slim-bookworm"


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with line continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=image, name=name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may come before FROM, not {keyword}"
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile() -> list[Stage]:
    _, stages = parse_dockerfile((REPO / "Dockerfile").read_text())
    return stages


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (negated, regex) in order (Docker's pattern syntax, ** included)."""
    patterns = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(glob):
            if glob.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif glob.startswith("**", i):
                regex += ".*"
                i += 2
            elif glob[i] == "*":
                regex += "[^/]*"
                i += 1
            elif glob[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(glob[i])
                i += 1
        patterns.append((negated, re.compile(regex + "$")))
    return patterns


def in_context(path: str) -> bool:
    """Whether the build context includes `path` (a pattern matching a parent counts)."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negated, pattern in ignore_patterns():
        if any(pattern.match(candidate) for candidate in candidates):
            included = negated
    return included


def context_copies(stages: list[Stage]) -> list[str]:
    sources = []
    for stage in stages:
        for args in stage.all("COPY") + stage.all("ADD"):
            words = shlex.split(args)
            if any(w.startswith("--from") for w in words):
                continue
            words = [w for w in words if not w.startswith("--")]
            sources += words[:-1]
    return sources


def test_both_stages_use_the_slim_python_311_base(dockerfile: list[Stage]) -> None:
    assert len(dockerfile) == 2
    assert [s.image for s in dockerfile] == [BASE, BASE]
    assert dockerfile[0].name == "builder"


def test_every_copied_file_exists_and_is_in_the_build_context(dockerfile: list[Stage]) -> None:
    sources = context_copies(dockerfile)
    assert {"pyproject.toml", "constraints.txt", "README.md", "capl"} <= set(sources)
    for source in sources:
        path = REPO / source
        assert path.exists(), f"the Dockerfile copies {source}, which does not exist"
        assert in_context(source), f".dockerignore excludes {source}"
        if path.is_dir():
            for file in path.rglob("*.py"):
                relative = file.relative_to(REPO).as_posix()
                assert in_context(relative), f".dockerignore excludes {relative}"
    # and what must stay out of the context does
    for private in (
        ".git/config",
        ".venv/bin/python",
        "tests/conftest.py",
        "out/x",
        "hack/x",
        "capl.egg-info/PKG-INFO",
    ):
        assert not in_context(private), private
    assert not in_context("capl/__pycache__/cli.cpython-311.pyc")


def test_wheels_are_built_with_the_pinned_constraints(dockerfile: list[Stage]) -> None:
    builder = dockerfile[0]
    (wheel,) = [run for run in builder.all("RUN") if "pip wheel" in run]
    assert "--constraint constraints.txt" in wheel or "-c constraints.txt" in wheel
    apt = " ".join(run for run in builder.all("RUN") if "apt-get install" in run)
    for package in ("libvirt-dev", "pkg-config", "gcc"):
        assert package in apt.split()
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        assert re.sub(r"[-_.]+", "-", name.lower()) in pins, f"{name} is not pinned"
    assert "libvirt-python" in pins


def test_final_image_has_the_libvirt_client_only(dockerfile: list[Stage]) -> None:
    final = dockerfile[-1]
    apt = " ".join(run for run in final.all("RUN") if "apt-get install" in run).split()
    assert "libvirt0" in apt
    assert not [p for p in apt if p.startswith(("libvirt-daemon", "libvirt-dev", "gcc"))]
    install = " ".join(final.all("RUN"))
    assert "--no-index" in install  # only the builder's wheels, nothing fetched at this stage
    assert not final.all("COPY"), "the wheels are bind-mounted, never a layer of the image"


def test_runs_as_a_non_root_user(dockerfile: list[Stage]) -> None:
    final = dockerfile[-1]
    user = final.all("USER")[-1]
    uid = user.split(":")[0]
    assert uid.isdigit(), "numeric, so runAsNonRoot can verify it"
    assert int(uid) != 0
    assert uid == "65532"  # config/manager/manager.yaml runs as 65532
    assert any("--uid 65532" in run for run in final.all("RUN"))


def test_entrypoint_is_capl_manager_and_its_code_imports(
    dockerfile: list[Stage], capsys: pytest.CaptureFixture[str]
) -> None:
    (entrypoint,) = dockerfile[-1].all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["capl", "manager"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["capl"].partition(":")
    assert (module, function) == ("capl.cli", "main")
    assert callable(getattr(importlib.import_module(module), function))
    assert callable(importlib.import_module("capl.manager").run_from_args)
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["manager", "--help"])
    assert done.value.code == 0
    assert "--leader-elect" in capsys.readouterr().out


def test_labels_and_no_secrets(dockerfile: list[Stage]) -> None:
    final = dockerfile[-1]
    labels = " ".join(final.all("LABEL"))
    for key in ("title", "source", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    args = dict(a.partition("=")[::2] for a in final.all("ARG"))
    assert args["VERSION"] == capl.__version__
    license_ = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    assert f'org.opencontainers.image.licenses="{license_}"' in labels
    names = " ".join(final.all("ENV") + final.all("ARG") + dockerfile[0].all("ARG")).upper()
    for word in ("TOKEN", "PASSWORD", "SECRET", "PRIVATE", "KUBECONFIG"):
        assert word not in names
    first_pattern = next(
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert first_pattern == "*", ".dockerignore is an allowlist"

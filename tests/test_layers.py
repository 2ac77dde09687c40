"""The house's floors, as the README's layout draws them: a package imports only its own modules and the packages
of the floors below it (an import inside a function counts too), and the models never import Ray."""

from __future__ import annotations

import ast
import os
import subprocess

from tests.conftest import REPO

# Lowest floor first. Packages of one floor do not import each other.
FLOORS = (
    ("runtime",),
    ("qa_models",),
    ("crawl",),
    ("pipelines",),
    ("training", "infra"),
    ("inference", "experiments"),
    ("jobs", "bench"),
)
FLOOR_OF = {package: level for level, packages in enumerate(FLOORS) for package in packages}


def _imports(package: str) -> list[tuple[str, int, str]]:
    """(file, line, module) of every absolute import in `package`'s modules, at any depth."""
    found = []
    for folder, _, names in os.walk(os.path.join(REPO, package)):
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules = [node.module]
                else:
                    continue
                found += [(os.path.relpath(path, REPO), node.lineno, module) for module in modules]
    return found


def test_every_project_package_has_a_floor():
    # the folders of the Python files git tracks: a working tree also holds untracked code (rerun.py's extracted
    # commits under out/, a build/ of pip)
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    packages = {path.split("/")[0] for path in tracked.stdout.split() if "/" in path} - {"tests"}
    assert packages == set(FLOOR_OF), "give a new package its floor in FLOORS (and the README's layout)"


def test_no_package_imports_one_on_its_own_floor_or_above():
    upward = [
        f"{path}:{line} imports {module}"
        for package, level in FLOOR_OF.items()
        for path, line, module in _imports(package)
        if module.split(".")[0] in FLOOR_OF
        and module.split(".")[0] != package
        and FLOOR_OF[module.split(".")[0]] >= level
    ]
    assert upward == []


def test_the_models_never_import_ray():
    assert [f"{path}:{line}" for path, line, module in _imports("qa_models") if module.split(".")[0] == "ray"] == []

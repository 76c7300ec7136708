"""scripts/check_layering.py: the tree has no import cycle and no import up the layering
(experiments -> sim -> costmodel; inside sim, its folders in order), and the checker finds both
in a package made to have them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_layering.py"


@pytest.fixture(scope="module")
def layering():
    spec = importlib.util.spec_from_file_location("check_layering", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_the_tree_has_no_cycle_and_no_upward_import(layering):
    report = layering.analyse(ROOT)
    assert report.cycles == []
    assert [f"{i.path}:{i.line} -> {i.target}" for i in report.upward] == []
    assert "costmodel.families.gemm" in report.modules and "sim" in report.modules
    # costmodel never imports sim or experiments, not even inside a function
    assert not [i for i in report.imports if i.importer.startswith("costmodel")
                and i.target.split(".")[0] in ("sim", "experiments")]


def test_the_script_exits_zero_on_the_tree():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(a) import cycles among module-level imports: 0" in done.stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_an_upward_import_and_a_local_import_are_found(layering, tmp_path):
    _write(tmp_path, {
        "low/__init__.py": "",
        "low/a.py": "from low.b import f\n",
        "low/b.py": "import low.c\n\ndef f():\n    from low import a  # function-local: listed, not a cycle edge\n",
        "low/c.py": "from . import a\nfrom high.top import g\n",  # relative import closes a -> b -> c -> a
        "low/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from high import top\n",
        "high/__init__.py": "",
        "high/top.py": "from low.a import f\n\ndef g():\n    pass\n",
    })
    report = layering.analyse(tmp_path, ("low", "high"))
    assert len(report.cycles) == 1
    cycle = report.cycles[0]
    assert cycle[0] == cycle[-1] and {"low.a", "low.b", "low.c", "high.top"} >= set(cycle) >= {"low.a", "low.b"}
    assert [(i.importer, i.target) for i in report.upward] == [("low.c", "high.top")]  # TYPE_CHECKING skipped
    assert [(i.importer, i.target, i.line) for i in report.local] == [("low.b", "low.a", 4)]
    assert not report.ok
    done = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path), "low", "high"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "FAILED" in done.stdout


def test_a_package_init_importing_its_modules_is_a_cycle_only_through_an_outsider(layering, tmp_path):
    # fams/__init__ imports fams.scatter, which imports fams.base: fine (fams is already loading)
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/fams/__init__.py": "from pkg.fams import scatter\n",
        "pkg/fams/base.py": "X = 1\n",
        "pkg/fams/scatter.py": "from pkg.fams.base import X\n",
        "pkg/measure/__init__.py": "",
        "pkg/measure/device.py": "from pkg.fams.base import X\n",
    })
    assert layering.analyse(tmp_path, ("pkg",)).cycles == []
    # measure.device imports fams.base, which first runs fams/__init__ -> fams.scatter ->
    # measure.device again: the circle costmodel had between its device module and the families
    _write(tmp_path, {"pkg/fams/scatter.py": "from pkg.fams.base import X\nfrom pkg.measure.device import X\n"})
    cycles = layering.analyse(tmp_path, ("pkg",)).cycles
    assert len(cycles) == 1 and set(cycles[0]) == {"pkg.fams", "pkg.fams.scatter", "pkg.measure.device"}


def test_sims_folders_import_only_folders_below_them(layering, tmp_path, monkeypatch):
    assert all((ROOT / "sim" / folder / "__init__.py").is_file() for folder in layering.SUBLAYERS["sim"])
    monkeypatch.setitem(layering.SUBLAYERS, "pkg", ("low", "high"))
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/api.py": "from pkg.high.b import g\n",  # the package's own modules rank above its folders
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "def f():\n    from pkg.high.b import g  # up, even function-local\n",
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from pkg.low.a import f\n\ndef g():\n    pass\n",
    })
    report = layering.analyse(tmp_path, ("pkg",))
    assert [(i.importer, i.target) for i in report.upward] == [("pkg.low.a", "pkg.high.b")]

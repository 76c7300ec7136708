"""Make a venv that has what the lent GPU machine's image has, and nothing more.

The image (see scripts/gpu_check.sh) has torch, numpy, scipy, scikit-learn, pandas, matplotlib,
rich, pytest, transformers and torch-geometric, but not hydra-core, omegaconf, antlr4 or this
project, and reaches no package index. The CPU dry run of gpu_check.sh runs in such a venv so
that it installs the carried wheels exactly as the GPU run will.

The new venv sees the packages of an existing environment (default: this interpreter's, the
project's .venv) through a folder of symbolic links named in a ``.pth`` file, minus the ones the
image lacks; its pip is configured with ``no-index`` (``<venv>/pip.conf``), so nothing can
come from an index.

    python scripts/image_venv.py .venv-image        # then .venv-image/bin/python
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

#: top-level names (modules, packages, their .dist-info) the image does not have
NOT_IN_IMAGE = re.compile(
    r"^(hydra|hydra_core|hydra_plugins|hydra_joblib_launcher|hydra_submitit_launcher|submitit|omegaconf|antlr4"
    r"|antlr4_python3_runtime|torch_scatter|moe_gnn_sim|__editable__.*moe_gnn_sim.*|_moe_gnn_sim.*)"
    r"([-.].*)?$",
    re.IGNORECASE,
)


def make_image_venv(target: Path, source_site: Path) -> Path:
    """Create ``target`` and return its python; idempotent (recreated each time)."""
    builder = venv.EnvBuilder(clear=True, with_pip=True, symlinks=True)
    builder.create(target)
    python = target / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    image = target / "image-site"
    image.mkdir()
    kept = skipped = 0
    for entry in sorted(source_site.iterdir()):
        name = entry.name
        if name.endswith(".pth") or name in ("__pycache__", "pip", "setuptools", "_distutils_hack") \
                or name.startswith(("pip-", "setuptools-")):
            continue
        if NOT_IN_IMAGE.match(name):
            skipped += 1
            continue
        os.symlink(entry, image / name)
        kept += 1
    (site / "image_packages.pth").write_text(f"{image}\n", encoding="utf-8")
    (target / "pip.conf").write_text("[global]\nno-index = true\n", encoding="utf-8")
    print(f"{target}: {kept} entries of {source_site} visible, {skipped} left out (not in the image); pip: no index")
    return python


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--source-site", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
                        help="site-packages whose packages the image venv sees (default: this interpreter's)")
    args = parser.parse_args(argv)
    make_image_venv(args.target.resolve(), args.source_site.resolve())


if __name__ == "__main__":
    main(sys.argv[1:])

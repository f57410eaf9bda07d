# The installed package: `cmake --install` of this build into a temporary
# prefix puts backplane into <prefix>/lib/pythonX.Y/site-packages, where it
# imports with PYTHONPATH alone, finds libbackplane through its RPATH and the
# installed backends.json through Registry.from_env (no BACKPLANE_CONFIG).
import os
import subprocess
import sys

import pytest


def test_import_after_install(tmp_path):
    build = os.environ.get("BACKPLANE_TEST_BUILD_DIR")
    cmake = os.environ.get("BACKPLANE_TEST_CMAKE")
    if not build or not cmake:
        pytest.skip("BACKPLANE_TEST_BUILD_DIR / BACKPLANE_TEST_CMAKE are not set (run through ctest)")
    prefix = tmp_path / "prefix"
    proc = subprocess.run([cmake, "--install", build, "--prefix", str(prefix)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert (site / "backplane" / "__init__.pyi").is_file() and (site / "backplane" / "py.typed").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("BACKPLANE_CONFIG", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    code = ("import backplane as bp; r = bp.default_registry(); "
            "print(bp.__file__); print(r.config_path); print((bp.ones([3]) + 1).tolist())")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    module, config, values = proc.stdout.splitlines()
    assert module.startswith(str(site))
    assert config == str(prefix / "share" / "backplane" / "backends.json")
    assert values == "[2.0, 2.0, 2.0]"

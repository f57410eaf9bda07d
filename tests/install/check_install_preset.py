#!/usr/bin/env python3
"""Checks that the `install` preset builds what an install holds and nothing else.

Usage: check_install_preset.py --source DIR

Configures the preset into a temporary folder (nothing is compiled) and reads the Ninja graph:
  - every file that `cmake --install` copies out of the build folder is either made by the
    configure step or an output of a build step that `cmake --build --preset install` runs, so
    the documented `cmake --install build-install` never stops at a target that was not built;
  - no source under tests/, bench/, examples/ or python/ is compiled by it.
Prints one line per finding ("FAIL: ...") and "ok: ..." when there is none.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

NOT_INSTALLED = ("tests", "bench", "examples", "python")


def ninja_unescape(text):
    return re.sub(r"\$(.)", r"\1", text)


def build_edges(build_ninja):
    """The outputs (explicit and implicit) of each `build` statement of build.ninja."""
    with open(build_ninja, encoding="utf-8") as f:
        text = f.read().replace("$\n", "")
    edges = []
    for line in text.split("\n"):
        if not line.startswith("build "):
            continue
        outputs = re.split(r"(?<!\$):", line[len("build "):], maxsplit=1)[0]
        words = [w for w in re.split(r"(?<!\$) ", outputs) if w and w != "|"]
        edges.append({ninja_unescape(w) for w in words})
    return edges


def reachable_from_all(build_dir):
    """The paths `ninja all` reaches (as build.ninja spells them), with every output of their steps."""
    graph = subprocess.run(["ninja", "-C", build_dir, "-t", "graph", "all"], check=True,
                           capture_output=True, text=True).stdout
    # A file node is drawn with its path as label; the build steps are ellipses labelled by rule.
    labels = set(re.findall(r'\[label="([^"]+)"\]\n', graph))
    built = set(labels)
    for outputs in build_edges(os.path.join(build_dir, "build.ninja")):
        if outputs & labels:
            built |= outputs
    return built


def installed_build_files(build_dir):
    """Every path under the build folder that a cmake_install.cmake copies."""
    paths = set()
    for script in glob.glob(os.path.join(build_dir, "**", "cmake_install.cmake"), recursive=True):
        with open(script, encoding="utf-8") as f:
            text = f.read()
        for files in re.findall(r"\bFILES\s+((?:\"[^\"]*\"\s*)+)", text):
            for path in re.findall(r"\"([^\"]*)\"", files):
                if path.startswith(build_dir + os.sep):
                    paths.add(path)
    return paths


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    args = parser.parse_args()
    source = os.path.realpath(args.source)
    findings = []
    build_dir = os.path.realpath(tempfile.mkdtemp(prefix="backplane-install-preset."))
    try:
        configure = subprocess.run(["cmake", "-S", source, "--preset", "install", "-B", build_dir],
                                   capture_output=True, text=True)
        if configure.returncode != 0:
            print(configure.stdout + configure.stderr)
            print(f"FAIL: `cmake --preset install` did not configure (exit {configure.returncode}); "
                  "its output is above")
            return 1
        built = {os.path.normpath(os.path.join(build_dir, p)) for p in reachable_from_all(build_dir)}
        installed = installed_build_files(build_dir)
        if not installed:
            findings.append("no cmake_install.cmake names a file of the build folder: the install rules "
                            "were not found where this check reads them (update it)")
        for path in sorted(installed):
            if path in built or os.path.exists(path):
                continue
            findings.append(f"`cmake --install` copies {os.path.relpath(path, build_dir)}, which "
                            "`cmake --build --preset install` does not build: build its target by "
                            "default (not EXCLUDE_FROM_ALL) or install it only when it is built")
        for path in sorted(built):
            if not path.startswith(source + os.sep):
                continue
            top = os.path.relpath(path, source).split(os.sep)[0]
            if top in NOT_INSTALLED:
                findings.append(f"`cmake --build --preset install` compiles {os.path.relpath(path, source)}, "
                                f"which no install holds: turn its folder ({top}/) off in the install preset")
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    for finding in findings:
        print("FAIL: " + finding)
    if findings:
        return 1
    print(f"ok: the install preset builds the {len(installed)} build files an install copies, and no "
          "test, benchmark, example or Python source")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks that README.md and docs/*.md say only what is true of the repository.

Usage:
  check_docs.py --source DIR paths
  check_docs.py --source DIR options --cli PATH/TO/backplane
  check_docs.py --source DIR env
  check_docs.py --source DIR ops

Each check prints one line per finding ("FILE:LINE: what is wrong") and exits 1 when it found
something, 0 otherwise. The rules:

paths    Every repository path the documents name exists:
         - every relative link target ([text](target)), resolved against the document's folder
           (URLs and mailto: are not paths); its #anchor, in a markdown file, is one of that file's
           headings as GitHub names them (an in-page [text](#anchor) too);
         - every code span (`...`) and every word of a fenced block that looks like a repository
           path: no spaces, a '/', and its first component is a top-level folder of the repository
           (a tracked one: `git ls-files`, so build folders such as build/ never count). These are
           relative to the repository root wherever the document is. `<name>` and `*` in them are
           wildcards (tools/backplane/cmd_<name>.cpp must match at least one file); a trailing
           ':LINE' or '#anchor' is dropped.
options  Every `backplane <subcommand> --option` (also build/bin/backplane, <prefix>/bin/backplane)
         in a code span or a fenced block is accepted by the CLI: the option is listed in the
         Options section of `backplane <subcommand> --help` (`backplane --help` for options before
         any subcommand). A command ends at the end of its line (a trailing backslash continues it),
         at `&&`, `||`, ` | `, `;`, at a shell comment, and at a standalone `--` (what follows is
         the launched program's command line). A word after `backplane` that is not a subcommand
         is an error when options follow it. In docs/cli.md, a code span that starts with `--`
         inside a section "## backplane <subcommand>" must be an option of that subcommand too,
         unless it is `--` itself.
env      Every BACKPLANE_* environment variable the documents name is read by the code, and every
         one the code reads is named in README.md or docs/:
         - the code's variables: string literals that are exactly a BACKPLANE_* name in the sources
           of core/, common/ (routines shared by the core, the plugins and the CLI), plugins/,
           tools/, conformance/ and python/ (C, C++, CUDA and Python). The code
           reads the environment only through such literals (std::getenv("BACKPLANE_..."), a
           helper such as env_limit("BACKPLANE_...") or a constant passed to getenv,
           os.environ["BACKPLANE_..."]); CMake variables reach the code as macros, never as a
           string literal that is exactly their name;
         - CMake variables are not environment variables: a name that the build defines
           (option(), set(), set_and_check(), find_path(), find_library(), find_program() in a
           CMakeLists.txt or *.cmake / *.cmake.in file, or a cacheVariables key in
           CMakePresets.json) or that the documents pass as -DNAME=... is left out, unless the code
           also reads it from the environment;
         - a name written with a trailing '_*' in the documents (BACKPLANE_TEST_*) names the family
           of variables with that prefix.
ops      docs/plugins.md's op table ("| value | `BP_OP_NAME` | `name` | ...") has one row per row of
         abi.h's BP_OP_TABLE, in value order, with the same value, enum name and plugin-op name.
"""

import argparse
import glob
import os
import re
import subprocess
import sys

SUBCOMMAND_RE = re.compile(r"^\s{2}(\w[\w-]*)\s{2,}")
CODE_SPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK_RE = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
ENV_NAME_RE = re.compile(r"\bBACKPLANE_[A-Z0-9_]*[A-Z0-9](?:_\*)?")


class Document:
    """A markdown file split into fenced blocks and the rest (with line numbers)."""

    def __init__(self, source, path):
        self.path = path
        self.rel = os.path.relpath(path, source)
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.fenced = []  # (line number, text) of each line inside a fence
        prose = []  # the other lines, fenced ones blanked so that offsets keep their line
        fence = None
        for number, line in enumerate(self.lines, 1):
            stripped = line.lstrip()
            if fence is None and re.match(r"(```+|~~~+)", stripped):
                fence = re.match(r"(```+|~~~+)", stripped).group(1)
                prose.append("")
            elif fence is not None and stripped.startswith(fence):
                fence = None
                prose.append("")
            elif fence is not None:
                self.fenced.append((number, line))
                prose.append("")
            else:
                prose.append(line)
        self.prose = "\n".join(prose)

    def line_of(self, offset):
        return self.prose.count("\n", 0, offset) + 1

    def code_spans(self):
        """(line, text) of each inline code span; a span never crosses a blank line."""
        for m in CODE_SPAN_RE.finditer(self.prose):
            text = m.group(2)
            if "\n\n" in text or re.search(r"\n\s*\n", text):
                continue
            yield self.line_of(m.start()), re.sub(r"\s*\n\s*", " ", text).strip()

    def links(self):
        for m in LINK_RE.finditer(self.prose):
            yield self.line_of(m.start()), m.group(1)

    def fenced_commands(self):
        """(line, text) of each logical line of the fenced blocks: a trailing backslash continues a
        line, and so does an indented line that starts with '[' or '-' (a synopsis wrapped by hand)."""
        logical = []  # [first line number, text, continues]
        previous = None
        for number, line in self.fenced:
            continues = previous is not None and previous == number - 1 and logical and (
                logical[-1][2] or re.match(r"\s+[\[-]", line))
            if continues:
                logical[-1][1] += " " + line.strip().rstrip("\\")
            else:
                logical.append([number, line.rstrip("\\") if line.rstrip().endswith("\\") else line, False])
            logical[-1][2] = line.rstrip().endswith("\\")
            previous = number
        return [(number, text) for number, text, _ in logical]


def documents(source):
    paths = [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md")))
    return [Document(source, p) for p in paths if os.path.isfile(p)]


def repository_files(source):
    """Tracked and new (not ignored) files, relative to the root; None outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", source, "ls-files", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [line for line in out.split("\n") if line]


def top_level_folders(source, files):
    if files is not None:
        return {f.split("/", 1)[0] for f in files if "/" in f}
    return {d for d in os.listdir(source)
            if os.path.isdir(os.path.join(source, d)) and not d.startswith("build") and d != ".git"}


# ---- paths ------------------------------------------------------------------

def path_exists(root, candidate):
    """Whether candidate (relative to root) exists; <name> and * are wildcards."""
    if re.search(r"<[^>]*>|\*", candidate):
        pattern = re.sub(r"<[^>]*>", "*", candidate)
        return bool(glob.glob(os.path.join(root, pattern)))
    return os.path.exists(os.path.join(root, candidate))


def repo_path_candidate(word, tops):
    word = word.strip().strip("\"'()[],;")
    word = re.sub(r"[.,:;]+$", "", word)
    word = re.sub(r"(:\d+(-\d+)?|#[\w-]*)$", "", word)
    if not word or " " in word or "/" not in word or "://" in word:
        return None
    if word.split("/", 1)[0] not in tops:
        return None
    if "$" in word or "{" in word:  # a shell or CMake expansion, not a path
        return None
    return word


def heading_anchors(path):
    """The anchors GitHub gives the headings of a markdown file: lower case, punctuation other than
    '-' and '_' dropped, spaces as '-', a repeated one suffixed -1, -2, ..."""
    anchors, seen = set(), {}
    fenced = {number for number, _ in Document(os.path.dirname(path), path).fenced}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f.read().split("\n"), 1):
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m or number in fenced:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def check_paths(source):
    files = repository_files(source)
    tops = top_level_folders(source, files)
    findings = []
    for doc in documents(source):
        folder = os.path.dirname(doc.path)
        for line, target in doc.links():
            if re.match(r"[a-zA-Z][\w+.-]*:", target) or target.startswith("#"):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(folder, path))
            if os.path.relpath(resolved, source).startswith(".."):
                continue
            if not os.path.exists(resolved):
                findings.append(f"{doc.rel}:{line}: the link target {target} does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in heading_anchors(resolved):
                findings.append(f"{doc.rel}:{line}: {os.path.relpath(resolved, source)} has no heading "
                                f"for the anchor #{anchor}")
        for line, target in doc.links():
            if target.startswith("#") and target[1:] not in heading_anchors(doc.path):
                findings.append(f"{doc.rel}:{line}: no heading of this document has the anchor {target}")
        for line, span in doc.code_spans():
            candidate = repo_path_candidate(span, tops)
            if candidate and not path_exists(source, candidate):
                findings.append(f"{doc.rel}:{line}: `{span}` names a repository path that does not exist")
        for line, text in doc.fenced_commands():
            for word in re.split(r"[\s=\"'`]+", text):
                candidate = repo_path_candidate(word, tops)
                if candidate and not path_exists(source, candidate):
                    findings.append(f"{doc.rel}:{line}: {candidate} (in a code block) does not exist")
    return findings


# ---- options ----------------------------------------------------------------

def cli_help(cli, args):
    out = subprocess.run([cli] + args + ["--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"FAIL: `{' '.join([cli] + args)} --help` exited with {out.returncode}:\n{out.stderr}")
    return out.stdout


def help_options(text):
    """The --names in the Options section of a CLI11 help text."""
    options, section = set(), None
    for line in text.split("\n"):
        if re.match(r"^\S.*:$", line):
            section = line
            continue
        if section == "Options:":
            m = re.match(r"^\s{2}(-\S+)", line)
            if m:
                options.update(n for n in m.group(1).split(",") if n.startswith("--"))
    return options


def help_subcommands(text):
    subs, section = set(), None
    for line in text.split("\n"):
        if re.match(r"^\S.*:$", line):
            section = line
            continue
        if section == "Subcommands:":
            m = SUBCOMMAND_RE.match(line)
            if m:
                subs.add(m.group(1))
    return subs


COMMAND_END_RE = re.compile(r"&&|\|\||\s\|\s|;|(?:^|\s)#")
INVOCATION_RE = re.compile(r"(?:^|(?<=[\s/`(\"']))backplane\s+(\S+)(.*)")


def invocations(text):
    """(subcommand word, [--options]) of each `backplane ...` command in text."""
    for chunk in COMMAND_END_RE.split(text):
        m = INVOCATION_RE.search(chunk)
        if not m:
            continue
        word, rest = m.group(1), m.group(2)
        words = [word] + rest.split()
        if "--" in words:
            words = words[:words.index("--")]
        options = []
        for w in words if word.lstrip("[").startswith("-") else words[1:]:
            for o in re.findall(r"(?:^|[\[|(])(--[a-zA-Z0-9][\w-]*)", w):
                options.append(o)
        yield word, options


def check_options(source, cli):
    top_help = cli_help(cli, [])
    subs = help_subcommands(top_help)
    if not subs:
        raise SystemExit(f"FAIL: no subcommands found in `{cli} --help`")
    accepted = {"": help_options(top_help)}
    for s in sorted(subs):
        sub_help = cli_help(cli, [s])
        accepted[s] = set(help_options(sub_help))
        # A group (`backplane trace merge|summary`): its subcommands' options count as its own.
        for nested in help_subcommands(sub_help):
            accepted[s] |= set(help_options(cli_help(cli, [s, nested])))
    findings = []

    def check(doc, line, text):
        for word, options in invocations(text):
            if word.lstrip("[").startswith("-"):
                sub = ""
            elif word in subs:
                sub = word
            else:
                if options and re.fullmatch(r"[a-z][a-z-]*", word):
                    findings.append(f"{doc.rel}:{line}: `backplane {word}` is not a subcommand "
                                    f"(they are: {', '.join(sorted(subs))})")
                continue
            for o in options:
                if o not in accepted[sub]:
                    where = f"backplane {sub} --help" if sub else "backplane --help"
                    findings.append(f"{doc.rel}:{line}: `backplane {sub + ' ' if sub else ''}{o}`: "
                                    f"{o} is not an option of `{where}`")

    for doc in documents(source):
        for line, span in doc.code_spans():
            check(doc, line, span)
        for line, text in doc.fenced_commands():
            check(doc, line, text)
        if doc.rel == os.path.join("docs", "cli.md"):
            section = None
            headings = [(m.start(), m.group(1)) for m in re.finditer(r"(?m)^##\s+(.*)$", doc.prose)]
            for m in CODE_SPAN_RE.finditer(doc.prose):
                section = None
                for start, title in headings:
                    if start < m.start():
                        section = title
                s = re.fullmatch(r"`?backplane (\w+)`?", section.strip()) if section else None
                span = m.group(2).strip()
                if not s or s.group(1) not in subs or not span.startswith("--") or span == "--":
                    continue
                option = re.match(r"--[a-zA-Z0-9][\w-]*", span)
                if option and option.group(0) not in accepted[s.group(1)]:
                    findings.append(f"{doc.rel}:{doc.line_of(m.start())}: `{span}` in the section "
                                    f"\"{section}\" is not an option of `backplane {s.group(1)} --help`")
    return findings


# ---- env ----------------------------------------------------------------------

CODE_EXTENSIONS = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".py", ".pyi")
CMAKE_DEFINITION_RE = re.compile(
    r"\b(?:option|set|set_and_check|find_path|find_library|find_program|find_file)\(\s*(BACKPLANE_[A-Z0-9_]+)\b")


def source_files(source, files, folders, predicate):
    if files is None:
        files = []
        for folder in folders:
            for root, _, names in os.walk(os.path.join(source, folder)):
                files += [os.path.relpath(os.path.join(root, n), source) for n in names]
    return [f for f in files if f.split("/", 1)[0] in folders and predicate(f)]


def read(source, rel):
    try:
        with open(os.path.join(source, rel), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def check_env(source):
    files = repository_files(source)
    code_names = {}  # name -> first file reading it
    for rel in source_files(source, files, {"core", "common", "plugins", "tools", "conformance", "python"},
                            lambda f: f.endswith(CODE_EXTENSIONS)):
        for name in re.findall(r"[\"'](BACKPLANE_[A-Z0-9_]+)[\"']", read(source, rel)):
            code_names.setdefault(name, rel)

    cmake_names = set()
    everything = files if files is not None else [os.path.relpath(os.path.join(r, n), source)
                                                  for r, _, ns in os.walk(source) for n in ns]
    for rel in everything:
        base = os.path.basename(rel)
        if base == "CMakeLists.txt" or base.endswith((".cmake", ".cmake.in")):
            cmake_names.update(CMAKE_DEFINITION_RE.findall(read(source, rel)))
        elif base == "CMakePresets.json":
            cmake_names.update(re.findall(r"\"(BACKPLANE_[A-Z0-9_]+)\"\s*:", read(source, rel)))

    doc_names = {}  # name -> first "file:line"
    for doc in documents(source):
        text = "\n".join(doc.lines)
        cmake_names.update(re.findall(r"-D(BACKPLANE_[A-Z0-9_]+)=", text))
        for number, line in enumerate(doc.lines, 1):
            for name in ENV_NAME_RE.findall(line):
                doc_names.setdefault(name, f"{doc.rel}:{number}")

    families = [n[:-1] for n in doc_names if n.endswith("_*")]
    findings = []
    for name, where in sorted(doc_names.items()):
        if name.endswith("_*"):
            if not any(c.startswith(name[:-1]) for c in code_names):
                findings.append(f"{where}: the documents name {name}, but the code reads no variable "
                                f"starting with {name[:-1]}")
        elif name not in code_names and name not in cmake_names:
            findings.append(f"{where}: the documents name the environment variable {name}, which the code "
                            "never reads (nor is it a CMake variable)")
    for name, rel in sorted(code_names.items()):
        if name not in doc_names and not any(name.startswith(f) for f in families):
            findings.append(f"{rel}: the code reads the environment variable {name}, which README.md and "
                            "docs/ never name")
    return findings


OP_ROW_RE = re.compile(r"X\((\w+), (\d+), (\w+),")
DOC_OP_ROW_RE = re.compile(r"^\| (\d+) \| `BP_OP_(\w+)` \| `(\w+)` \|")


def check_ops(source):
    """docs/plugins.md's op table lists exactly the ops of abi.h's BP_OP_TABLE,
    in order, with their values and names."""
    table = [(int(v), n, s) for n, v, s in OP_ROW_RE.findall(read(source, "include/backplane/abi.h"))]
    if not table:
        return ["include/backplane/abi.h: no BP_OP_TABLE rows found (X(NAME, value, name, ...))"]
    doc_rel = "docs/plugins.md"
    rows = []
    for number, line in enumerate(read(source, doc_rel).splitlines(), 1):
        m = DOC_OP_ROW_RE.match(line)
        if m:
            rows.append((number, (int(m.group(1)), m.group(2), m.group(3))))
    findings = []
    documented = {row for _, row in rows}
    for op in table:
        if op not in documented:
            findings.append(f"{doc_rel}: the op table has no row for {op[0]} BP_OP_{op[1]} `{op[2]}` "
                            "(abi.h's BP_OP_TABLE has it)")
    known = set(table)
    for number, row in rows:
        if row not in known:
            findings.append(f"{doc_rel}:{number}: op row {row[0]} BP_OP_{row[1]} `{row[2]}` is not in abi.h's "
                            "BP_OP_TABLE (value, name and plugin-op name must match a row)")
    if not findings and [row for _, row in rows] != table:
        findings.append(f"{doc_rel}: the op table's rows are not in BP_OP_TABLE's order (by value)")
    return findings


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="the repository root")
    parser.add_argument("--cli", help="the backplane executable (for the options check)")
    parser.add_argument("check", choices=["paths", "options", "env", "ops"])
    args = parser.parse_args()
    source = os.path.abspath(args.source)
    if args.check == "paths":
        findings = check_paths(source)
    elif args.check == "options":
        if not args.cli:
            parser.error("options needs --cli")
        findings = check_options(source, args.cli)
    elif args.check == "ops":
        findings = check_ops(source)
    else:
        findings = check_env(source)
    for f in findings:
        print(f)
    if findings:
        print(f"FAIL: {len(findings)} finding{'s' if len(findings) != 1 else ''} ({args.check})")
        return 1
    print(f"ok: README.md and docs/*.md ({args.check})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs are read as instructions: every command they give names options that exist, every link they give lands.

Fast (no worker, no model): part of ``make test-fast``."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.fast

# a value or key a reader fills in (NAME, DIR, <name>, ..., $VAR) is not checked
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\.\.\.|<|\$")


def tracked_markdown(docs_only: bool) -> list:
    files = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    paths = [REPO / f for f in files.stdout.split()]
    # CHANGELOG.md is history: its commands are those of their day
    return [p for p in paths if not docs_only or p.name == "README.md" or "docs" in p.relative_to(REPO).parts]


def doc_commands(text: str) -> list[tuple[str, str]]:
    """Every ``python -m MODULE ARGS`` a markdown text gives: in code blocks (continued lines joined) and inline."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        lines += [line for line in re.sub(r"\\\n\s*", " ", block).splitlines() if "python -m " in line]
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    lines += re.findall(r"`([^`\n]*python -m [^`\n]*)`", prose)
    found = []
    for line in lines:
        for part in re.split(r"&&|;|\|", line):
            match = re.search(r"python -m ([\w.]+)(.*)", part)
            # "python -m tools.<name>" is a pattern, and a command of shell variables ($C) is the shell's to read
            if match and not match[1].endswith(".") and "$" not in match[2]:
                found.append((match[1], match[2].split(" #")[0]))
    return found


def overrides(args: str) -> list[str]:
    """The Hydra overrides of a command's arguments, placeholders and sweeps' later values left out."""
    try:
        tokens = shlex.split(args)
    except ValueError:
        tokens = args.split()
    out = []
    for token in tokens:
        token = token.lstrip("[")
        if token.endswith("]") and "[" not in token:
            token = token[:-1]  # "[key=value]": an optional part of the command
        key, eq, value = token.partition("=")
        if token.startswith("-") or not eq or key.lstrip("+~").startswith("hydra"):
            continue
        if PLACEHOLDER.search(value) or PLACEHOLDER.search(key):
            continue
        if "," in value and not value.startswith("["):
            value = value.split(",")[0]  # a sweep: its first value stands for the others
        out.append(f"{key}={value}")
    return out


def config_name(module: str) -> str | None:
    path = REPO / f"{module.replace('.', '/')}.py"
    if module == "neuroshard_jax":
        path = REPO / "neuroshard_jax" / "__main__.py"
    match = re.search(r'config_name="(\w+)"', path.read_text()) if path.exists() else None
    return match[1] if match else None


def tool_source(module: str) -> str:
    """A tool's source and that of the tools it imports (their parsers are shared)."""
    text = (REPO / f"{module.replace('.', '/')}.py").read_text()
    for other in set(re.findall(r"^from (tools\.\w+) import", text, flags=re.M)):
        text += (REPO / f"{other.replace('.', '/')}.py").read_text()
    return text


def test_every_command_in_the_docs_names_a_module_and_options_that_exist():
    """Each ``python -m neuroshard_jax...`` command in README.md and docs/ composes with its own config (every
    key and config group it names exists); each ``python -m tools.X --option`` names a tool with that option."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    commands = [(path, *cmd) for path in tracked_markdown(docs_only=True) for cmd in doc_commands(path.read_text())]
    assert len(commands) > 200  # the docs give hundreds: the reading found them
    wrong, composed = [], {}
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="neuroshard_jax.conf", version_base="1.3"):
        for path, module, args in commands:
            where = f"{path.relative_to(REPO)}: python -m {module}{args.rstrip()}"
            if module.startswith("tools."):
                if not (REPO / f"{module.replace('.', '/')}.py").exists():
                    wrong.append(f"{where}: no such tool")
                    continue
                source = tool_source(module)
                wrong += [f"{where}: no {opt}" for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args)
                          if f'"{opt}"' not in source]  # fmt: skip
                continue
            if not module.startswith("neuroshard_jax"):
                continue
            parts = module.replace(".", "/")
            if not ((REPO / f"{parts}.py").exists() or (REPO / parts / "__main__.py").exists()):
                wrong.append(f"{where}: no such module")
                continue
            name = config_name(module)
            if name is None:
                continue  # a module without a config (the worker): its arguments are its own
            key = (name, tuple(overrides(args)))
            if key not in composed:  # a command given in several places is composed once
                try:
                    compose(config_name=name, overrides=list(key[1]))
                    composed[key] = None
                except Exception as err:  # noqa: BLE001 - every wrong command is listed, not the first
                    composed[key] = str(err).splitlines()[0][:160]
            if composed[key] is not None:
                wrong.append(f"{where}: {composed[key]}")
    assert not wrong, "\n".join(wrong)


def heading_slugs(text: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings (a repeated heading's later anchors get -1, -2, ...)."""
    slugs: dict[str, int] = {}
    out = set()
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    for heading in re.findall(r"^#+ (.+)$", body, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = slugs.get(slug, 0)
        out.add(slug if n == 0 else f"{slug}-{n}")
        slugs[slug] = n + 1
    return out


def test_every_link_in_the_docs_lands_on_a_file_and_heading_that_exist():
    wrong = []
    for path in tracked_markdown(docs_only=False):
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^()\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            landing = (path.parent / file).resolve() if file else path
            if not landing.exists():
                wrong.append(f"{path.relative_to(REPO)}: {target}: no such file")
            elif anchor and landing.suffix == ".md" and anchor not in heading_slugs(landing.read_text()):
                wrong.append(f"{path.relative_to(REPO)}: {target}: no such heading")
    assert not wrong, "\n".join(wrong)

"""What the Hydra entry points share: checking a command line before any work, and user-facing failures.

Every entry point runs as ``run_app(main, config_name, validate)``: the command line's group choices are
checked against ``conf/``, then the config is composed once per value of every override (each value of a
sweep too) and turned into the app's typed dataclasses by ``validate``, so a bad override (``seed=abc``,
``searcher.k=2.5``, ``searcher.nope=1``) is one ``error:`` line and exit 2 before anything runs. Hydra's own
multi-line messages (exit 1) never reach the user. The check composes through the Compose API and the run goes
through ``hydra.main``: Hydra's public entry points only, so that a Hydra upgrade cannot silently break a command
(``hydra.main`` composes the config again, under a second of a planner's start). ``setup_logging`` shows the
library's log records on stderr as the lines a user reads (``warning: ...``, progress lines as they are), whatever
Hydra does with the root logger.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from neuroshard_jax.core.config import nearest
from neuroshard_jax.core.environment import check_jax_environment
from neuroshard_jax.core.errors import UserError, first_line, os_error
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.folders import one_writer

CONFIG_GROUPS = ("searcher", "task", "cost_model", "experiment")
CONFIG_MODULE = "neuroshard_jax.conf"
LIBRARY_LOGGERS = ("neuroshard_jax", "searchers")  # the packages whose module loggers a command shows


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record comes (as logging's last resort), not the stream of
    the moment it was made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


class _UserLines(logging.Formatter):
    """A record as the line a user reads: ``warning: ...`` (``error: ...``) above INFO, an INFO record as it is."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return f"{record.levelname.lower()}: {line}" if record.levelno >= logging.WARNING else line


def setup_logging() -> None:
    """The library's INFO and WARNING records on stderr as plain lines (``_UserLines``), and not on Hydra's
    handlers of the root logger (its job log prints them on stdout, stamped). Called where a command starts
    (``run_app``) and in each job (``one_line_errors``: a launcher's worker process too); once is enough."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _Stderr) for h in logger.handlers):
            handler = _Stderr()
            handler.setFormatter(_UserLines())
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def fail(err: Exception) -> NoReturn:
    """Print a one-line error and exit with code 2 (no traceback: the input was wrong, not the code).

    Background threads' late complaints while the process ends are not shown (after a damaged checkpoint,
    orbax's pending read coroutines report a closed event loop at shutdown)."""
    sys.unraisablehook = lambda _: None  # before the line: nothing that comes after it is shown
    threading.excepthook = lambda _: None
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(2)


FINISHED = "plan.json"  # the main job's result: a folder holding it holds a finished run, whatever output= says


def finished(folder: Path, config: DictConfig) -> str | None:
    """The name of the finished result ``folder`` holds (the main job's ``plan.json``, or the run's ``output``
    file), or None."""
    output = OmegaConf.select(config, "output", default=None)
    names = [FINISHED] + ([output] if isinstance(output, str) and Path(output).name == output else [])
    return next((name for name in names if (folder / name).exists()), None)


class RunFolderLock(Callback):
    """One run per ``hydra.run.dir`` (conf/config.yaml's ``hydra.callbacks``): before Hydra writes the folder's
    ``.hydra/`` files, the run takes its writer lock (``folders.one_writer``) and holds it to the end, so a second run
    into the same folder (a script run twice, a sweep misconfigured) is refused in one line before it writes
    anything, and the folder's plan.json and ``.hydra/`` are one run's. A folder that holds a finished run (its
    ``output`` file) is refused the same way: a run stopped before it finished (``autotune``'s readings kept) may be
    started again into its folder. The folder's name is resolved once and kept
    (a ``${now:...}`` name would otherwise be read again by Hydra, a second later)."""

    def __init__(self) -> None:
        self._held: contextlib.ExitStack | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = OmegaConf.select(config, "hydra.run.dir")
        with open_dict(config):
            readonly = OmegaConf.is_readonly(config.hydra)
            OmegaConf.set_readonly(config.hydra, False)
            config.hydra.run.dir = folder
            OmegaConf.set_readonly(config.hydra, readonly)
        done = finished(Path(folder), config)  # before the lock: a refused run leaves the folder as it was
        if done:
            fail(
                UserError(
                    f"hydra.run.dir: {folder!r} holds a finished run ({done}), expected a new run folder (a run's "
                    "result is never overwritten: name another with hydra.run.dir=..., or remove that one)"
                )
            )
        self._held = contextlib.ExitStack()
        try:
            self._held.enter_context(one_writer(folder, "hydra.run.dir", "one run per run folder"))
        except UserError as err:
            fail(err)
        except OSError as err:
            fail(os_error(err, Path(folder), "making the run folder"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep into a folder whose jobs finished (a job folder holding its result) is refused before any job
        starts: its jobs' folders would be written again, one by one."""
        folder = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        jobs = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        done = next(((job, why) for job in jobs for why in [finished(job, config)] if why), None)
        if done:
            fail(
                UserError(
                    f"hydra.sweep.dir: {str(folder)!r} holds finished runs ({done[0].name}/{done[1]}), expected a new "
                    "sweep folder (a run's result is never overwritten: name another with hydra.sweep.dir=..., or "
                    "remove that one)"
                )
            )

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._held is not None:
            self._held.close()


def one_line_errors(main: Callable[[DictConfig], None]) -> Callable[[DictConfig], None]:
    """A Hydra main whose UserErrors and OS refusals (a full disk, a folder it may not write in) end in one
    ``error:`` line (``fail``), below ``@hydra.main``, which would print a traceback of anything else; the job's
    log lines on stderr (``setup_logging``)."""

    @functools.wraps(main)
    def run(cfg: DictConfig) -> None:
        setup_logging()
        try:
            check_jax_environment()
            main(cfg)
        except UserError as err:
            fail(err)
        except OSError as err:
            fail(os_error(err, err.filename or "a file", "using"))
        except KeyboardInterrupt:
            interrupted()

    return run


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT (128 + 2)


RESUME: list[str] = []  # what a command stopped now could be resumed by (``resumable``), said by ``interrupted``


def resumable(hint: str) -> None:
    """Say, if this command is stopped, how to resume it (``interrupted``'s line: the folder, the command)."""
    RESUME[:] = [hint]


def interrupted() -> NoReturn:
    """Ctrl-C: one line, exit 130, no traceback. Files are written whole or not at all (``files.write_json``), so a
    result interrupted before it was written is absent, not half-written; a run folder holds a finished run only when
    its result is there. Where the command kept what it measured (``resumable``), the line says how to resume."""
    sys.unraisablehook = lambda _: None
    threading.excepthook = lambda _: None
    kept = f"; {RESUME[0]}" if RESUME else ""
    print(f"interrupted: stopped before it finished (nothing half-written was kept){kept}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(INTERRUPTED)


def group_options(group: str) -> list[str]:
    """Names of the options of a config group (the YAML stems under conf/<group>/)."""
    folder = resources.files(CONFIG_MODULE) / group
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def check_group_overrides(argv: list[str]) -> None:
    """Reject ``searcher=nope`` before Hydra does (Hydra exits 1 with a multi-line message)."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key.lstrip("+~") not in CONFIG_GROUPS or value.startswith(("glob(", "choice(", "range(")):
            continue
        known = group_options(key.lstrip("+~"))
        for name in value.split(","):
            if name not in known:
                fail(UserError(f"{key.lstrip('+~')}: got {name!r}, expected one of {', '.join(known)}"))


def resolved(cfg: DictConfig) -> JSONDoc:
    """A composed config as plain, resolved containers (the input of ``typed``)."""
    return OmegaConf.to_container(cfg, resolve=True)


def _values(override: Override) -> list[str]:
    """The values a (sweep) override stands for, as override strings."""
    if isinstance(override.value(), Glob):
        group = override.get_key_element().lstrip("+~")
        return [f"{group}={name}" for name in override.value().filter(group_options(group))]
    if override.is_sweep_override():
        return [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
    return [override.input_line]


def _one_line(err: Exception) -> str:
    """Hydra's and OmegaConf's multi-line messages, cut to their first line and their cause's."""
    lines = [first_line(err)]
    if err.__cause__ is not None and str(err.__cause__).strip():
        lines.append(first_line(err.__cause__))
    return "; ".join(lines)


def check_command_line(config_name: str, argv: list[str], validate: Callable[[DictConfig], Any]) -> None:
    """Compose the config for every value of every override and ``validate`` it; fail in one line if any is bad.

    Hydra's own overrides (``hydra.job.chdir=abc``) are composed too, but not swept (a sweep of launchers is
    Hydra's). Flags other than -m / --multirun (``--help``, ``--cfg``, ...) are left to Hydra.
    """
    flags = [a for a in argv if a.startswith("-")]
    if any(f not in ("-m", "--multirun") for f in flags):
        return
    overrides = parsed_overrides([a for a in argv if not a.startswith("-")])
    fixed = [o.input_line for o in overrides if not o.is_sweep_override()]
    variants = [fixed]
    for o in overrides:
        if o.is_sweep_override() and not _is_hydra(o):
            variants.extend([*fixed, value] for value in _values(o))
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        for variant in variants:
            try:
                cfg = compose(config_name=config_name, overrides=variant)
            except Exception as err:  # a key that does not exist, a value Hydra cannot parse
                fail(UserError(_composition_error(config_name, variant, err)))
            try:
                validate(cfg)
            except UserError as err:
                fail(err)


def _composition_error(config_name: str, overrides: list[str], err: Exception) -> str:
    """One line for a failed composition; an unknown key names the keys its parent has."""
    for line in overrides:
        key = line.partition("=")[0]
        if f"'{key}'" in str(err) and "not in struct" in str(err.__cause__ or err):
            node = compose(config_name=config_name, overrides=[o for o in overrides if o != line])
            parts = key.lstrip("+~").split(".")
            for depth, part in enumerate(parts):  # the first part that is not there: ``sercher`` in sercher.k
                if not (isinstance(node, DictConfig) and part in node):
                    options = sorted(node) if isinstance(node, DictConfig) else []
                    return f"{'.'.join(parts[: depth + 1])}: unknown key {part!r}, {nearest(part, options)}"
                node = node[part]
    return f"{' '.join(overrides) or config_name}: {_one_line(err)}"


def _is_hydra(override: Override) -> bool:
    return override.get_key_element().lstrip("+~").startswith(("hydra.", "hydra/"))


def writable_folder(path: str | Path, key: str) -> None:
    """Fail in one line unless ``path`` is, or can be made as, a folder we can write in (checked on its nearest
    existing ancestor, so nothing is created here)."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        fail(UserError(f"{key}: {str(path)!r} is under the file {str(existing)!r}, expected a folder"))
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(UserError(f"{key}: cannot write in {str(existing)!r} (permission denied), expected a writable folder"))
    try:  # access() says yes to root everywhere, and /proc or a read-only mount say no only when asked to
        os.rmdir(tempfile.mkdtemp(prefix=".neuroshard-probe-", dir=existing))
    except OSError as err:
        reason = err.strerror or type(err).__name__
        fail(UserError(f"{key}: cannot make a folder in {str(existing)!r} ({reason}), expected a writable folder"))


def check_output_folder(argv: list[str]) -> None:
    """The run's (or the sweep's) output folder, checked writable before any work (Hydra makes it later and
    would fail with a traceback; a finished search would be lost)."""
    key = "hydra.sweep.dir" if any(a in ("-m", "--multirun") for a in argv) else "hydra.run.dir"
    given = [a.partition("=")[2] for a in argv if a.lstrip("+").startswith(f"{key}=")]
    writable_folder(given[-1] if given else ".", key)


def run_app(main: Callable[[], None], config_name: str, validate: Callable[[DictConfig], Any]) -> None:
    """Check the command line, then run the Hydra ``main``; the library's log lines on stderr (``setup_logging``)."""
    setup_logging()
    argv = sys.argv[1:]
    check_group_overrides(argv)
    try:
        check_command_line(config_name, argv, validate)
        check_output_folder(argv)
        main()
    except KeyboardInterrupt:  # while the command line is checked, or past the job's own handler
        interrupted()
    except SystemExit as done:
        if done.code != 2:
            raise
        # an expected failure, already said in one line (``fail``): end now, so that no background thread of a
        # library (orbax's readers after a damaged checkpoint) prints its late complaints while Python shuts down;
        # every output was closed as the error left its ``with`` blocks
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)


def parsed_overrides(args: list[str]) -> list[Override]:
    """The command line's overrides as Hydra parses them; one that does not parse fails in one line."""
    parser = OverridesParser.create()
    overrides = []
    for arg in args:
        try:
            overrides.extend(parser.parse_overrides([arg]))
        except Exception as err:  # Hydra's OverrideParseException and friends
            fail(UserError(f"{arg}: {_one_line(err)}, expected key=value"))
    return overrides

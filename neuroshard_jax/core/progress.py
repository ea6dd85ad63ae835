"""Progress, one way for every long call: bars through tqdm, step lines through logging.

A loop of many steps shows a bar (``progress_bar``: tqdm on stderr, hidden when the call's ``progress`` flag is
off). A call of a few long steps says one line per step (``progress_lines``: INFO records of the caller's module
logger); the commands print those on stderr as they are (``core.cli.setup_logging``), and a program that imports
the library sees them where its own logging sends INFO records. Nothing here prints to stdout."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from tqdm import tqdm


def progress_bar(iterable: Iterable | None = None, *, enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar on stderr over ``iterable`` (or updated by hand), shown only when ``enabled``; ``options`` are
    tqdm's (``desc``, ``total``, ``unit``, ...)."""
    return tqdm(iterable, disable=not enabled, **options)


def progress_lines(logger: logging.Logger, enabled: bool = True) -> Callable[[str], None]:
    """Line-per-step progress: each line one INFO record of ``logger``; nothing when not ``enabled``."""
    return logger.info if enabled else _quiet


def _quiet(line: str) -> None:
    """A step line nobody asked for."""

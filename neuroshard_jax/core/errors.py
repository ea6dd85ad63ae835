"""Errors that speak to the user: the CLI prints them on one line and exits with code 2."""

import errno


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (libraries' messages run to many lines), or its type's name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class UserError(Exception):
    """A bad input or an impossible request: names the field, the value and what was expected."""


class InfeasibleError(UserError):
    """The task cannot be placed within the devices' memory."""


class DamagedModel(UserError):
    """A model's saved state that cannot be restored (torn, garbled, or not the arrays saved with it); ``why``:
    the cause in a few words, for a warning that passes the model over."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why or message


class UntrainedFor(UserError):
    """A cost model asked to score a task at a batch size or precision its labels never ran."""


class PlanError(UserError):
    """A plan that breaks the rules (columns not tiled, memory exceeded, unknown device)."""


def os_error(err: BaseException, path, doing: str) -> UserError:
    """An OS refusal while ``doing`` something to ``path`` as one line: the path and the cause, "disk full" said
    as such (``Errno 28`` reads like a bug; orbax reports it as a ValueError quoting the OS)."""
    cause = (
        "disk full: no space left on device" if is_disk_full(err) else getattr(err, "strerror", None) or first_line(err)
    )
    return UserError(f"{doing} {str(path)!r} failed: {cause}; what was written before stays")


def is_disk_full(err: BaseException) -> bool:
    return getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(err)

"""Errors that speak to the user: the CLI prints them on one line and exits with code 2."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (libraries' messages run to many lines), or its type's name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class UserError(Exception):
    """A bad input or an impossible request: names the field, the value and what was expected."""


class InfeasibleError(UserError):
    """The task cannot be placed within the devices' memory."""


class PlanError(UserError):
    """A plan that breaks the rules (columns not tiled, memory exceeded, unknown device)."""

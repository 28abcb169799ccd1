"""The one base class of the errors a user can cause and fix."""


class UserError(Exception):
    """Bad input (a flag, config value, data row, checkpoint, model file) or a host that cannot
    provide what was asked (a sandbox, devices, a plan that fits). The message names the field,
    the numbers and what would work; an entry point prints it as one line and exits 2. Any
    other exception is a bug and keeps its traceback."""

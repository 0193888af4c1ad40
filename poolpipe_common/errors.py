"""The one exception type for bad user input (files, flags, specs): the CLI prints it on one line and exits 2."""


class InputError(ValueError):
    """Input that a user must fix; the message names the file or field and the cause."""

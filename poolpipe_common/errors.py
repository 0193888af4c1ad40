"""The one exception type for bad user input (files, flags, specs): the CLI prints it on one line and exits 2."""


class InputError(ValueError):
    """Input that a user must fix; the message names the file or field and the cause.

    Line breaks inside the message (a field name or value quoted from the user's file) are escaped, so that the
    error is always one line."""

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))

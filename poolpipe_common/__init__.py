"""The bottom layer every package may use: user-facing errors, document reading, tensor specs, ports."""

from importlib.metadata import PackageNotFoundError, version


def poolpipe_version() -> str:
    """The installed distribution's version (what `poolpipe --version` and the sidecar's metadata report)."""
    try:
        return version("poolpipe")
    except PackageNotFoundError:
        return "0+unknown"

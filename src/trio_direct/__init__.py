"""trio-direct: an OpenAI-compatible frontend on trio for stock SGLang engines."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trio-direct")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

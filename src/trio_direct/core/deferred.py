"""The one pattern every reader of a stream needs: deliver what arrived before a failure, then the failure."""

from __future__ import annotations

__all__ = ["DeferredError"]


class DeferredError:
    """An error that ends a sequence *after* the items that arrived ahead of it.

    A reader that finds a failure behind items it already took holds the failure here and returns
    the items; its next read raises it (`raise_held`). The first failure held wins.
    """

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def hold(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error

    def raise_held(self) -> None:
        """Raise the held error (once), if there is one."""
        error = self.error
        if error is not None:
            self.error = None
            raise error

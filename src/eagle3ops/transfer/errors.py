"""Errors of an image transfer: which are final and which a retry may fix (:class:`TransientTransferError`)."""

from __future__ import annotations


class TransferError(Exception):
    """A push failed; the message names the host, what failed and what to do."""


class TransientTransferError(TransferError):
    """A push failed in a way a retry may fix (connection dropped, stream broken or stalled)."""


class StreamStalled(TransientTransferError):
    """No byte moved on the stream for ``stall_s`` seconds; the stream was killed."""


class UnsafeArchive(TransferError):
    """A tar stream holds a member that would escape the extraction directory (absolute path, ``..``, a link
    pointing outside, a device node)."""


class LayerDigestMismatch(TransferError):
    """A layer's bytes do not hash to its diff id (local store corrupt or changed during the push)."""


class VerifyFailed(TransferError):
    """The host's engine does not hold the image with the local image id after the load."""

"""Sizes and waits of a push, in one place (bytes and seconds; defaults suit production)."""

from __future__ import annotations

#: Chunk size (bytes of layer tar) after which a push is cut into separately loaded, resumable pieces.
CHUNK_BYTES = 512 * 1024 * 1024
#: Seconds without a byte moving on the stream before it is declared stalled and killed.
STALL_S = 60.0
#: Archives smaller than this go over the open paramiko connection (no second SSH handshake).
SMALL_ARCHIVE_BYTES = 8 * 1024 * 1024
#: Pushes with fewer missing bytes than this never compress and never probe the link.
COMPRESS_MIN_BYTES = 128 * 1024 * 1024
#: Write size towards the SSH stream.
WRITE_CHUNK = 1024 * 1024

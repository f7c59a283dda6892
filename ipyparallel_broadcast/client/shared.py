"""Big reply buffers from engines of the client's host, read from shared
memory: each engine wrote them once into a segment named for this client
(``host.shm.share_reply``), and the relays carried the segment's name, not
the bytes. The client maps each segment copy-on-write and unlinks its name at
once; the memory goes back when the result is dropped."""

from __future__ import annotations

import errno

from ..host import shm
from ..wire.bundles import ReplyTable
from ..wire.protocol import nbytes


class SharedReplies:
    """What this client asks of engines, and the segments it gets back."""

    def __init__(self, threshold: int, here: str | None = None):
        self.prefix = shm.reply_prefix()
        self.mapped = 0  # segments read so far
        self.ask(threshold, shm.reply_identity() if here is None else here)

    def ask(self, threshold: int, here: str):
        """Set ``spec``, the request metadata's ``SHM_REPLY_KEY`` (None: replies
        as usual): buffers of ``threshold`` bytes or more, from engines ``here``
        ("" where nothing shared can be proven: never asked)."""
        self.threshold, self.here = threshold, here
        self.spec = [here, self.prefix, threshold] if here and threshold > 0 else None

    def fill(self, table: ReplyTable) -> dict[int, str]:
        """Map each shared engine reply's buffers in place; ``{k: why}`` for
        those that cannot be read (those engines fail, naming why)."""
        for k, content in table.shm:
            try:
                ref = shm.Reference.from_content(content)
                if not ref.name.startswith(self.prefix):  # never another's: mapping unlinks it
                    raise shm.ShmError(errno.EPERM, f"segment {ref.name} is not this client's")
                buffers = table.parts[k]
                if any(not 0 <= index < len(buffers) or nbytes(buffers[index]) for index, _, _ in ref.bufs):
                    raise shm.ShmError(errno.EINVAL, f"segment {ref.name} names a buffer the reply lacks")
                for index, view in shm.take_reply(ref):
                    buffers[index] = view
                self.mapped += 1
            except shm.ShmError as e:
                table.lost[k] = f"its reply's buffers in shared memory cannot be read ({e})"
        return table.lost

    def drop(self, table: ReplyTable):
        """A table no call will read (its call is gone): its segments go."""
        for _, content in table.shm:
            try:
                ref = shm.Reference.from_content(content)
            except shm.ShmError:
                continue
            if ref.name.startswith(self.prefix):
                shm.remove(ref.name)

    def close(self) -> list[str]:
        """The client closes: segments still named for it go (replies never read)."""
        return shm.drop_prefix(self.prefix)

"""The data plane's chunks, written once (``relay.dataplane.chunks``): the
arithmetic every transport uses, the cutting into parts and the assembly."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.relay.dataplane import chunks as C

pytestmark = pytest.mark.pure


@given(st.integers(0, 1 << 22), st.integers(256, 1 << 20))
def test_chunks_cover_a_value_exactly_once(nbytes, chunk):
    n = C.count(nbytes, chunk)
    sizes = [C.size(i, nbytes, chunk) for i in range(n)]
    assert sum(sizes) == nbytes and all(0 < s <= chunk for s in sizes)
    assert all(s == chunk for s in sizes[:-1])


@given(st.binary(max_size=4096), st.integers(1, 512))
def test_pieces_are_the_chunks_in_order(data, chunk):
    view = memoryview(data).cast("B")
    pieces = [C.piece(view, i, chunk) for i in range(C.count(len(data), chunk))]
    assert b"".join(bytes(p) for p in pieces) == data
    assert [p.nbytes for p in pieces] == [C.size(i, len(data), chunk) for i in range(len(pieces))]


@given(st.integers(0, 1 << 24), st.integers(1, 1 << 20), st.integers(1, 64))
def test_parts_tile_the_value_on_chunk_boundaries_as_evenly_as_whole_chunks_allow(nbytes, chunk, n):
    parts = C.parts(nbytes, chunk, n)
    assert len(parts) == n and parts[0][0] == 0 and parts[-1][1] == nbytes
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert all(lo % chunk == 0 or lo == nbytes for lo, _ in parts)
    counts = [C.count(hi - lo, chunk) for lo, hi in parts]
    assert max(counts) - min(counts) <= 1 and sum(counts) == C.count(nbytes, chunk)


@given(st.binary(min_size=1, max_size=2048), st.integers(1, 256), st.randoms(use_true_random=False))
def test_an_assembly_takes_chunks_in_any_order_and_each_once(data, chunk, rnd):
    n = C.count(len(data), chunk)
    order = list(range(n)) * 2  # every chunk twice
    rnd.shuffle(order)
    out, assembly = bytearray(len(data)), C.Assembly()
    view = memoryview(data).cast("B")
    taken = [assembly.put(i, out, i * chunk, C.piece(view, i, chunk)) for i in order]
    assert bytes(out) == data and len(assembly) == n and assembly.duplicates == n
    assert sum(taken) == n and all(i in assembly for i in range(n))


def test_a_chunk_message_is_checked_for_its_signature_type_and_digest():
    from jupyter_client.session import Session

    from ipyparallel_broadcast.wire import protocol as P

    codec = P.Codec(Session(key=b"k"))
    data = b"x" * 100
    body = codec.pack("ipb_chunk", dict(d=C.digest(data)), [data])[1:]
    assert C.checked(P.Codec(Session(key=b"k")), body, "ipb_chunk", "chunk")["content"]["d"] == C.digest(data)
    for bad, why in [
        (body[:5], "frames"),
        (body[:5] + [b"y" * 100], "digest"),
        (codec.pack("ipb_rchunk", dict(d=C.digest(data)), [data])[1:], "not a chunk"),
    ]:
        with pytest.raises(P.ProtocolError, match=why):
            C.checked(P.Codec(Session(key=b"k")), bad, "ipb_chunk", "chunk")
    with pytest.raises(P.ProtocolError, match="signature"):
        C.checked(P.Codec(Session(key=b"other")), body, "ipb_chunk", "chunk")

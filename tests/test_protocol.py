"""Frames survive a real pipe; large buffers travel out of band.

``payload.is_plain`` picks the C pickler for plain data: both picklers give the same values, so
no other path tells which one ran."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import pytest

from skyward.protocol import FrameReader, FrameWriter, Kind, dumps_payload, loads_payload


@contextlib.contextmanager
def pipe_pair() -> Iterator[tuple[FrameWriter, FrameReader]]:
    r, w = os.pipe()
    with os.fdopen(w, "wb") as out, os.fdopen(r, "rb") as into:
        yield FrameWriter(out), FrameReader(into)


def test_control_and_payload_round_trip() -> None:
    with pipe_pair() as (writer, reader):
        writer.send((Kind.TASK, 7, "name"), dumps_payload({"x": [1, 2, 3]}))
        writer.send((Kind.PING,))
        writer.close()
        control, parts = reader.recv()  # type: ignore[misc]
        assert control == (Kind.TASK, 7, "name")
        assert loads_payload(parts) == {"x": [1, 2, 3]}
        assert reader.recv() == ((Kind.PING,), [])
        assert reader.recv() is None


def test_large_array_goes_out_of_band_and_round_trips() -> None:
    np = pytest.importorskip("numpy")
    data = np.arange(2_000_000, dtype=np.float64)  # 16 MB
    payload = dumps_payload(data)
    assert len(payload.buffers) == 1 and len(payload.data) < 1024  # not copied into the pickle
    with pipe_pair() as (writer, reader):
        t = threading.Thread(target=lambda: (writer.send((Kind.RESULT, 1), payload), writer.close()))
        t.start()
        control, parts = reader.recv()  # type: ignore[misc]
        t.join()
    assert np.array_equal(loads_payload(parts), data)


def test_truncated_frame_is_an_error_not_a_clean_end() -> None:
    r, w = os.pipe()
    os.write(w, b"\x00\x00\x00\x01\x00\x00")
    os.close(w)
    with os.fdopen(r, "rb") as into, pytest.raises(EOFError):
        FrameReader(into).recv()


class _Trickle:
    """A stream that hands out at most ``step`` bytes per read, like a slow SSH channel."""

    def __init__(self, data: bytes, step: int):
        self._data = memoryview(data)
        self._step = step

    def readinto(self, b: memoryview) -> int:
        n = min(len(b), self._step, len(self._data))
        b[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def _frames_bytes(*frames: tuple[tuple, object]) -> bytes:
    import io

    out = io.BytesIO()
    writer = FrameWriter(out)
    for control, value in frames:
        writer.send(control, None if value is None else dumps_payload(value))
    return out.getvalue()


@pytest.mark.parametrize("step", [1, 3, 7, 4096, 1 << 20])
def test_frames_split_at_any_byte_boundary_are_read_whole(step: int) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB: larger than the reader's own buffer
    data = _frames_bytes(((Kind.PING,), None), ((Kind.RESULT, 1), {"a": big}), ((Kind.RESULT, 2), "small"))
    reader = FrameReader(_Trickle(data, step))
    assert reader.recv() == ((Kind.PING,), [])
    control, parts = reader.recv()  # type: ignore[misc]
    assert control == (Kind.RESULT, 1) and loads_payload(parts) == {"a": big}
    control, parts = reader.recv()  # type: ignore[misc]
    assert control == (Kind.RESULT, 2) and loads_payload(parts) == "small"
    assert reader.recv() is None and reader.buffered() == 0


def test_reader_reports_what_it_holds_so_a_poller_never_sleeps_on_a_buffered_frame() -> None:
    second = _frames_bytes(((Kind.HEARTBEAT,), None))
    data = _frames_bytes(((Kind.PING,), None)) + second
    reader = FrameReader(_Trickle(data, len(data)))  # both frames arrive in one read
    assert reader.recv() == ((Kind.PING,), [])
    assert reader.buffered() == len(second)  # the second frame is here already
    assert reader.recv() == ((Kind.HEARTBEAT,), [])
    assert reader.buffered() == 0


def test_a_frame_with_more_buffers_than_the_reader_buffer_holds_headers_for() -> None:
    np = pytest.importorskip("numpy")
    arrays = [np.full(64 * 1024 // 8, i, dtype=np.float64) for i in range(9000)]  # 9000 parts
    payload = dumps_payload(arrays)
    assert len(payload.buffers) == 9000
    import io

    out = io.BytesIO()
    FrameWriter(out).send((Kind.RESULT, 5), payload)
    control, parts = FrameReader(_Trickle(out.getvalue(), 1 << 16)).recv()  # type: ignore[misc]
    back = loads_payload(parts)
    assert control == (Kind.RESULT, 5) and len(back) == 9000
    assert all(a[0] == i for i, a in enumerate(back))


class _Local:
    """A class defined in a test module: the C pickler would store it by reference."""

    def __init__(self, v: int):
        self.v = v


def test_plain_data_takes_the_c_pickler_and_everything_else_cloudpickle() -> None:
    import pickle

    import cloudpickle

    from skyward.protocol.payload import is_plain

    np = pytest.importorskip("numpy")
    plain = [None, 1, 2.5, "s", b"b", (1, "x"), [1, [2, [3]]], {"k": (1, 2)}, np.arange(4), range(3)]
    for value in plain:
        assert is_plain(value), value
        back = pickle.loads(dumps_payload(value).data)
        assert repr(back) == repr(value)
    not_plain = [_Local(1), [_Local(2)], {"f": len}, (lambda: 1), np.array([object()]), [[[[1]]]],
                 list(range(100))]
    for value in not_plain:
        assert not is_plain(value), value
    # Anything else must go through cloudpickle: a local function, which the C pickler refuses
    # ("Can't pickle local object"), travels by value and runs after the round trip.
    def seven() -> int:
        return 7

    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps([seven], protocol=5)
    assert cloudpickle.loads(dumps_payload([seven, _Local(3)]).data)[0]() == 7
    assert loads_payload(dumps_payload({"f": seven}).parts)["f"]() == 7


def test_a_spinner_backs_off_after_a_poll_that_did_not_pay() -> None:
    from skyward.protocol import spinner

    r, w = os.pipe()
    try:
        spin = spinner(r, 0.001)
        if len(os.sched_getaffinity(0)) < 2:
            assert spin is None  # spinning is off on a single CPU
            return
        assert spin is not None
        assert spin() is False  # nothing came within the window
        os.write(w, b"x")
        assert spin() is False  # backing off: this wait does not poll at all
        assert spin() is True  # polls again and finds the byte
        assert spinner(r, 0) is None  # SKYWARD_SPIN_US=0
    finally:
        os.close(r)
        os.close(w)


def test_no_spinning_on_a_single_cpu() -> None:
    from skyward.protocol import spinner

    before = os.sched_getaffinity(0)
    r, w = os.pipe()
    try:
        os.sched_setaffinity(0, {min(before)})
        assert spinner(r, 0.001) is None
    finally:
        os.sched_setaffinity(0, before)
        os.close(r)
        os.close(w)


def test_a_quiet_reader_holds_little_memory() -> None:
    # A client keeps a reader per worker: a 1,000-node pool's readers held 64 MiB when each
    # began with its full buffer.
    import io
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        readers = [FrameReader(io.BytesIO(b"")) for _ in range(100)]
        held = (tracemalloc.get_traced_memory()[0] - before) / len(readers)
    finally:
        tracemalloc.stop()
    assert held < 8 * 1024, f"{held / 1024:.0f} KiB a reader"


@pytest.mark.parametrize("step", [5, 4096, 1 << 20])
def test_a_busy_reader_reads_bursts_of_small_frames_and_control_parts_larger_than_it_began_with(step: int) -> None:
    small = [((Kind.RESULT, k), None) for k in range(3000)]  # a burst: reads fill the buffer
    wide = ((Kind.OUTPUT, 1, "stdout", "x" * 20_000, False), None)  # a control part of 20 KB
    data = _frames_bytes(small[0], wide, *small[1:], wide)
    reader = FrameReader(_Trickle(data, step))
    got = [reader.recv() for _ in range(len(small) + 2)]
    assert got[0] == ((Kind.RESULT, 0), []) and got[1] == (wide[0], []) and got[-1] == (wide[0], [])
    assert [frame[0][1] for frame in got[2:-1]] == list(range(1, 3000))  # type: ignore[index]
    assert reader.recv() is None

"""Frames survive a real pipe; large buffers travel out of band."""

from __future__ import annotations

import os
import threading

import pytest

from skyward.protocol import FrameReader, FrameWriter, Kind, dumps_payload, loads_payload


def pipe_pair() -> tuple[FrameWriter, FrameReader]:
    r, w = os.pipe()
    return FrameWriter(os.fdopen(w, "wb")), FrameReader(os.fdopen(r, "rb"))


def test_control_and_payload_round_trip() -> None:
    writer, reader = pipe_pair()
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
    writer, reader = pipe_pair()
    t = threading.Thread(target=lambda: (writer.send((Kind.RESULT, 1), payload), writer.close()))
    t.start()
    control, parts = reader.recv()  # type: ignore[misc]
    t.join()
    assert np.array_equal(loads_payload(parts), data)


def test_truncated_frame_is_an_error_not_a_clean_end() -> None:
    r, w = os.pipe()
    os.write(w, b"\x00\x00\x00\x01\x00\x00")
    os.close(w)
    with pytest.raises(EOFError):
        FrameReader(os.fdopen(r, "rb")).recv()

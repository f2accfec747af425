"""The framed protocol spoken between the client and a worker over one byte stream.

* :mod:`~skyward.protocol.frames`: the message kinds (:class:`Kind`, every frame's layout),
  the frame format, :class:`FrameWriter` and :class:`FrameReader`, and the wire's limits
  (:data:`MAX_LINE`).
* :mod:`~skyward.protocol.payload`: what a frame carries besides its control message: a
  pickle and its out-of-band buffers (:class:`Payload`), made once per broadcast.
* :mod:`~skyward.protocol.spin`: how a reader that expects a frame soon polls before it
  sleeps (:func:`spinner`).

Both ends import it: it loads nothing of the client's (no rich, no paramiko).
"""

from skyward.protocol.frames import MAX_LINE, FrameReader, FrameWriter, Kind, cut_marker
from skyward.protocol.payload import Payload, dumps_by_value, dumps_payload, loads_payload
from skyward.protocol.spin import SPIN_ENV, spin_from_env, spinner

__all__ = ["MAX_LINE", "SPIN_ENV", "FrameReader", "FrameWriter", "Kind", "Payload", "cut_marker", "dumps_by_value",
           "dumps_payload", "loads_payload", "spin_from_env", "spinner"]

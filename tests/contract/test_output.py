"""What a task prints reaches the client as TaskOutput events from its node; silencing holds."""

from __future__ import annotations

import sys

import skyward as sky
from tests.contract.conftest import Output


@sky.compute
def chatty(tag: str, lines: int) -> int:
    node = sky.instance_info().node
    for i in range(lines):
        print(f"{tag} {node} line {i}")
    print(f"{tag} {node} on stderr", file=sys.stderr)
    return node


@sky.compute
@sky.stdout(only="head")
def head_speaks(tag: str) -> int:
    node = sky.instance_info().node
    print(f"{tag} {node} says")
    return node


@sky.compute
@sky.silent
def hushed(tag: str) -> int:
    node = sky.instance_info().node
    print(f"{tag} {node} says")
    print(f"{tag} {node} on stderr", file=sys.stderr)
    return node


def test_printed_lines_arrive_as_events_from_their_node_before_the_result(pool: sky.ComputePool, output: Output,
                                                                          tag: str) -> None:
    assert chatty(tag, 3) @ pool == [0, 1]
    # every line is there once the result is: no waiting
    assert sorted(output.lines(tag)) == [(node, f"{tag} {node} line {i}") for node in (0, 1) for i in range(3)]
    for node in (0, 1):  # each node's lines in the order printed
        assert [line for n, line in output.lines(tag) if n == node] == [f"{tag} {node} line {i}" for i in range(3)]
    assert sorted(output.lines(tag, stream="stderr")) == [(0, f"{tag} 0 on stderr"), (1, f"{tag} 1 on stderr")]
    assert all(e.task_id is not None for e in output.events if tag in e.line)


def test_output_printed_during_a_blocking_call_arrives_before_it_returns(pool: sky.ComputePool, output: Output,
                                                                         tag: str) -> None:
    node = chatty(tag, 20) >> pool
    assert output.lines(tag) == [(node, f"{tag} {node} line {i}") for i in range(20)]


def test_stdout_only_head_silences_the_other_nodes_on_a_broadcast(pool: sky.ComputePool, output: Output,
                                                                  tag: str) -> None:
    assert head_speaks(tag) @ pool == [0, 1]
    chatty(f"{tag}-after", 1) @ pool  # its lines come after any of head_speaks' from each node
    assert output.lines(f"{tag}-after") != []
    assert output.lines(f"{tag} ") == [(0, f"{tag} 0 says")]


def test_a_silent_task_prints_nothing_on_any_node(pool: sky.ComputePool, output: Output, tag: str) -> None:
    assert hushed(tag) @ pool == [0, 1]
    chatty(f"{tag}-after", 1) @ pool
    assert sorted(output.lines(f"{tag}-after")) == [(0, f"{tag}-after 0 line 0"), (1, f"{tag}-after 1 line 0")]
    assert output.lines(f"{tag} ") == [] and output.lines(f"{tag} ", stream="stderr") == []


@sky.compute
def describe_streams(tag: str) -> dict:
    import io
    import os

    described = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        fd = stream.fileno()
        os.fstat(fd)  # a descriptor that is open
        described[name] = {
            "text": isinstance(stream, io.TextIOBase), "closed": stream.closed, "encoding": stream.encoding,
            "isatty": stream.isatty(), "fd": fd, "writable": stream.writable(), "readable": stream.readable(),
            "buffer": isinstance(stream.buffer, io.BufferedIOBase),
        }
        stream.buffer.write(f"{tag} {name} via buffer \u00e9".encode()[:-1])  # a character split across writes
        stream.buffer.write(f"{tag} {name} via buffer \u00e9".encode()[-1:] + b"\n")
        stream.flush()
    return described


def test_a_tasks_stdout_and_stderr_are_complete_text_files(pool: sky.ComputePool, output: Output, tag: str) -> None:
    described = describe_streams(tag) >> pool
    for name, fd in (("stdout", 1), ("stderr", 2)):
        assert described[name] == {"text": True, "closed": False, "encoding": "utf-8", "isatty": False, "fd": fd,
                                   "writable": True, "readable": False, "buffer": True}
        assert [line for _, line in output.lines(tag, stream=name)] == [f"{tag} {name} via buffer \u00e9"]


#: The longest piece of a line a task's output reaches the client in (docs/runtime.md).
MAX_LINE = 64 * 1024


@sky.compute
def prints_a_long_line(tag: str, length: int) -> int:
    print(tag + "x" * length)  # one write
    sys.stdout.write(tag + "-pieces ")
    for _ in range(length // 1000):  # a line of many writes
        sys.stdout.write("y" * 1000)
    print()
    print(tag + " after")
    return length


def whole_lines(events: list, stream: str = "stdout") -> list[tuple[int, str]]:
    """The lines of ``events`` (TaskOutput) with their pieces joined, as a terminal shows them."""
    lines: list[tuple[int, str]] = []
    going_on: dict[tuple, list[str]] = {}
    for e in events:
        if e.stream != stream:
            continue
        key = (e.node, e.task_id)
        going_on.setdefault(key, []).append(e.line)
        if not e.more:
            lines.append((e.node, "".join(going_on.pop(key))))
    return lines


def test_a_very_long_line_arrives_whole_in_pieces_none_longer_than_the_bound(pool: sky.ComputePool,
                                                                             output: Output, tag: str) -> None:
    length = 10 * MAX_LINE
    prints_a_long_line(tag, length) >> pool
    events = output.snapshot()
    mine = [line for _, line in whole_lines(events) if line.startswith(tag)]
    assert mine == [tag + "x" * length, tag + "-pieces " + "y" * (length // 1000 * 1000), tag + " after"]
    assert max(len(e.line) for e in events) <= MAX_LINE  # never a whole huge line in memory
    assert sum(1 for e in events if e.more) >= length // MAX_LINE


@sky.compute
def writes_a_long_line_to_descriptor_2(tag: str, length: int) -> int:
    import os

    os.write(2, (tag + "z" * length + "\n").encode())  # past Python: as C code or a subprocess would
    return length


def test_a_very_long_line_on_descriptor_2_is_cut_on_the_client_saying_how_much(pool: sky.ComputePool,
                                                                                tag: str) -> None:
    import threading

    from skyward import events as ev

    logs: list[str] = []
    arrived = threading.Event()

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.NodeLog) and tag in event.line:
            logs.append(event.line)
            arrived.set()

    unsubscribe = pool.subscribe(on_event)
    try:
        length = 10 * MAX_LINE
        writes_a_long_line_to_descriptor_2(tag, length) >> pool
        assert arrived.wait(10), "the line never reached the node's log"
    finally:
        unsubscribe()
    assert logs == [(tag + "z" * length)[:MAX_LINE] + f" [... {len(tag) + length - MAX_LINE} bytes cut]"]

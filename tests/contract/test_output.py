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

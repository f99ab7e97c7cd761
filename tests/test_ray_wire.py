"""The bytes a byte-carrying transport (the Ray one) sends: ``WireEncoder`` on the client,
``WireDecoder`` on the node, and ``checks.with_signal``, which lets the node check a spec
it receives again and again only once. No Ray needed."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shellseam import AbortController, LocalShellExecutor, ShellError, ShellExecRequest
from shellseam.checks import check_spec, with_signal
from shellseam.ray.protocol import (
    CallRef,
    ExecConfig,
    Heartbeat,
    ReadCall,
    RunCall,
    WireDecoder,
    WireEncoder,
    wire_spec,
)
from shellseam.types import ShellExecSpec

EX = LocalShellExecutor(cwd="/tmp")
CONFIG = ExecConfig(None, (("cwd", "/tmp"),))

ids = st.text(min_size=1, max_size=40)
# What resolve accepts: no NUL, no lone surrogates.
chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")
commands = st.text(chars, min_size=1, max_size=200).filter(lambda c: bool(c.strip()))
envs = st.none() | st.dictionaries(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), st.text(chars, max_size=20), max_size=4
)


def spec_of(command: str, env: dict[str, str] | None = None) -> ShellExecSpec:
    return wire_spec(EX.resolve(ShellExecRequest(command=command, env=env)))


@given(
    method=st.sampled_from(["run", "start"]),
    client=ids,
    call=ids,
    command=commands,
    env=envs,
    acks=st.lists(ids, max_size=3).map(tuple),
)
def test_a_call_arrives_as_it_was_sent(
    method: str, client: str, call: str, command: str, env: Any, acks: tuple[str, ...]
) -> None:
    message = RunCall(client, call, spec_of(command, env), CONFIG, acks)
    got = WireDecoder().decode(WireEncoder().encode(method, message))
    assert got == (method, message)


@pytest.mark.parametrize(
    "message",
    [
        Heartbeat("c", ("a#1",), ("h#2",)),
        CallRef("c", "c#3"),
        ReadCall("c", "inc", "h#1", 4),
        None,
    ],
)
def test_other_messages_arrive_as_they_were_sent(message: object) -> None:
    assert WireDecoder().decode(WireEncoder().encode("m", message)) == ("m", message)


def test_a_repeated_spec_is_pickled_once_and_decoded_to_one_object() -> None:
    encoder, decoder = WireEncoder(), WireDecoder()
    spec = spec_of("echo hi")
    got = [
        decoder.decode(encoder.encode("run", RunCall("c", f"c#{i}", spec, CONFIG)))[1]
        for i in range(3)
    ]
    calls = [g for g in got if isinstance(g, RunCall)]
    assert [c.call_id for c in calls] == ["c#0", "c#1", "c#2"]
    assert calls[0].spec == spec
    assert calls[1].spec is calls[0].spec and calls[2].spec is calls[0].spec
    assert calls[1].config is calls[0].config
    # One blob for the spec and one for the config, made on the first call (the cache is
    # what is under test here).
    assert len(encoder._blobs) == 2
    # An equal spec in another object is another blob of the same bytes: one node object.
    other = decoder.decode(encoder.encode("run", RunCall("c", "c#9", spec_of("echo hi"), CONFIG)))
    assert isinstance(other[1], RunCall) and other[1].spec is calls[0].spec


def test_the_caches_stay_bounded() -> None:
    encoder, decoder = WireEncoder(), WireDecoder()
    for i in range(600):
        decoder.decode(encoder.encode("run", RunCall("c", f"c#{i}", spec_of(f"echo {i}"), CONFIG)))
    assert len(encoder._blobs) <= 256
    assert len(decoder._objects) <= 256


@pytest.mark.parametrize(
    "parts",
    [
        ["run", 1],
        ("run",),
        (),
        (1, 2),
        ("run", "c", "c#1", b"x", b"y"),
        ("run", "c", "c#1", "not bytes", pickle.dumps(CONFIG), ()),
        ("run", "c", "c#1", pickle.dumps(CONFIG), pickle.dumps(CONFIG), ()),  # not a spec
        ("run", "c", "c#1", pickle.dumps(spec_of("true")), pickle.dumps("cfg"), ()),
    ],
)
def test_a_malformed_message_is_refused_with_a_value_error(parts: object) -> None:
    with pytest.raises(ValueError, match="malformed message"):
        WireDecoder().decode(pickle.dumps(parts))


# -- with_signal ------------------------------------------------------------------------


def test_with_signal_is_replace_and_keeps_the_spec_checked() -> None:
    spec = spec_of("echo hi")
    signal = AbortController().signal
    copy = with_signal(spec, signal)
    assert copy == dataclasses.replace(spec, signal=signal)
    assert copy.signal is signal and spec.signal is None
    assert copy is not spec
    # Both are marked: running either does not check it again (check_spec's fast path).
    assert "_shellseam_checked" in spec.__dict__ and "_shellseam_checked" in copy.__dict__
    assert check_spec(copy) is copy
    # A field changed behind the frozen dataclass's back is seen again.
    object.__setattr__(copy, "timeout_ms", -1)
    with pytest.raises(ShellError) as err:
        check_spec(copy)
    assert err.value.code == "INVALID_REQUEST"


def test_with_signal_checks_what_it_copies() -> None:
    bad = dataclasses.replace(spec_of("true"), timeout_ms=0)
    with pytest.raises(ShellError) as err:
        with_signal(bad, None)
    assert err.value.code == "INVALID_REQUEST"
    with pytest.raises(ShellError, match="signal must be an AbortSignal"):
        with_signal(spec_of("true"), "abort")  # type: ignore[arg-type]


def test_with_signal_leaves_a_spec_with_env_unmarked() -> None:
    spec = spec_of("true", {"A": "1"})
    copy = with_signal(spec, None)
    assert copy.env == {"A": "1"}
    assert "_shellseam_checked" not in copy.__dict__
    assert check_spec(copy) is copy  # checked in full, every time


# -- the node refuses what it cannot trust --------------------------------------------------


def test_the_node_refuses_a_bad_spec_blob_every_time_it_comes() -> None:
    """A hand-made spec the client's checks never saw (here ``timeout_ms=0``) arrives as a
    blob: the node refuses it as ``INVALID_REQUEST``, and again on the next call of the same
    blob (the decoder's one object for it is never marked checked)."""
    from shellseam.ray.nodestate import NodeState
    from shellseam.ray.protocol import RunReply

    state = NodeState(node_id="n", max_running=None, lease_s=30.0, strip_env=())
    encoder, decoder = WireEncoder(), WireDecoder()
    bad = dataclasses.replace(spec_of("echo never"), timeout_ms=0)

    async def twice() -> list[object]:
        replies = []
        for i in range(2):
            _, call = decoder.decode(encoder.encode("run", RunCall("c", f"c#{i}", bad, CONFIG)))
            assert isinstance(call, RunCall)
            replies.append(await state.run(call))
        return replies

    try:
        replies = asyncio.run(twice())
    finally:
        state.dispose()
    for reply in replies:
        assert isinstance(reply, RunReply) and reply.result is None
        assert reply.fault is not None and reply.fault.code == "INVALID_REQUEST"
        assert "timeout_ms" in reply.fault.reason


def test_a_mark_that_comes_with_a_spec_is_not_trusted() -> None:
    """A spec pickled with this process's "checked" mark (here: one resolve made and marked,
    a field then changed behind its back with the mark made to match) decodes unmarked, so
    the node checks it itself and refuses it."""
    from shellseam.checks import mark_checked

    forged = EX.resolve(ShellExecRequest(command="true"))
    object.__setattr__(forged, "timeout_ms", 0)
    mark_checked(forged)  # the mark now vouches for timeout_ms=0
    assert check_spec(forged) is forged  # trusted here, by this process's own mark
    _, call = WireDecoder().decode(WireEncoder().encode("run", RunCall("c", "c#1", forged, CONFIG)))
    assert isinstance(call, RunCall)
    assert "_shellseam_checked" not in call.spec.__dict__
    with pytest.raises(ShellError) as err:
        with_signal(call.spec, None)
    assert err.value.code == "INVALID_REQUEST"

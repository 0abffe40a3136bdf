"""Properties: storage order never changes an acceptance-order replay; damage always shows as unknown."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from taskkernel.kernel.sessionlog import Rec, SessionReason, replay

PERMS = ("deploy", "merge")
SCOPES = ("prod", "staging")


@st.composite
def accepted_logs(draw: st.DrawFn, min_size: int = 1) -> list[Rec]:
    """An exported log in acceptance order: seq 1..n, every record declaring n, refusals interleaved."""
    n = draw(st.integers(min_size, 20))
    out: list[Rec] = []
    for seq in range(1, n + 1):
        kind = draw(st.sampled_from(("allow", "revoke", "message", "rollback")))
        if kind == "message":
            payload: dict[str, Any] = {"text": f"m{seq}"}
        elif kind == "rollback":
            payload = {"to_seq": draw(st.integers(0, seq - 1))}
        else:
            payload = {"permission": draw(st.sampled_from(PERMS)), "scope": draw(st.sampled_from(SCOPES))}
        if draw(st.booleans()) and draw(st.booleans()):
            out.append(Rec(None, f"refused-{seq}", "allow", {"permission": "deploy", "scope": "prod"}, False))
        out.append(Rec(seq, f"i{seq}", kind, payload, True, False, n))
    return out


def model_context(log: list[Rec], as_of: int | None = None) -> list[Rec]:
    """Straightforward reference: sort, then keep a full copy of the context after every sequence."""
    ctx_at: dict[int, list[Rec]] = {0: []}
    ctx: list[Rec] = []
    for r in sorted((r for r in log if r.accepted and (as_of is None or r.seq <= as_of)), key=lambda r: r.seq):
        ctx = list(ctx_at[r.payload["to_seq"]]) if r.kind == "rollback" else [*ctx, r]
        ctx_at[r.seq] = ctx
    return ctx


def model_permissions(ctx: list[Rec]) -> dict[tuple[str, str], str]:
    state: dict[tuple[str, str], str] = {}
    for r in ctx:
        if r.kind in ("allow", "revoke"):
            state[(r.payload["permission"], r.payload["scope"])] = "allow" if r.kind == "allow" else "deny"
    return state


storage = st.data()


@settings(max_examples=80, deadline=None)
@given(log=accepted_logs(), data=storage)
def test_any_storage_permutation_replays_identically(log: list[Rec], data: st.DataObject) -> None:
    stored = data.draw(st.permutations(log))
    for reducer in ("inputs", "permission"):
        got, want = replay(stored, reducer=reducer).to_json(), replay(log, reducer=reducer).to_json()
        assert sorted(got.pop("excluded")) == sorted(want.pop("excluded"))  # listed in storage order
        assert got == want
    result = replay(stored)
    assert result.known
    assert result.order == [r.input_id for r in sorted((r for r in log if r.accepted), key=lambda r: r.seq)]
    assert [r.input_id for r in result.state[0]] == [r.input_id for r in model_context(log)]
    perms = replay(stored, reducer="permission").state
    assert {k: v[0] for k, v in perms.items()} == model_permissions(model_context(log))


@settings(max_examples=80, deadline=None)
@given(log=accepted_logs(), data=storage)
def test_as_of_sees_exactly_the_inputs_up_to_the_cutoff(log: list[Rec], data: st.DataObject) -> None:
    n = max(r.seq for r in log if r.seq)
    cutoff = data.draw(st.integers(0, n))
    stored = data.draw(st.permutations(log))
    later = [r for r in stored if r.seq is not None and r.seq > cutoff]
    if later:  # damage after the cutoff does not matter
        victim = data.draw(st.sampled_from(later))
        stored = [r for r in stored if r is not victim]
    result = replay(stored, as_of=cutoff)
    assert result.known and result.as_of == cutoff
    assert result.order == [f"i{s}" for s in range(1, cutoff + 1)]
    assert [r.input_id for r in result.state[0]] == [r.input_id for r in model_context(log, cutoff)]


@settings(max_examples=80, deadline=None)
@given(log=accepted_logs(min_size=2), data=storage)
def test_deleting_any_sequenced_record_is_unknown(log: list[Rec], data: st.DataObject) -> None:
    stored = data.draw(st.permutations(log))
    victim = data.draw(st.sampled_from([r for r in stored if r.seq is not None]))
    damaged = [r for r in stored if r is not victim]
    result = replay(damaged)
    assert (result.status, result.reason, result.state) == ("unknown", SessionReason.MISSING_SEQUENCE, None)
    assert replay(damaged, as_of=victim.seq - 1).known  # everything before the hole is still provable


@settings(max_examples=60, deadline=None)
@given(log=accepted_logs(min_size=2), data=storage)
def test_deleting_a_record_is_unknown_even_without_declared_length(log: list[Rec], data: st.DataObject) -> None:
    bare = [r._replace(log_last_seq=None) for r in log]
    n = max(r.seq for r in bare if r.seq)
    victim = data.draw(st.sampled_from([r for r in bare if r.seq is not None and r.seq < n]))
    damaged = data.draw(st.permutations([r for r in bare if r is not victim]))
    assert replay(damaged).reason == SessionReason.MISSING_SEQUENCE


@settings(max_examples=80, deadline=None)
@given(log=accepted_logs(), data=storage)
def test_duplicating_any_sequenced_record_is_unknown(log: list[Rec], data: st.DataObject) -> None:
    original = data.draw(st.sampled_from([r for r in log if r.seq is not None]))
    copy = original if data.draw(st.booleans()) else original._replace(input_id="impostor")
    stored = data.draw(st.permutations([*log, copy]))
    result = replay(stored)
    assert (result.status, result.reason) == ("unknown", SessionReason.DUPLICATE_SEQUENCE)

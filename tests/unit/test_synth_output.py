"""Synth output files: torn-tail repair, done ids across part files, merging parts, sharding."""

from __future__ import annotations

import json

from draftsmith.synth import output
from draftsmith.synth.run import shard_of


def _rec(i):
    return {"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}


def test_repair_tail_cuts_only_a_torn_line(tmp_path):
    path = tmp_path / "o.jsonl"
    output.write(path, _rec(1))
    whole = path.read_bytes()
    output.repair_tail(path)
    assert path.read_bytes() == whole
    path.write_bytes(whole + b'{"id": "c2", "mess')
    output.repair_tail(path)
    assert path.read_bytes() == whole
    path.write_bytes(b'{"id": "c')
    output.repair_tail(path)
    assert path.read_bytes() == b""


def test_done_ids_and_merge(tmp_path):
    out = tmp_path / "o.jsonl"
    output.write(out, _rec(1))
    part0, part1 = output.part_path(out, 0), output.part_path(out, 1)
    output.write(part0, _rec(2))
    output.write(part1, _rec(1))  # a duplicate of a line already merged (crash during an earlier merge)
    output.write(part1, _rec(3))
    part1.write_bytes(part1.read_bytes() + b'{"id": "c4"')  # torn
    output.write(output.part_path(output.dropped_path(out), 0), {"id": "c5", "reason": "loop"})
    done = output.done_ids(out)
    assert set(done.kept) == {"c1", "c2", "c3"} and set(done.dropped) == {"c5"} and done.users == {"q1", "q2", "q3"}
    assert output.merge_parts(out) == 2
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["c1", "c2", "c3"]
    assert not part0.exists() and not part1.exists()
    output.merge_parts(output.dropped_path(out))
    assert json.loads(output.dropped_path(out).read_text())["reason"] == "loop"


def test_shards_are_disjoint_and_cover():
    ids = [f"gsm8k:line-{i}:s0" for i in range(200)]
    shards = [[i for i in ids if shard_of(i, 3) == r] for r in range(3)]
    assert sorted(sum(shards, [])) == sorted(ids) and all(len(s) > 40 for s in shards)
    assert all(shard_of(i, 1) == 0 for i in ids)

"""Checkpoint commit protocol and latest-selection (docs/reliability.md CK2-CK4)."""

import json

from eksflow.llm.steps.common import checkpoints


def write_files(step):
    def write(folder):
        (folder / "adapter").mkdir()
        (folder / "adapter" / "weights.bin").write_bytes(bytes([step % 256]) * 1000)
        (folder / "state.json").write_text(json.dumps({"step": step}))

    return write


def test_commit_publishes_a_verified_folder(tmp_path):
    ckpt = checkpoints.commit(tmp_path, 10, write_files(10))
    assert ckpt.path.name == "step-00000010"
    checkpoints.verify(ckpt.path)
    assert not list(tmp_path.glob(".tmp-*"))


def test_latest_selection_fixture(tmp_path):
    """CK3: step-10 complete, step-20 without manifest, step-100 complete, tmp-*, step-9 -> 100; numeric order."""
    checkpoints.commit(tmp_path, 9, write_files(9))
    checkpoints.commit(tmp_path, 10, write_files(10))
    checkpoints.commit(tmp_path, 100, write_files(100))
    partial = tmp_path / "step-00000020"
    partial.mkdir()
    (partial / "state.json").write_text("{}")
    (tmp_path / ".tmp-step-00000200-1").mkdir()
    (tmp_path / "step-20").mkdir()  # unpadded name, still numeric order: no manifest, skipped

    assert checkpoints.latest(tmp_path).step == 100

    weights = tmp_path / "step-00000100" / "adapter" / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[10] ^= 0xFF  # CK2: one flipped byte, same size
    weights.write_bytes(bytes(data))
    assert checkpoints.latest(tmp_path).step == 10


def test_prune_keeps_newest_and_never_zero(tmp_path):
    for step in (5, 10, 15, 20):
        checkpoints.commit(tmp_path, step, write_files(step))
        checkpoints.prune(tmp_path, keep=2)
        assert checkpoints.latest(tmp_path).step == step  # CK4: a complete checkpoint exists after every save
    assert [c.step for c in checkpoints.committed(tmp_path)] == [15, 20]


def test_recommit_of_same_step_replaces_it(tmp_path):
    checkpoints.commit(tmp_path, 10, write_files(10))
    checkpoints.commit(tmp_path, 10, write_files(11))
    assert checkpoints.latest(tmp_path).step == 10
    assert (tmp_path / "step-00000010" / "adapter" / "weights.bin").read_bytes()[:1] == bytes([11])

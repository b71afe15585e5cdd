"""Hostile model files and token ids on the command line: one `error:` line naming the problem, exit 2."""

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as V

from app.cli import main
from tests.synthetic import write_tiny_model

REPO = Path(__file__).parents[2]


def _one_error_line(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("rope_dims", [128, 4096])  # head size 16: these aborted / segfaulted the process
def test_rope_dims_past_the_head_size_are_refused_not_a_native_crash(tmp_path, rope_dims):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, metadata={"llama.rope.dimension_count": (rope_dims, V.UINT32)})
    run = subprocess.run([sys.executable, "-m", "app.cli", "eval", str(path), "--ids", "1,2,3"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    _one_error_line(run.stderr, "llama.rope.dimension_count", str(rope_dims))


@pytest.mark.parametrize("metadata, key", [
    ({"llama.block_count": (2**32 - 1, V.UINT32)}, "llama.block_count"),
    ({"tokenizer.ggml.bos_token_id": ("1", V.STRING)}, "tokenizer.ggml.bos_token_id"),
    ({"tokenizer.ggml.eos_token_id": (float("nan"), V.FLOAT32)}, "tokenizer.ggml.eos_token_id"),
    ({"tokenizer.ggml.merges": ([["h", "i"]], V.ARRAY)}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.token_type": (["x"] * 259, V.ARRAY)}, "tokenizer.ggml.token_type"),
])
def test_wrong_metadata_is_one_error_line_naming_the_key(tmp_path, capsys, metadata, key):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, metadata=metadata)
    assert main(["generate", str(path), "--prompt-ids", "1,2", "--max-tokens", "2"]) == 2
    _one_error_line(capsys.readouterr().err, key)


def test_deeply_nested_metadata_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "nested.gguf"
    nest = struct.pack("<IQ", 9, 1) * 100_000 + struct.pack("<IQ", 4, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9) + nest)
    assert main(["eval", str(path), "--ids", "1"]) == 2
    _one_error_line(capsys.readouterr().err, "'k' nests arrays")


@pytest.mark.parametrize("ids, shown", [("60000", "token id 60000 at position 0"), ("-5", "token id -5"),
                                        ("1,2,259", "token id 259 at position 2")])
def test_token_ids_outside_the_vocabulary_are_one_error_line(tmp_path, capsys, ids, shown):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True)
    assert main(["eval", str(path), "--ids", ids]) == 2
    _one_error_line(capsys.readouterr().err, shown, "(0..258)")
    assert main(["generate", str(path), "--prompt-ids", ids]) == 2
    _one_error_line(capsys.readouterr().err, shown)


@pytest.mark.parametrize("command", [["eval", "--ids", "1,2"], ["generate", "--prompt-ids", "1,2"]])
def test_non_finite_logits_are_one_error_line(tmp_path, capsys, command):
    path = tmp_path / "m.gguf"  # finite weights whose activations overflow
    write_tiny_model(path, "llama", tokenizer=True, fill={"output_norm.weight": 3e38})
    assert main([command[0], str(path), *command[1:]]) == 2
    captured = capsys.readouterr()
    _one_error_line(captured.err, "non-finite logits at position")
    assert captured.out == ""


def test_nan_weights_are_one_error_line_not_an_empty_reply(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, fill={"output_norm.weight": np.nan})
    assert main(["generate", str(path), "--prompt-ids", "1,2"]) == 2
    _one_error_line(capsys.readouterr().err, "'output_norm.weight' holds NaN or Inf")

import json

from app.cli import main


def test_tokenize_prints_llama_cpp_ids(model_path, capsys):
    path = str(model_path("smollm2-135m-instruct"))
    assert main(["tokenize", path, "--text", "<|im_start|>user\nHi<|im_end|>\n"]) == 0
    assert capsys.readouterr().out.strip() == "1,4093,198,26843,2,198"  # golden ids


def test_tokenize_json_and_plain_text(model_path, capsys):
    path = str(model_path("gemma-3-270m"))
    assert main(["tokenize", path, "--text", "Hello  world", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": [2, 9259, 138, 12392], "pieces": ["<bos>", "Hello", "  ", "world"]}
    assert main(["tokenize", path, "--text", "<bos>", "--no-special"]) == 0
    assert 2 not in map(int, capsys.readouterr().out.split(","))


def test_tokenize_unknown_model_is_an_error(capsys):
    assert main(["tokenize", "no-such-model", "--text", "x"]) == 2
    assert "no model" in capsys.readouterr().err

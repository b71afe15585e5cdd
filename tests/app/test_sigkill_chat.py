"""A short run of the SIGKILL loop (tests/sigkill_chat.py; run it as a script for 50+ kills): a piped,
stored `fucina chat` killed at random moments loses no committed message, keeps its database intact and
reopens from a sidecar that agrees with the stored conversation and holds the model's own KV rows."""

from tests import sigkill_chat
from tests.hybrid_models import write_qwen35_model


def test_a_stored_chat_killed_at_random_moments_loses_nothing(tmp_path, model_path):
    report = sigkill_chat.run(3, model_path("smollm2-135m-instruct"), seed=5, home=tmp_path, per_conversation=2,
                              log=lambda line: None)
    assert report.kills == 3
    assert report.ok, report.problems
    assert report.warm > 0  # the checks did reopen from sidecars


def test_a_stored_hybrid_chat_killed_at_random_moments_loses_nothing(tmp_path):
    """The same on a Gated DeltaNet hybrid (qwen35): its state checkpoints beside the sidecar resume only
    whole and with the history they read."""
    model = tmp_path / "qwen35.gguf"
    write_qwen35_model(model)
    report = sigkill_chat.run(3, model, seed=2, home=tmp_path / "home", per_conversation=2, log=lambda line: None)
    assert report.kills == 3
    assert report.ok, report.problems
    assert report.warm > 0

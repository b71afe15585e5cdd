"""A loaded model's tokenizer is built once: the model's engine service and its chat sessions share it (the
app opens both on every model it loads)."""

from engine import model_tokenizer
from engine.history.store import HistoryStore
from engine.serving.service import EngineService
from engine.serving.session import ChatSession


def test_a_models_service_and_sessions_share_one_tokenizer_built_once(tmp_path, monkeypatch):
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    monkeypatch.setenv("FUCINA_HOME", str(tmp_path / "home"))
    path = tmp_path / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True)
    model = load_model(path)
    built = []
    load = model_tokenizer.load_tokenizer
    monkeypatch.setattr(model_tokenizer, "load_tokenizer", lambda metadata: built.append(metadata) or load(metadata))
    service = EngineService(model, slots=1, capacity=64, sidecar_dir=tmp_path / "slots", open_slots_at_first_job=True)
    try:
        with HistoryStore(tmp_path / "history.db") as store:
            sessions = [ChatSession.open(store, model, sidecar_dir=tmp_path / "sidecars", run_stream=service.relay)
                        for _ in range(2)]
            assert all(s.convo.tokenizer is service.tokenizer for s in sessions)
            for session in sessions:
                session.close()
    finally:
        service.close()
    assert len(built) == 1

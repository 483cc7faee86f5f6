"""The generation worker (workers/python/generate_worker.py) over the server's shared weights,
through the official openai client (issue 30).

Tiny causal LMs made here with random weights (Llama; GPT-2 and Qwen2, whose output embeddings
are tied to their input ones; Mistral), initialised large enough that attention and positions decide the tokens (small
random weights only repeat the last token), and a
byte-level BPE tokenizer trained here with a chat template (no model hub is reachable), saved in
fp32, loaded by the server and served by a worker process. Greedy output (temperature 0) must
equal transformers' own ``generate`` at batch 1 on the same weights, token for token, streamed
or not; several streams at once (step-level batching, left padding) too; a chat goes through the
model's chat template; max_tokens, stop strings and usage are as asked. Every test runs on both
of the worker's engines: transformers' continuous batching (the default where transformers has
it) and step-level batching.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, TOKEN_B
from stack import Stack, serving_folders

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

WORKER = ROOT / "workers" / "python" / "generate_worker.py"
CORPUS = ["shared weights for many workers", "the quick brown fox jumps over the lazy dog",
          "hello world, how are you today?", "stream the tokens as they are sampled"] * 10
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PROMPTS = ["hello world", "the quick brown fox", "shared", "stream the tokens as they are sampled and more"]


def tokenizer(folder: Path) -> None:
    special = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator(CORPUS, vocab_size=320, min_frequency=1, special_tokens=special)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=trainer._tokenizer, bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(folder))


def llama(folder: Path) -> None:
    tokenizer(folder)
    config = transformers.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                                      initializer_range=0.3)
    transformers.LlamaForCausalLM(config).save_pretrained(str(folder))


def gpt2(folder: Path) -> None:
    tokenizer(folder)
    config = transformers.GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                     bos_token_id=0, eos_token_id=1, initializer_range=0.3)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(folder))


def qwen2(folder: Path) -> None:
    tokenizer(folder)
    config = transformers.Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
                                      initializer_range=0.3)
    transformers.Qwen2ForCausalLM(config).save_pretrained(str(folder))


def mistral(folder: Path) -> None:
    tokenizer(folder)
    config = transformers.MistralConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        sliding_window=None, bos_token_id=0, eos_token_id=1, initializer_range=0.3)
    transformers.MistralForCausalLM(config).save_pretrained(str(folder))


FAMILIES = {"llama": llama, "gpt2": gpt2, "qwen2": qwen2, "mistral": mistral}


ENGINES = {"continuous": "ContinuousEngine", "steps": "StepEngine"}


@pytest.fixture(scope="module", params=list(ENGINES))
def lms(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, Path]]]:
    """The four models served by one worker each, on the engine of the parameter."""
    engine = request.param
    stack = Stack(request.config.getoption("--bin"), tmp_path_factory.mktemp(f"generate-{engine}"))
    stack.engine = engine  # type: ignore[attr-defined]
    torch.manual_seed(30)
    folders = {}
    for name, make in FAMILIES.items():
        folder = stack.models / name
        folder.mkdir(parents=True)
        make(folder)
        folders[name] = folder
    for _ in serving_folders(stack, folders, WORKER, "--streams", "4", "--engine", engine):
        # The worker says which engine runs (and would have failed to start on a missing one).
        for p in stack.workers:
            assert f", {ENGINES[engine]}, " in Path(p.log_path).read_text(errors="replace"), p.log_path  # type: ignore[attr-defined]
        yield stack, folders


def client(stack: Stack):
    import openai

    return openai.OpenAI(base_url=f"{stack.http}/v1", api_key=TOKEN_B, max_retries=0, timeout=60)


def reference(folder: Path, ids: list[int], new: int) -> tuple[str, int, str]:
    """transformers' greedy ``generate`` at batch 1: the new text, its token count, and why it
    ended."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=new, do_sample=False, eos_token_id=1, pad_token_id=2)
    generated = out[0][len(ids):].tolist()
    reason = "stop" if generated and generated[-1] == 1 else "length"
    if reason == "stop":
        generated = generated[:-1]
    return tok.decode(generated, skip_special_tokens=True), len(generated), reason


def prompt_ids(folder: Path, prompt: str) -> list[int]:
    return transformers.AutoTokenizer.from_pretrained(str(folder))(prompt)["input_ids"]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_equals_generate_streamed_and_whole(lms, name: str) -> None:
    stack, folders = lms
    c = client(stack)
    wants = set()
    for prompt in PROMPTS:
        want, count, reason = reference(folders[name], prompt_ids(folders[name], prompt), 12)
        wants.add(want)
        whole = c.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
        assert whole.choices[0].text == want, (prompt, whole.choices[0].text, want)
        assert whole.choices[0].finish_reason == reason
        assert whole.usage.completion_tokens == count
        assert whole.usage.prompt_tokens == len(prompt_ids(folders[name], prompt))
        chunks = list(c.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0, stream=True))
        assert "".join(ch.choices[0].text for ch in chunks) == want, prompt
    # A model that says the same whatever the prompt would prove nothing.
    assert len(wants) == len(PROMPTS), wants


def test_concurrent_streams_each_equal_generate(lms) -> None:
    """Four streams at once run as one batch (left-padded prompts of different lengths)."""
    stack, folders = lms
    c = client(stack)
    got: dict[str, str] = {}

    def run(prompt: str) -> None:
        got[prompt] = "".join(ch.choices[0].text for ch in c.completions.create(
            model="llama", prompt=prompt, max_tokens=20, temperature=0, stream=True))

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for prompt in PROMPTS:
        want, _, _ = reference(folders["llama"], prompt_ids(folders["llama"], prompt), 20)
        assert got.get(prompt) == want, (prompt, got.get(prompt), want)


def test_chat_goes_through_the_models_template(lms) -> None:
    stack, folders = lms
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    tok = transformers.AutoTokenizer.from_pretrained(str(folders["llama"]))
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|assistant|>"), text
    want, count, _ = reference(folders["llama"], tok(text, add_special_tokens=False)["input_ids"], 10)
    r = client(stack).chat.completions.create(model="llama", messages=messages, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == want
    assert r.usage.completion_tokens == count


def test_stop_strings_and_sampling_parameters(lms) -> None:
    stack, folders = lms
    c = client(stack)
    full = c.completions.create(model="gpt2", prompt="hello", max_tokens=16, temperature=0).choices[0].text
    if len(full) < 4:
        pytest.skip(f"the random model says too little to cut: {full!r}")
    stop = full[2:4]
    cut = c.completions.create(model="gpt2", prompt="hello", max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:full.find(stop)], (full, stop, cut.choices[0].text)
    assert cut.choices[0].finish_reason == "stop"
    # Sampling: top_p and temperature are taken; a seed is repeatable on the step engine (best
    # effort under continuous batching, one random generator for the batch).
    a = c.completions.create(model="gpt2", prompt="hello", max_tokens=8, temperature=0.8, top_p=0.9, seed=7)
    b = c.completions.create(model="gpt2", prompt="hello", max_tokens=8, temperature=0.8, top_p=0.9, seed=7)
    if stack.engine == "steps":  # type: ignore[attr-defined]
        assert a.choices[0].text == b.choices[0].text
    for r in (a, b):
        assert 1 <= json.loads(r.model_dump_json())["usage"]["completion_tokens"] <= 8
    # Sampling is not greedy: a hot temperature gives some other text in a few tries.
    hot = {c.completions.create(model="gpt2", prompt="hello", max_tokens=16, temperature=2.0).choices[0].text
           for _ in range(4)}
    assert hot - {full}, hot
    # A temperature too small to divide by samples greedily, and the worker goes on.
    tiny = c.completions.create(model="gpt2", prompt="hello", max_tokens=16, temperature=1e-40)
    assert tiny.choices[0].text == full, (tiny.choices[0].text, full)
    assert c.completions.create(model="gpt2", prompt="hello", max_tokens=16, temperature=0).choices[0].text == full

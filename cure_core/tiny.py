"""Tiny random models and a byte-level tokenizer, built in-process.

Used by the tests, the benchmarks and the GPU timing script: no download, no checkpoint. The
drafter is a perturbed copy of the target, so draft acceptance is partial (neither 0 nor all).
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

# A byte-level vocabulary: ids 0-255 are bytes, then the specials.
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
BYTE_VOCAB = 256 + len(SPECIALS)
EOS_ID = 256
MASK_ID = 259

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3's rule, in small: the template thinks unless `enable_thinking` is false, in which case the
# assistant turn opens with an empty think block (the model then answers directly).
QWEN3_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def tiny_config(vocab_size: int = BYTE_VOCAB, layers: int = 2, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2, max_positions: int = 512, **extra) -> Qwen3Config:
    special = EOS_ID if vocab_size > EOS_ID else 0      # tiny test vocabularies have no specials
    return Qwen3Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=hidden // heads, max_position_embeddings=max_positions,
                       tie_word_embeddings=False, eos_token_id=special, bos_token_id=special,
                       pad_token_id=special, attn_implementation="sdpa", **extra)


def tiny_target(seed: int = 0, logit_scale: float = 4.0, **cfg) -> Qwen3ForCausalLM:
    """A random float32 target whose logits are peaked (lm_head scaled) so greedy ties are rare."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_config(**cfg)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def perturbed_copy(model: torch.nn.Module, noise: float = 0.3, seed: int = 1) -> torch.nn.Module:
    """The target with Gaussian noise (relative to each tensor's std) on every weight."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            std = p.float().std() if p.numel() > 1 else p.abs().mean()
            p.add_(torch.randn(p.shape, generator=gen) * std * noise)
    return draft.eval()


def byte_tokenizer(chat_template: str = CHAT_TEMPLATE):
    """A byte-level PreTrainedTokenizerFast with <|im_start|>/<|im_end|> specials and a chat template
    (QWEN3_CHAT_TEMPLATE: one with Qwen3's thinking switch)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    # Byte-level BPE with no merges: every byte is its own token, ids 0-255 in byte order.
    b2u = bytes_to_unicode()
    vocab = {b2u[i]: i for i in range(256)}
    for j, s in enumerate(SPECIALS):
        vocab[s] = 256 + j
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|mask|>"])
    fast.chat_template = chat_template
    return fast


def save_tiny_pair(folder: Path, seed: int = 0, noise: float = 0.3) -> tuple[Path, Path]:
    """Write a tiny target and a PARD-style drafter (perturbed copy, mask token id in its config)
    as HF folders with the byte tokenizer. Returns (target_dir, draft_dir)."""
    folder = Path(folder)
    target = tiny_target(seed=seed)
    draft = perturbed_copy(target, noise=noise, seed=seed + 1)
    draft.config.pard_token = MASK_ID
    tok = byte_tokenizer()
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        d = folder / name
        model.save_pretrained(d)
        tok.save_pretrained(d)
        paths.append(d)
    return paths[0], paths[1]

"""A tiny random Llama (head_dim 64) and a word-level tokenizer, built in memory in milliseconds:
what the CPU tests run the transformers runtime and calibration on, with no download."""

from __future__ import annotations

import torch

WORDS = ("the a of and to in is was it he she they we you that with for on as at by this had not "
         "but from or have an were which her his one all their there been would so if will when "
         "what who more no out up said about into than them can only other new some could time").split()


def tiny_config(layers: int = 2, kv_heads: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(WORDS) + 4, hidden_size=128, intermediate_size=256,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=kv_heads,
                       head_dim=64, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                       pad_token_id=2)


def tiny_model(seed: int = 0, layers: int = 2):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(layers)).eval()


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")


def tiny_text(words: int, seed: int = 0) -> str:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(WORDS), (words,), generator=gen)
    return " ".join(WORDS[i] for i in idx.tolist())


def save_tiny_checkpoint(path, seed: int = 0):
    """A Hugging Face model directory (config.json, safetensors, tokenizer) at `path`."""
    tiny_model(seed).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path

"""SmolLM2-135M-Instruct, the real pretrained model: converted weights, the engine's forward pass, and the
HF export round trip (the model is converted once per machine; see the ``smollm2`` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from opengyre.chat import ChatCodec
from opengyre.engine._runner import ModelRunner
from opengyre.models import ModelSource, export_hf, load_checkpoint


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a 135M-parameter model loaded three times on 2 shared cores
def test_converted_checkpoint_serves_chatml_with_the_engines_forward_equal_to_transformers(
    smollm2: ModelSource, tmp_path: Path
) -> None:
    assert smollm2.checkpoint is not None
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "opengyre.json"):
        assert (smollm2.checkpoint / f).is_file(), f
    model, _ = smollm2.load()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    codec = ChatCodec(smollm2.tokenizer())
    assert codec.tokenizer.convert_ids_to_tokens(codec.eos_id) == "<|im_end|>"
    text = codec.render([{"role": "user", "content": "Hi"}], gen=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = codec.encode(text)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].float()
    runner = ModelRunner(model)
    cache = runner.new_cache()
    prefill = runner.prefill(cache, ids[:-1], all_logits=True)
    step = runner.decode([cache], [ids[-1]])
    torch.testing.assert_close(prefill, ref[:-1], rtol=0, atol=1e-4)
    torch.testing.assert_close(step[0], ref[-1], rtol=0, atol=1e-4)  # the KV cache path: same logits
    assert codec.decode([int(ref[-1].argmax())]).strip()  # a pretrained model's first word, not noise

    # Export to an HF folder: transformers loads it as is and computes identical logits.
    out = export_hf(smollm2.checkpoint, tmp_path / "hf", smollm2.tokenizer_dir)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast" and "<tool_call>" in tc["chat_template"]
    assert (out / "generation_config.json").is_file()
    hf = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert (
        tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True) == text
    )
    with torch.no_grad():
        assert torch.equal(hf(input_ids=torch.tensor([ids])).logits[0].float(), ref)
    back, _ = load_checkpoint(out)  # and it is still one of our checkpoints
    assert back.config.eos_token_id == codec.eos_id

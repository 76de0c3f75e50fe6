"""tq-eval trtllm-check: the acceptance check of the TensorRT-LLM path, for a machine with
TensorRT-LLM 1.2 and a Hopper GPU.

It builds a 2-layer random Llama (8 query heads, 4 KV heads, head_dim 128) with 3-bit tables into a
real engine through tq-build's builder (tp 1, and tp 2 where two GPUs exist), runs a prefill and
32 decode steps through TensorRT-LLM's ModelRunnerCpp, and compares every logit row with the
reference runtime (transformers + TurboQuantCache, Python reference) over the same tables, fed the
engine's tokens. One PASS/FAIL line per check.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..core.errors import TQError

MODEL = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=128,
             intermediate_size=2048, num_hidden_layers=2, vocab_size=1024, max_position_embeddings=4096,
             rope_theta=10000.0, initializer_range=0.03, tie_word_embeddings=False, rms_norm_eps=1e-5)
PROMPT_TOKENS, DECODE_STEPS, TOKENS_PER_BLOCK = 150, 32, 32
# Bounds on the engine's logits (fp16 activations, the CUDA kernels) against the reference's
# (fp32, the Python reference of the same tables), as the RMS of the difference over the RMS of
# the reference logits' spread. The prefill row reads the prompt exactly (no quantization), so only
# fp16 rounding separates them: the reference itself run in fp16 is 0.0013 off (measured on this
# check's model, CPU). Decode steps read the pool: TurboQuant's scale search (FORMAT.md step 4.4)
# picks among near-equal candidates, so last-bit differences of a key change some vectors' codes;
# the fp16 reference is 0.036 off there, while the exact-cache reference is 0.38 off.
PREFILL_BOUND = 0.01
DECODE_BOUND = 0.10
# ...and the engine must be clearly closer to the quantized reference than to one with an fp16
# cache: otherwise the comparison could not tell the plugin's cache from no quantization at all.
CLOSER_FACTOR = 0.5


class Report:
    def __init__(self):
        self.failed = 0

    def line(self, ok: bool, name: str, detail: str) -> bool:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
        self.failed += not ok
        return ok


def tiny_tokenizer(vocab: int):
    """A word-level tokenizer over 't0'..'t{vocab-1}' (tq-run needs one in the engine; the check
    feeds token ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0", eos_token="t1")


def random_model(directory: Path, config: dict = MODEL):
    """The random Llama, its weights rounded to fp16 (what the engine holds), saved as a Hugging
    Face directory; returns a LoadedModel of it in float32."""
    import torch  # torch only where a check runs: tq-eval --help stays quick
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..models.checkpoint import LoadedModel
    from ..models.registry import get_family

    torch.manual_seed(2026)
    model = LlamaForCausalLM(LlamaConfig(**config)).half().float().eval()
    tokenizer = tiny_tokenizer(config["vocab_size"])
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return LoadedModel(get_family("llama"), directory, model, tokenizer)


def check_table(loaded):
    """3-bit uniform tables with a per-head key mean and scale, so that a rank given another rank's
    heads would show in the logits."""
    import torch

    from ..calibration.table import oblivious_table
    from ..models.fingerprint import fingerprint

    table = oblivious_table(fingerprint("llama", loaded.config), 3.0, 3.0, seed=11, kv_bits="3")
    gen = torch.Generator().manual_seed(5)
    h, d = table.kv_heads, table.head_dim
    for layer in table.layers:
        layer.key_mean = 0.05 * torch.randn(h, d, generator=gen)
        layer.key_scale = 0.5 + torch.rand(h, d, generator=gen)
    return table


def reference_logits(loaded, table, prompt: list[int], tokens: list[int], quantized: bool,
                     device: str = "cuda") -> torch.Tensor:
    """Logit rows of the prefill's last position and of each fed token but the last: [len(tokens), vocab]
    (the prompt's own tokens read exactly, as the plugin's context phase does; then each decode
    step reads the earlier positions through the cache, TurboQuant's or an fp16 one)."""
    import torch

    from ..eval.baselines import RoundtripCache
    from ..integrations.attention import use_turboquant_attention
    from ..integrations.cache import TurboQuantCache

    model = loaded.model.to(device)
    use_turboquant_attention(model)
    cache = (TurboQuantCache(table, backend="reference") if quantized
             else RoundtripCache("fp16", len(table.layers), table.head_dim, "exact"))  # an fp16 cache
    rows = []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True)
        rows.append(out.logits[0, -1].float().cpu())
        for t in tokens[:-1]:
            out = model(input_ids=torch.tensor([[t]], device=device), past_key_values=cache, use_cache=True)
            rows.append(out.logits[0, -1].float().cpu())
    return torch.stack(rows)


def rms(x: torch.Tensor) -> float:
    return x.double().pow(2).mean().sqrt().item()


def engine_run(engine: Path, prompt: list[int], tp: int, work: Path) -> dict:
    import torch

    prompt_file, out = work / f"prompt{tp}.json", work / f"out{tp}.npz"
    prompt_file.write_text(json.dumps(prompt))
    cmd = [sys.executable, "-m", "tq_trtllm.trtllm.check_worker", str(engine), str(prompt_file), str(out),
           str(DECODE_STEPS + 1)]
    if tp > 1:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise TQError("tp 2 needs mpirun (Open MPI, as in NVIDIA's TensorRT-LLM container)")
        cmd = [mpirun, "-n", str(tp), "--allow-run-as-root", "--oversubscribe"] + cmd
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.is_file():
        raise TQError(f"the engine run failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
    import numpy as np

    data = np.load(out)
    return {"tokens": data["tokens"].tolist(), "logits": torch.from_numpy(data["logits"])}


def pool_check(report: Report, engine: Path, table, tp: int) -> None:
    """TensorRT-LLM's own parser of config.json must give a block of exactly one packed chunk."""
    from .engine_config import layer_bytes_per_token

    try:
        from tensorrt_llm.bindings import GptJsonConfig

        parsed = GptJsonConfig.parse_file(engine / "config.json")
        mc = parsed.model_config
        size_per_head = int(mc.size_per_head)
        kv_heads = int(mc.num_kv_heads(0)) if callable(mc.num_kv_heads) else int(mc.num_kv_heads)
        tokens_per_block = int(mc.tokens_per_block)
    except Exception as err:  # noqa: BLE001 - any binding difference is a failed check, said plainly
        report.line(False, f"tp{tp} KV pool", f"GptJsonConfig could not be read: {type(err).__name__}: {err}")
        return
    bpt = layer_bytes_per_token(table, 0)
    block = kv_heads * size_per_head * tokens_per_block * 2
    chunk = kv_heads * bpt * tokens_per_block
    fp16 = kv_heads * MODEL["head_dim"] * tokens_per_block * 2
    report.line(block == chunk and kv_heads == MODEL["num_key_value_heads"] // tp, f"tp{tp} KV pool",
                f"GptJsonConfig: size_per_head {size_per_head}, {kv_heads} KV heads, {tokens_per_block} tokens "
                f"per block -> {block} bytes per block and layer side; packed chunk {chunk} bytes "
                f"({fp16 / block:.2f}x smaller than fp16's {fp16})")


def compare(report: Report, loaded, table, prompt: list[int], run: dict, tp: int, device: str = "cuda",
            steps: int = DECODE_STEPS) -> None:
    """The engine's logit rows (the prefill's, then one per decode step) against the references fed
    the same tokens: three PASS/FAIL lines."""
    tokens, logits = run["tokens"], run["logits"].float()
    if len(tokens) != steps + 1 or logits.shape[0] != steps + 1:
        report.line(False, f"tp{tp} logits", f"the engine returned {len(tokens)} tokens and {logits.shape[0]} "
                    f"logit rows, expected {steps + 1}")
        return
    ref = reference_logits(loaded, table, prompt, tokens, quantized=True, device=device)
    exact = reference_logits(loaded, table, prompt, tokens, quantized=False, device=device)
    spread = rms(ref - ref.mean(dim=-1, keepdim=True))
    prefill = rms(logits[0] - ref[0]) / spread
    decode, decode_exact = rms(logits[1:] - ref[1:]) / spread, rms(logits[1:] - exact[1:]) / spread
    greedy = sum(int(a == b) for a, b in zip(ref.argmax(-1).tolist(), tokens))
    report.line(prefill <= PREFILL_BOUND, f"tp{tp} prefill logits vs reference",
                f"RMS difference {prefill:.4f} of the logits' spread (bound {PREFILL_BOUND})")
    report.line(decode <= DECODE_BOUND, f"tp{tp} decode logits vs reference",
                f"{steps} steps: RMS difference {decode:.4f} of the logits' spread (bound {DECODE_BOUND}); "
                f"the engine's greedy tokens are the reference's argmax at {greedy}/{len(tokens)}")
    report.line(decode <= CLOSER_FACTOR * decode_exact, f"tp{tp} quantized cache in use",
                f"decode difference to the quantized reference {decode:.4f} vs to an fp16-cache reference "
                f"{decode_exact:.4f} (must be below {CLOSER_FACTOR}x)")


def run_check(keep: Path | None = None, tp_sizes: list[int] | None = None) -> int:
    """Runs every check; returns the number that failed."""
    import torch

    from .builder import TrtllmBuildOptions, build_trtllm_engine
    from .requirement import unavailable_reason

    report = Report()
    why = unavailable_reason()
    if not report.line(why is None, "TensorRT-LLM 1.2", why or "installed"):
        return report.failed
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    if not report.line(cap == (9, 0), "Hopper GPU", f"compute capability {cap} (the kernels are SM90)"):
        return report.failed
    tp_sizes = tp_sizes or ([1, 2] if torch.cuda.device_count() >= 2 else [1])
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="tq-trtllm-check-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        loaded = random_model(work / "hf")
        table = check_table(loaded)
        gen = torch.Generator().manual_seed(3)
        prompt = torch.randint(2, MODEL["vocab_size"], (PROMPT_TOKENS,), generator=gen).tolist()
        for tp in tp_sizes:
            engine = work / f"engine-tp{tp}"
            shutil.rmtree(engine, ignore_errors=True)
            try:
                build_trtllm_engine(engine, "llama", str(work / "hf"), loaded, table,
                                    TrtllmBuildOptions(tp_size=tp, max_batch_size=1,
                                                       max_seq_len=PROMPT_TOKENS + DECODE_STEPS + 8,
                                                       tokens_per_block=TOKENS_PER_BLOCK, gather_logits=True))
            except Exception as err:  # noqa: BLE001 - the build's failure is this check's result
                report.line(False, f"tp{tp} build", f"{type(err).__name__}: {err}")
                continue
            report.line(True, f"tp{tp} build", f"{tp} engine(s) in {engine}")
            pool_check(report, engine, table, tp)
            try:
                run = engine_run(engine, prompt, tp, work)
            except TQError as err:
                report.line(False, f"tp{tp} ModelRunnerCpp run", str(err))
                continue
            report.line(True, f"tp{tp} ModelRunnerCpp run", f"{PROMPT_TOKENS}-token prefill and {DECODE_STEPS} "
                        "decode steps")
            compare(report, loaded, table, prompt, run, tp)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'all checks passed' if not report.failed else f'{report.failed} check(s) failed'}", flush=True)
    return report.failed


def check_command():
    """The click command tq-eval adds as `trtllm-check`."""
    import click

    @click.command("trtllm-check", help="Acceptance check of the TensorRT-LLM 1.2 path (needs TensorRT-LLM "
                   "1.2 and a Hopper GPU): builds a 2-layer random Llama engine with the QuantizedAttention "
                   "plugin, runs it through ModelRunnerCpp and compares with the reference runtime.")
    @click.option("--keep", type=click.Path(file_okay=False), default=None,
                  help="Keep the model, engines and runs in this directory.")
    @click.option("--tp", "tp_sizes", type=click.Choice(["1", "2"]), multiple=True,
                  help="Tensor-parallel sizes to check (default: 1, and 2 where two GPUs exist).")
    def trtllm_check(keep, tp_sizes):
        failed = run_check(Path(keep) if keep else None, [int(t) for t in tp_sizes] or None)
        raise SystemExit(1 if failed else 0)

    return trtllm_check



"""vLLM rollout engine (offline `LLM`): token-id prompts, sampled log-probs, weight sync.

- Prompts go in as `TokensPrompt`s; `logprobs=0` returns the sampled token's log-prob, and
  `logprobs_mode="processed_logprobs"` makes it the log-prob under the *sampling*
  distribution (after the choice constraint, temperature and top-p), as `HFEngine` records.
- `SamplingParams.choices` becomes vLLM structured outputs `choice`: the grammar admits
  every tokenization of each string (the HF engine only the canonical one);
  `SamplingParams.grammar` becomes structured outputs `grammar` (xgrammar's EBNF).
- `update_weights` (`weight_sync="inplace"`, the default) reloads the weights in place with
  vLLM's `reload_weights`, then resets the prefix cache (its KV came from the old weights).
  On the CPU backend the linear weights are repacked at load, and a *tied* `lm_head` (the
  embeddings, as in SmolLM2 and Qwen3-0.6B) is not repacked by the reload, so we re-run
  vLLM's CPU GEMM dispatch on it; tests/test_engines.py proves the result equals
  transformers on the new weights.  On GPU the same reload is used (not tested here: this
  machine has no CUDA vLLM).  `weight_sync="rebuild"` instead saves the weights and
  re-creates the engine (slower, independent of vLLM internals).
- On CPU the engine runs in this process by default (`in_process=True`: no engine-core or
  worker subprocesses, so no spawn `__main__` guard; here a first start took ~25 s instead of
  ~75 s, and a rebuild ~6 s instead of ~60 s).
  In that mode vLLM takes the default torch.distributed group (world size 1); a trainer
  that needs its own process group should pass `in_process=False`.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

import torch

from orchestrator.engines.interface import Generation, SamplingParams
from orchestrator.engines.common import decode, row_seeds, validate_request

log = logging.getLogger(__name__)


class WorkerWeightSync:
    """Methods added to every vLLM worker (`worker_extension_cls`), called by name through
    `collective_rpc`, so nothing needs pickling across processes."""

    def refresh_tied_lm_head(self) -> None:
        """CPU worker: rebuild the packed GEMM of vocab-parallel heads (a tied lm_head).

        `reload_weights` re-processes every layer whose weights it loaded; a tied lm_head
        gets no tensors of its own, so its oneDNN handle still holds the old embeddings.
        """
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # lazy: optional (vllm), heavy
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        for module in self.model_runner.get_model().modules():
            if isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear") and module.weight.numel():
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)


@contextlib.contextmanager
def _env(values: dict[str, str]):
    """Set environment variables for the engine's start only (children started later keep ours)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class VLLMEngine:
    """`Engine` over vLLM's offline `LLM`.

    Args:
        model_path: saved model folder (config.json + safetensors).
        tokenizer: tokenizer folder; default: the model folder.
        dtype: default "float32" on CPU, else "auto".  On CPU "bfloat16" / "float16" are
            replaced by "float32" with a warning (bf16 output is garbage on this CPU backend).
        max_model_len: prompt + response tokens per sequence.
        weight_sync: "inplace" (reload into the running engine) or "rebuild" (save + restart).
        in_process: run engine core and worker in this process; default True on CPU.
        work_dir: where weights given as a state dict are saved when they must go through disk
            ("rebuild", or "inplace" across processes); default: the system temp folder.
        llm_kwargs: passed to `vllm.LLM` (e.g. gpu_memory_utilization, max_num_seqs).
    """

    def __init__(self, model_path, tokenizer=None, *, dtype: str | None = None, max_model_len: int = 4096,
                 seed: int = 0, weight_sync: str = "inplace", in_process: bool | None = None,
                 work_dir: str | None = None, **llm_kwargs):
        from vllm.platforms import current_platform  # lazy: optional (vllm), heavy

        if weight_sync not in ("inplace", "rebuild"):
            raise ValueError(f"VLLMEngine: weight_sync={weight_sync!r} must be 'inplace' or 'rebuild'")
        self.model_path = str(model_path)
        if not (Path(self.model_path) / "config.json").exists():
            raise FileNotFoundError(f"VLLMEngine: {self.model_path} has no config.json (pass a saved model folder)")
        self.tokenizer_path = str(tokenizer or model_path)
        self.on_cpu = current_platform.is_cpu()
        self.in_process = self.on_cpu if in_process is None else in_process
        self.weight_sync = weight_sync
        self.max_model_len = max_model_len
        self.work_dir = work_dir
        if dtype is not None and not isinstance(dtype, str):       # a torch.dtype
            dtype = str(dtype).removeprefix("torch.")
        if self.on_cpu and dtype in ("bfloat16", "bf16", "float16", "half", "fp16"):
            log.warning("VLLMEngine: dtype=%s on the CPU backend gives garbage output; using float32", dtype)
            dtype = "float32"
        self._llm_kwargs = {"dtype": dtype or ("float32" if self.on_cpu else "auto"), "seed": seed,
                            "max_model_len": max_model_len, "enforce_eager": self.on_cpu}
        if self.on_cpu:
            self._llm_kwargs["max_num_seqs"] = 64                # rollout batches; shorter warm-up
        self._llm_kwargs.update(llm_kwargs)
        self._llm_kwargs["logprobs_mode"] = "processed_logprobs"  # the contract: sampler log-probs
        if self.on_cpu:
            self._llm_kwargs["worker_extension_cls"] = f"{__name__}.WorkerWeightSync"
        self._saved: Path | None = None                          # our temp weights folder, if any
        self._lock = threading.Lock()
        self.llm = self._build(self.model_path)
        self.tokenizer = self.llm.get_tokenizer()
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()

    # ---------------------------------------------------------------- public API
    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 seeds: list[int | None] | None = None) -> list[Generation]:
        """Continue each prompt (token ids) once; one `Generation` per prompt, in order."""
        from vllm.inputs import TokensPrompt  # lazy: optional (vllm), heavy

        validate_request(prompts, params, self.vocab_size, self.max_model_len)
        seeds = row_seeds(params, len(prompts)) if seeds is None else list(seeds)
        if len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        with self._lock:
            outputs = self.llm.generate(requests, [self._sampling(params, s) for s in seeds], use_tqdm=False)
        return [self._generation(o.outputs[0]) for o in outputs]

    def update_weights(self, state_dict_or_path) -> None:
        """Take new weights: a state dict (HF names) or a saved model folder."""
        with self._lock:
            if self.weight_sync == "rebuild":
                self._rebuild(state_dict_or_path)
            else:
                self._reload(state_dict_or_path)

    def close(self) -> None:
        """Stop the engine (and its subprocesses) and delete saved weights."""
        with self._lock:
            self._shutdown()
            self._drop_saved()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- generation
    def _sampling(self, params: SamplingParams, seed: int | None):
        from vllm import SamplingParams as VSamplingParams  # lazy: optional (vllm), heavy
        from vllm.sampling_params import StructuredOutputsParams

        if params.unconstrained_logprobs and (params.choices or params.grammar):
            raise ValueError("VLLMEngine: unconstrained_logprobs with choices/grammar is not supported (vLLM "
                             "reports the constrained sampler's log-probs); use engine.kind: hf")
        return VSamplingParams(
            temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
            seed=seed, stop=list(params.stop), include_stop_str_in_output=True, logprobs=0,
            structured_outputs=(StructuredOutputsParams(choice=list(params.choices)) if params.choices
                                else StructuredOutputsParams(grammar=params.grammar) if params.grammar else None))

    def _generation(self, out) -> Generation:
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended a request with finish_reason={out.finish_reason!r}")
        ids = list(out.token_ids)
        logprobs = [step[t].logprob for step, t in zip(out.logprobs, ids)]
        return Generation(token_ids=ids, logprobs=logprobs, text=decode(self.tokenizer, ids),
                          finish_reason=out.finish_reason)

    # ---------------------------------------------------------------- engine life cycle
    def _build(self, weights_path: str):
        import vllm.envs  # lazy: optional (vllm), heavy
        from vllm import LLM

        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")} if self.on_cpu else {}
        kwargs = dict(self._llm_kwargs)
        if self.in_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            kwargs.setdefault("distributed_executor_backend", "uni")
        # vLLM's CPU worker replaces torch.set_num_threads for the whole process; keep ours.
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            with _env(env):
                # read the variables above afresh (vLLM caches them once an engine has started)
                getattr(vllm.envs, "disable_envs_cache", lambda: None)()
                return LLM(weights_path, tokenizer=self.tokenizer_path, **kwargs)
        finally:
            torch.set_num_threads = set_threads
            set_threads(threads)

    def _shutdown(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()

    def _rebuild(self, state_dict_or_path) -> None:
        folder = self._save(state_dict_or_path)     # replaces (deletes) our previous folder
        self._shutdown()
        self.llm = self._build(str(folder))

    def _reload(self, state_dict_or_path) -> None:
        if isinstance(state_dict_or_path, (str, Path)) or not self.in_process:
            # a folder (saved here when a state dict must cross a process boundary)
            folder = self._save(state_dict_or_path)
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_path": str(folder), "is_checkpoint_format": True})
            self._drop_saved()
        else:                                        # same process: hand the tensors over directly
            weights = ((name, t.detach()) for name, t in state_dict_or_path.items())
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_iterator": weights, "is_checkpoint_format": True})
        if self.on_cpu:
            self.llm.collective_rpc("refresh_tied_lm_head")
        self.llm.reset_prefix_cache()

    # ---------------------------------------------------------------- saved weights
    def _save(self, state_dict_or_path) -> Path:
        """A model folder holding the new weights: the given folder, or one written here."""
        if isinstance(state_dict_or_path, (str, Path)):
            folder = Path(state_dict_or_path)
            if not (folder / "config.json").exists() or not list(folder.glob("*.safetensors")):
                raise FileNotFoundError(f"update_weights: {folder} needs config.json and *.safetensors "
                                        "(write it with model.save_pretrained)")
            return folder
        from safetensors.torch import save_file  # lazy: heavy (torch)

        self._drop_saved()
        folder = Path(tempfile.mkdtemp(prefix="vllm-weights-", dir=self.work_dir))
        # clone: safetensors refuses tensors that share memory (tied embeddings)
        save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict_or_path.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
        for name in ("config.json", "generation_config.json"):
            if (Path(self.model_path) / name).exists():
                shutil.copy(Path(self.model_path) / name, folder / name)
        self._saved = folder
        return folder

    def _drop_saved(self) -> None:
        if self._saved is not None:
            shutil.rmtree(self._saved, ignore_errors=True)
            self._saved = None

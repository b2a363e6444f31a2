"""The process-group backends of the sharded RL update (`gymforge.rl.sharded`; `rl.strategy`, the accelerate
config files SFT uses): one process's rank, world and device, and how to wrap, step and save a model under `fsdp`
(torch FSDP2), `deepspeed` (accelerate's ZeRO-3) or `ddp`; `make_backend` picks this process's. Why each works the
way it does: `gymforge.rl.sharded`'s docstring, "Backends"."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from gymforge.runtime.launch import accelerate_config

log = logging.getLogger("gymforge.rl.sharded")

OPTIMIZER = "optimizer.pt"
DEEPSPEED_STATE = "optimizer_deepspeed"
STRATEGIES = ("fsdp", "deepspeed", "ddp")


def checkpoint_files(sft_checkpoint: Path, folder: Path) -> None:
    """Copy the SFT checkpoint's files a policy checkpoint keeps (tokenizer, chat template, generation config) into
    `folder`; the weights and the optimizer state are the caller's."""
    for f in Path(sft_checkpoint).iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".pt", ".png", ".jsonl")) \
                and f.name != "train_report.json":
            shutil.copy2(f, folder / f.name)


@dataclass
class Backend:
    """One process's view of the group: rank, size, device; how to wrap, step and save a model."""

    rank: int = 0
    world: int = 1
    device: Any = "cpu"
    bf16: bool = False  # compute in bf16 (CUDA GPUs that support it), fp32 master weights

    @property
    def main(self) -> bool:
        return self.rank == 0

    # loading
    def load(self, path: Path, *, trainable: bool, gradient_checkpointing: bool = False) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        dtype = torch.float32 if trainable or not self.bf16 else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        if trainable and gradient_checkpointing:
            checkpoint_activations(model)
        if not trainable:
            model.requires_grad_(False)
        return self.wrap(model, trainable=trainable)

    def wrap(self, model: Any, *, trainable: bool) -> Any:
        return model.to(self.device)

    def optimizer(self, model: Any, lr: float) -> Any:
        import torch

        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    # the step
    @contextlib.contextmanager
    def micro_step(self, model: Any, last: bool) -> Iterator[None]:
        yield

    def backward(self, model: Any, loss: Any, last: bool) -> None:
        loss.backward()

    def step(self, model: Any, optimizer: Any, max_grad_norm: float) -> float:
        import torch

        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def zero_grad(self, model: Any, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=True)

    def train(self, model: Any) -> None:
        model.train()

    # collectives
    def sum(self, values: list[float]) -> list[float]:
        return values

    def gather(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass

    def free(self) -> None:
        """Release what a deleted model held (call after dropping the last reference)."""
        import gc

        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # saving and resuming
    def state_dict(self, model: Any) -> dict[str, Any] | None:
        """The full state dict on rank 0 (None elsewhere); collective."""
        return model.state_dict()

    def optimizer_state(self, model: Any, optimizer: Any) -> dict[str, Any] | None:
        """The optimizer state in the single-process format on rank 0 (None elsewhere); collective."""
        return optimizer.state_dict()

    def load_optimizer(self, model: Any, optimizer: Any, folder: Path) -> bool:
        import torch

        path = folder / OPTIMIZER
        if not path.exists():
            return False
        optimizer.load_state_dict(torch.load(path, weights_only=True, map_location=self.device))
        return True

    def save(self, model: Any, optimizer: Any, dest: Path, tokenizer_files: Path) -> None:
        """Rank 0 writes the full checkpoint folder `dest` (atomically: a temp folder renamed); collective."""
        import torch

        state, optim = self.state_dict(model), self.optimizer_state(model, optimizer)
        if self.main:
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            checkpoint_files(tokenizer_files, tmp)
            _unwrap(model).save_pretrained(str(tmp), state_dict=state)
            torch.save(optim, tmp / OPTIMIZER)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        self.barrier()


def checkpoint_activations(model: Any) -> None:
    """Recompute each decoder layer in the backward pass (non-reentrant: works under FSDP2 and DeepSpeed)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x (the old name is deprecated)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


class _Distributed(Backend):
    """torch.distributed process group from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        local = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        super().__init__(rank=dist.get_rank(), world=dist.get_world_size(),
                         device=torch.device("cuda", local) if cuda else torch.device("cpu"),
                         bf16=cuda and torch.cuda.is_bf16_supported())

    def sum(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class DDP(_Distributed):
    """Every rank holds the whole model; gradients are all-reduced (averaged) on each minibatch's last pass."""

    def wrap(self, model: Any, *, trainable: bool) -> Any:
        from torch.nn.parallel import DistributedDataParallel

        model = model.to(self.device)
        if not trainable:
            return model
        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    @contextlib.contextmanager
    def micro_step(self, model: Any, last: bool) -> Iterator[None]:
        with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            yield

    def state_dict(self, model: Any) -> dict[str, Any] | None:
        return _unwrap(model).state_dict() if self.main else None

    def optimizer_state(self, model: Any, optimizer: Any) -> dict[str, Any] | None:
        return optimizer.state_dict() if self.main else None


class FSDP(_Distributed):
    """torch FSDP2: parameters, gradients and optimizer state sharded over the ranks (full shard)."""

    def __init__(self, layer_classes: Sequence[str] = (), reshard_after_forward: bool = True) -> None:
        # accelerate launch exports fsdp.yaml as ACCELERATE_USE_FSDP / FSDP_CPU_RAM_EFFICIENT_LOADING, on which
        # transformers loads the weights on local rank 0 only and leaves the broadcast to accelerate's prepare. Here
        # every rank loads the checkpoint (host memory: one copy per rank) and shards it itself.
        os.environ["ACCELERATE_USE_FSDP"] = "false"
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
        super().__init__()
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(self.device.type, (self.world,))
        self.layer_classes = tuple(layer_classes)
        self.reshard_after_forward = reshard_after_forward

    @classmethod
    def from_config(cls, path: Path) -> FSDP:
        """The settings of an accelerate FSDP config (`fsdp_transformer_layer_cls_to_wrap`, `fsdp_reshard_after_forward`)."""
        import yaml

        fsdp = (yaml.safe_load(Path(path).read_text()) or {}).get("fsdp_config", {})
        layers = fsdp.get("fsdp_transformer_layer_cls_to_wrap") or ""
        layers = layers.split(",") if isinstance(layers, str) else list(layers)
        return cls([c.strip() for c in layers if c.strip()], bool(fsdp.get("fsdp_reshard_after_forward", True)))

    def wrap(self, model: Any, *, trainable: bool) -> Any:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        names = set(self.layer_classes) | set(getattr(model, "_no_split_modules", None) or [])
        layers = [m for m in model.modules() if type(m).__name__ in names]
        if not layers:
            raise RuntimeError(f"FSDP: no layer of class {sorted(names)} in {type(model).__name__}: set "
                               "fsdp_transformer_layer_cls_to_wrap in the accelerate config")
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if self.bf16 and trainable else MixedPrecisionPolicy()
        for layer in layers:
            fully_shard(layer, mesh=self.mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=mp)
        fully_shard(model, mesh=self.mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=mp)
        return model

    def state_dict(self, model: Any) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.main else None

    def optimizer_state(self, model: Any, optimizer: Any) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _by_index(full, _param_names(model)) if self.main else None

    def load_optimizer(self, model: Any, optimizer: Any, folder: Path) -> bool:
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        path = folder / OPTIMIZER
        found = self.gather(path.exists())  # the same answer on every rank (one shared filesystem or not)
        if not all(found):
            return False
        full = _by_name(torch.load(path, weights_only=True, map_location="cpu"), _param_names(model)) \
            if self.main else {}
        set_optimizer_state_dict(model, optimizer, full,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        return True


def _param_names(model: Any) -> list[str]:
    """Parameter names in `model.parameters()` order (what the single-process optimizer's indices count)."""
    return [n for n, _ in model.named_parameters()]


def _by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A full optimizer state dict keyed by parameter name -> `torch.optim.Optimizer.state_dict()`'s format."""
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}


def _by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}


class DeepSpeed(Backend):
    """ZeRO-3 through accelerate (`deepspeed.yaml`, from the environment `accelerate launch` sets)."""

    def __init__(self) -> None:
        import torch
        from accelerate import Accelerator

        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        self.accelerator = Accelerator(mixed_precision="bf16" if bf16 else "no")
        plugin = self.accelerator.state.deepspeed_plugin
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
        plugin.deepspeed_config["gradient_accumulation_steps"] = 1
        plugin.set_deepspeed_weakref()  # transformers creates the models partitioned (zero3_init_flag)
        super().__init__(rank=self.accelerator.process_index, world=self.accelerator.num_processes,
                         device=self.accelerator.device, bf16=bf16)

    def load(self, path: Path, *, trainable: bool, gradient_checkpointing: bool = False) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16 if self.bf16 else torch.float32)
        if trainable and gradient_checkpointing:
            checkpoint_activations(model)
        if trainable:
            return model  # prepared with its optimizer (`optimizer`)
        from trl.models.utils import prepare_deepspeed

        model.requires_grad_(False)
        return prepare_deepspeed(model, self.accelerator)

    def optimizer(self, model: Any, lr: float) -> Any:
        raise NotImplementedError("DeepSpeed: use prepare()")

    def prepare(self, model: Any, lr: float) -> tuple[Any, Any]:
        import torch

        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        return self.accelerator.prepare(model, optimizer)

    def backward(self, model: Any, loss: Any, last: bool) -> None:
        model.set_gradient_accumulation_boundary(last)  # model: the DeepSpeedEngine
        model.backward(loss)

    def step(self, model: Any, optimizer: Any, max_grad_norm: float) -> float:
        model.step()  # clips to --gradient_clipping, steps, zeroes the gradients
        norm = model.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def zero_grad(self, model: Any, optimizer: Any) -> None:
        pass

    def sum(self, values: list[float]) -> list[float]:
        import torch

        return self.accelerator.reduce(torch.tensor(values, dtype=torch.float64, device=self.device),
                                       reduction="sum").tolist()

    def gather(self, obj: Any) -> list[Any]:
        from accelerate.utils import gather_object

        return gather_object([obj])

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def state_dict(self, model: Any) -> dict[str, Any] | None:
        state = self.accelerator.get_state_dict(model)  # gathers the 16-bit weights (zero3_save_16bit_model)
        return state if self.main else None

    def load_optimizer(self, model: Any, optimizer: Any, folder: Path) -> bool:
        if not (folder / DEEPSPEED_STATE).is_dir():
            if (folder / OPTIMIZER).exists() and self.main:
                log.warning("%s: optimizer state of another strategy; DeepSpeed starts with fresh moments", folder)
            return False
        model.load_checkpoint(str(folder / DEEPSPEED_STATE), load_module_only=False, load_module_strict=True)
        return True

    def save(self, model: Any, optimizer: Any, dest: Path, tokenizer_files: Path) -> None:
        tmp = dest.with_name(dest.name + ".tmp")
        if self.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        state = self.state_dict(model)
        model.save_checkpoint(str(tmp / DEEPSPEED_STATE))  # collective: every rank writes its partition
        if self.main:
            checkpoint_files(tokenizer_files, tmp)
            self.accelerator.unwrap_model(model).save_pretrained(str(tmp), state_dict=state)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        self.barrier()


def make_backend(strategy: str) -> Backend:
    """The backend of this process: plain (one process), or the strategy's over the launcher's process group."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        import torch

        cuda = torch.cuda.is_available()
        return Backend(device=torch.device("cuda") if cuda else torch.device("cpu"),
                       bf16=cuda and torch.cuda.is_bf16_supported())
    if strategy == "fsdp":
        return FSDP.from_config(accelerate_config("fsdp"))
    if strategy == "ddp":
        return DDP()
    if strategy == "deepspeed":
        return DeepSpeed()
    raise ValueError(f"rl.strategy: unknown strategy {strategy!r} (one of {list(STRATEGIES)})")

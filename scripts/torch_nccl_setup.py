"""One process's NCCL setup for the torch_nccl_*.py scripts (issue 19's references): its GPU
(LOCAL_RANK, as torchrun sets it), PyTorch's NCCL symmetric-memory backend where symmetric
windows are asked for (it must be chosen before any symmetric allocation), and the process
group, with its communicator made at once."""
import os

import torch
import torch.distributed as dist

GPT2_PARAMETERS = 124475904  # GPT-2 124M's parameters: the flat buffers' size


def init_nccl(windows):
    """Joins the NCCL process group on GPU LOCAL_RANK; with `windows`, PyTorch's symmetric
    memory (symm_mem.empty) comes from NCCL windows. Returns (rank, world size)."""
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    if windows:
        try:
            import torch.distributed._symmetric_memory as symm_mem
            symm_mem.set_backend("NCCL")
        except Exception as e:  # noqa: BLE001 - an older PyTorch: the window mode reports it
            print(f"symmetric memory backend: {type(e).__name__}: {e}", flush=True)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    dist.all_reduce(torch.ones(1, device="cuda"))  # the communicator, eagerly
    return dist.get_rank(), dist.get_world_size()

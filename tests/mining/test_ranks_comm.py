"""Collectives and peer memory (mining/rank_comm.py): kernel names of the libraries that ship
collectives read as (library, op), other kernels as none; allocs.jsonl intervals mapped from
another process (cuIpcOpenMemHandle, or cuMemMap of a handle cuMemImportFromShareableHandle
returned) are peer memory for exactly the launches that saw them live.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mining.rank_comm import classify_name, collective_symbols, peer_intervals, peer_words

NAMES = [
    ("_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL19ncclDevKernelArgs4K", "", ("nccl", "all_reduce")),
    ("ncclDevKernel_AllGather_RING_LL", "", ("nccl", "all_gather")),
    ("_Z44ncclDevKernel_ReduceScatter_Sum_f32_RING_SIMPLE19ncclDevKernelArgs4K", "", ("nccl", "reduce_scatter")),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "", ("nccl", "broadcast")),
    ("ncclDevKernel_SendRecv", "", ("nccl", "send_recv")),
    ("_Z21ncclDevKernel_Generic19ncclDevKernelArgs4K", "", ("nccl", "unknown")),
    ("_ZN4vllm26cross_device_reduce_2stageIfLi4EEEvPNS_8RankDataENS_11RankSignalsEPNS_6SignalEPT_ii", "",
     ("vllm_custom", "all_reduce")),
    ("_ZN4c10d16symmetric_memory26two_shot_all_reduce_kernelIN3c108BFloat16ELi16ELi8EEEvPPT_mS5_mmPPjmm", "",
     ("torch_symm_mem", "all_reduce")),
    ("x", "void c10d::symmetric_memory::multimem_all_gather_kernel<16>(char*, char*, unsigned long)",
     ("torch_symm_mem", "all_gather")),
    ("_ZN10flashinfer12trtllm_allreduce_fusion25allreduce_fusion_kernel_oneshot_lamport", "", ("flashinfer", "all_reduce")),
    ("reduce_segments", "", None),
    ("_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb0EEEvPT_PKS3_lllllS6_lfii", "", None),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "", None),
    ("_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIfNS0_11sum_functorIfffEEEEjfLi4ELi4EEEEEvT1_", "", None),
]


@pytest.mark.parametrize("symbol,name,want", NAMES)
def test_collective_names(symbol, name, want):
    assert classify_name(symbol, name) == want


def test_collective_symbols_per_distinct_symbol():
    df = pd.DataFrame({"symbol": pd.Categorical([NAMES[0][0], "reduce_segments", NAMES[0][0], NAMES[6][0]]),
                       "name": ["", "", "", ""]})
    assert collective_symbols(df) == {NAMES[0][0]: ("nccl", "all_reduce"), NAMES[6][0]: ("vllm_custom", "all_reduce")}


def _log(tmp_path, events):
    (tmp_path / "allocs.jsonl").write_text("".join(json.dumps({"result": 0, "order": k, **e}) + "\n"
                                                   for k, e in enumerate(events)) + "not json\n")
    return peer_intervals(tmp_path)


def test_peer_memory_from_ipc_and_vmm_imports(tmp_path):
    iv = _log(tmp_path, [
        {"seq_before": 0, "event": "alloc", "base": "0x7f0000000000", "size": 1 << 20},          # own memory
        {"seq_before": 0, "event": "ipc_open", "base": "0x7a0000000000", "size": 1 << 20},       # a peer's
        {"seq_before": 2, "event": "vmm_import", "base": None, "handle": "0x55"},
        {"seq_before": 2, "event": "create", "base": None, "size": 1 << 21, "handle": "0x66"},
        {"seq_before": 3, "event": "map", "base": "0x7c0000000000", "size": 1 << 21, "handle": "0x55"},  # imported
        {"seq_before": 3, "event": "map", "base": "0x7d0000000000", "size": 1 << 21, "handle": "0x66"},  # own
        {"seq_before": 5, "event": "ipc_close", "base": "0x7a0000000000"},
        {"seq_before": 6, "event": "ipc_open", "base": "0x7a1000000000", "size": 64, "result": 201},  # failed
    ])
    got = {(int(r.base), r.how, int(r.seq_from), int(r.seq_to)) for r in iv.itertuples()}
    assert got == {(0x7A0000000000, "ipc_open", 0, 5), (0x7C0000000000, "vmm_import", 3, np.iinfo(np.int64).max)}
    params = pd.DataFrame({"seq": [1, 1, 4, 6, 6, 2, 1], "i": [0, 1, 0, 0, 1, 2, 3], "at": [0, 0, 8, 0, 0, 0, 0],
                           "is_ptr": [True, True, True, True, True, True, False],
                           "value": np.array([0x7A0000000100, 0x7F0000000100, 0x7A00000FFFF8, 0x7A0000000100,
                                              0x7C0000000040, 0x7C0000000040, 0x7A0000000100], dtype=np.uint64)})
    w = peer_words(params, iv)
    # seq 1: the IPC mapping; seq 4: still it (closed at 5); seq 6: closed, but the VMM import is live;
    # seq 2: the import's map came at 3; the non-pointer row is never a peer word
    assert list(zip(w["seq"], w["i"], w["how"])) == [(1, 0, "ipc_open"), (4, 0, "ipc_open"), (6, 1, "vmm_import")]


def test_no_log_no_peer_classification(tmp_path):
    assert peer_intervals(tmp_path) is None
    assert len(peer_words(pd.DataFrame({"seq": [1], "i": [0], "at": [0], "is_ptr": [True],
                                        "value": np.array([1], np.uint64)}), None)) == 0

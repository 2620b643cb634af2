"""`simctl plan`'s `vllm serve` flags are flags of the installed vLLM (0.32), read as simctl meant them:
parsed by vLLM's own engine-argument parser."""

from __future__ import annotations

import pytest
from test_plan import FLAGS

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm")


def test_vllm_parses_the_flags_as_meant() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(FLAGS.split())
    e = AsyncEngineArgs.from_cli_args(args)
    assert (e.tensor_parallel_size, e.max_num_batched_tokens, e.max_num_seqs, e.max_model_len, e.block_size,
            e.gpu_memory_utilization, e.enable_prefix_caching, e.long_prefill_token_threshold) == (
        2, 512, 256, 4096, 16, 0.9, False, 128)


def test_the_kv_connector_is_vllms() -> None:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from simctl.plan_cmd import KV_CONNECTOR

    flag, value = KV_CONNECTOR.split(" ", 1)
    args = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args([flag, value.strip("'")])
    config = AsyncEngineArgs.from_cli_args(args).kv_transfer_config
    assert isinstance(config, KVTransferConfig) and config.kv_connector == "NixlConnector"

"""The simulator's twin of a real run (`validation.twin`): the policy a run's summary, or a started vLLM's
resolved settings, describe."""

from __future__ import annotations

from simctl.validation.twin import twin_policy, vllm_twin

# a started vLLM's settings as `VLLMServer.settings()` reports them: 257 blocks of 16 tokens, one of them the
# null block its pool never lends, so requests can hold 256 x 16 = 4096 tokens
SETTINGS = {"engine": "vllm", "vllm_version": "0", "num_gpu_blocks": 257, "block_size": 16,
            "kv_cache_tokens": 4096, "max_num_seqs": 7, "max_num_batched_tokens": 512,
            "long_prefill_token_threshold": 0, "enable_prefix_caching": 1, "max_model_len": 2048,
            "policy": "vllm-v1", "max_batch_size": 7}


def test_a_summary_gives_the_policy_its_capacity_length_and_settings() -> None:
    twin = twin_policy({"policy": "sarathi", "kv_capacity_tokens": 1000, "max_seq_len": 300,
                        "token_budget": 128, "trace": "sharegpt"})  # a key of no setting is not one
    assert twin.name == "sarathi" and twin.kv.capacity == 992  # whole blocks of 16 tokens
    assert twin.settings.token_budget == 128
    orca = twin_policy({"policy": "orca", "kv_capacity_tokens": 1000, "max_seq_len": 300})
    assert orca.kv.slots == 3  # each request reserves the max sequence length: 3 x 300 of 1000


def test_vllm_twin_holds_the_blocks_requests_can_hold_or_the_capacity_given() -> None:
    twin = vllm_twin(SETTINGS)
    assert twin.name == "vllm-v1" and twin.kv.capacity == 4096
    assert (twin.settings.max_batch_size, twin.settings.block_size, twin.settings.max_num_batched_tokens) == (
        7, 16, 512)
    assert vllm_twin(SETTINGS, 257 * 16).kv.capacity == 4112

"""The artifact's KV sizing (research/sarathi_orca_kv.py) against a hand computation for Mistral-7B on an
A100-80GB: 0.85 x 80 GiB = 73,014,444,032 bytes; weights 7,241,465,856 parameters x 2 = 14,482,931,712
bytes; activations 118,784 bytes a token (4 x 4,096 + 3 x 14,336 values of 2 bytes); a 16-token block
2,097,152 bytes (2 x 32 layers x 8 KV heads x 128 x 2 bytes x 16)."""

from research_scripts import research_module

kv = research_module("sarathi_orca_kv")


def test_vllm_profiles_one_max_length_prompt():
    # (73,014,444,032 - 14,482,931,712 - 8,192 x 118,784) // 2,097,152 = 27,446 blocks
    assert kv.artifact_kv_tokens(8192) == 27446 * 16


def test_orca_profiles_batch_times_max_length():
    # (73,014,444,032 - 14,482,931,712 - 131,072 x 118,784) // 2,097,152 = 20,486 blocks
    assert kv.artifact_kv_tokens(16 * 8192) == 20486 * 16


def test_orca_batch_128_leaves_no_kv():
    # 1,048,576 x 118,784 bytes of activations exceed the 58.5e9 left after the weights
    assert kv.artifact_kv_tokens(128 * 8192) == 0

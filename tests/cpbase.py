"""The small Llama layer the context-parallel tests share: TP 2 × CP 4 on one DGX H100 node."""

BASE = {
    "model": {"architecture": "llama", "num_hidden_layers": 2, "hidden_size": 1024,
              "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
              "vocab_size": 32000},
    "parallel": {"tensor_model_parallel_size": 2, "context_parallel_size": 4},
    "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 8192},
    "system": {"preset": "dgx-h100", "nodes": 1},
}

# Llama-2 70B as examples/llama2-70b-64-h100.yaml runs it (NVIDIA/NeMo-Framework-Launcher
# launcher_scripts/conf/training/llama/llama2_70b.yaml: TP4 + SP, PP4 interleaved one layer per
# chunk, distributed optimizer, FlashAttention, bf16; 8 nodes and global batch 1,024 as the
# example), written as Megatron-LM arguments; Llama-2's tokenizer has 32,000 tokens.
torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py \
  --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --sequence-parallel \
  --num-layers-per-virtual-pipeline-stage 1 --use-distributed-optimizer \
  --overlap-grad-reduce --overlap-param-gather --recompute-activations \
  --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \
  --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 \
  --normalization RMSNorm --position-embedding-type rope --rotary-percent 1.0 --swiglu \
  --disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0.0 \
  --hidden-dropout 0.0 --tokenizer-type Llama2Tokenizer --vocab-size 32000 \
  --make-vocab-size-divisible-by 1 --micro-batch-size 1 --global-batch-size 1024 --bf16 \
  --use-flash-attn --clip-grad 1.0 --lr 3e-4

#!/bin/bash
# NVIDIA/Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh (157006d), shortened, with
# NUM_NODES=128, --bf16 and --recompute-activations as examples/gpt3-175b-1024-a100.yaml
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NUM_NODES=128
NODE_RANK=0
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
CHECKPOINT_PATH=$1 #<Specify path>
VOCAB_FILE=$3 #<Specify path to file>/gpt2-vocab.json
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE 
    --nnodes $NUM_NODES 
    --master_addr $MASTER_ADDR 
    --master_port $MASTER_PORT
)
GPT_MODEL_ARGS=(
    --num-layers 96 
    --hidden-size 12288 
    --num-attention-heads 96 
    --seq-length 2048 
    --max-position-embeddings 2048 
    --attention-backend auto # Can use (flash/fused/unfused/local)
)
TRAINING_ARGS=(
    --micro-batch-size 1 
    --global-batch-size 1536 
    --train-iters 500000 
    --clip-grad 1.0 
    --bf16
    --recompute-activations
    --lr 6.0e-5 
)
MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 8 
	--pipeline-model-parallel-size 16 
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    --vocab-file $VOCAB_FILE --save $CHECKPOINT_PATH

# Megatron-LM's 1T row of Narayanan et al. 2021 (examples/sc21 CONFIG.sh + run_table_1.sh),
# interleaved as examples/megatron-1t-3072-a100.yaml
python -m torch.distributed.launch --nproc_per_node 8 --nnodes 384 pretrain_gpt.py \
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 64 \
  --num-layers 128 --hidden-size 25600 --num-attention-heads 160 \
  --seq-length 2048 --max-position-embeddings 2048 \
  --micro-batch-size 1 --global-batch-size 3072 \
  --num-layers-per-virtual-pipeline-stage 1 --DDP-impl local \
  --fp16 --checkpoint-activations --recompute-method uniform \
  --train-iters 100 --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine \
  --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 \
  --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --data-path my-gpt_text_document \
  --log-interval 1 --eval-iters 0

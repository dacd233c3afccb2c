#!/usr/bin/env python3
"""Megatron-LM MoE launch lines run as written (docs/megatron-flags.md).

Each configuration below is the MODEL_ARGS of one of Megatron-LM's own MoE functional tests or examples
(tests/functional_tests/test_cases/moe/*/model_config.yaml, examples/..., Megatron-LM at d98e8a64dd), expanded as
Megatron's launcher expands them (`--flag: true` becomes `--flag`), with only the sizes shrunk (layers, hidden size,
heads, sequence length, iterations, expert FFN size) and the ${...} paths pointing into a scratch directory laid
out as Megatron's CI data is (a dataset and GPT-2 vocab.json/merges.txt made here from the embedded corpus).

A configuration runs under mpirun on the ranks its layout needs and must finish its iterations. Where it uses a
feature moecore refuses, the unmodified line must be refused before any work with a message naming that feature
(`refused`: (flag, expected words, replacement)); the line with those flags replaced must then run. So nothing
passes by being refused for the wrong reason, and everything else on the line is shown to work.

With --on-gpu (a machine with a GPU; exit 77, skipped, without one), each line that runs (refused flags replaced)
runs with --device cpu and twice with --device cuda, the ranks sharing the one GPU: the GPU's losses must equal the
CPU's within 1e-2 (the lines train in bf16) and its rerun must give the same losses to the last digit logged; a
line marked cpu_only (Megatron FSDP, fp16, FP8 and the combined 1F1B schedule, refused on the GPU for now) is skipped
there, saying why.

Megatron's MoE inference and RL tests and GPT-OSS's lines (NOT_TRAINING) must be refused before any work, naming
the first flag moecore cannot take (skipped with --on-gpu).

Usage: megatron_configs.py MOECORE [--on-gpu] [--part=K/N] [NAME...]   (NAME: run only those configurations;
--part=K/N: only the configurations K, K+N, K+2N, ... of CONFIGS and NOT_TRAINING, counting from 1, so N ctests can
share the lines)
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

MOECORE = os.path.abspath(sys.argv[1])
ON_GPU = "--on-gpu" in sys.argv[2:]
PART = next((a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--part=")), "1/1")  # K/N: every Nth, from K
ONLY = set(a for a in sys.argv[2:] if a != "--on-gpu" and not a.startswith("--part="))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-x", "OMP_NUM_THREADS=1"]

# The flags every functional test of tests/functional_tests/test_cases/moe/ shares (gpt3 MoE family), shrunk:
# --num-layers 12 -> 2, --hidden-size 512 -> 64, --num-attention-heads 8 -> 4, --seq-length and
# --max-position-embeddings 1024 -> 64, --train-iters 50 -> 3, --eval-iters 10 -> 1.
GPT3_MOE_COMMON = """
--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
--log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
--micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
--timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
--data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
--vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json
--merge-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt
--split 949,50,1 --distributed-backend nccl --lr 0.00015 --lr-decay-style cosine --min-lr 1.0e-5
--weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 --log-interval 1 --eval-interval 1000 --eval-iters 1
--transformer-impl transformer_engine --deterministic-mode --no-gradient-accumulation-fusion
--attention-softmax-in-fp32 --use-mcore-models --ckpt-format torch_dist --data-cache-path ${DATA_CACHE_PATH}
--bf16 --log-memory-to-tensorboard
"""
# --ckpt-format torch_dist selects moecore's own format, listed at the start as without effect.
OWN_FORMAT = "--ckpt-format torch_dist: moecore saves and loads its own checkpoint format"
# --cuda-graph-impl transformer_engine: moecore launches every step eagerly (Megatron's rules on it are checked).
CUDA_GRAPHS = "--cuda-graph-impl transformer_engine: moecore launches every step eagerly"

# The flags Megatron FSDP's DeepSeek proxy tests share (tests/functional_tests/test_cases/moe/deepseek_proxy_fsdp_*),
# shrunk: --hidden-size 512 -> 64, --ffn-hidden-size 2048 -> 128, --num-attention-heads 8 -> 4, --kv-channels 128
# -> 16, --seq-length and --max-position-embeddings 1024 -> 64, --moe-ffn-hidden-size and
# --moe-shared-expert-intermediate-size 1024 -> 32, --q-lora-rank 256 -> 32, --kv-lora-rank 128 -> 16,
# --qk-head-dim 128 -> 16, --qk-pos-emb-head-dim 64 -> 8, --v-head-dim 128 -> 16, --train-iters and
# --exit-interval 50 -> 3, --eval-iters 10 -> 1, --save-interval 25 -> 10000; each line adds its layers, batch and
# precision.
DEEPSEEK_PROXY_FSDP = """
--distributed-timeout-minutes 60 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
--expert-model-parallel-size 2 --context-parallel-size 1 --expert-tensor-parallel-size 1 --use-distributed-optimizer
--overlap-grad-reduce --overlap-param-gather --attention-backend unfused --num-distributed-optimizer-instances 1
--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --outer-dp-sharding-strategy no_shard
--deterministic-mode --ckpt-format fsdp_dtensor --no-gradient-accumulation-fusion --use-mcore-models
--sequence-parallel --disable-bias-linear --train-iters 3 --exit-duration-in-mins 60
--no-check-for-nan-in-loss-and-grad --no-rope-fusion --manual-gc --manual-gc-interval 100
--transformer-impl transformer_engine --seq-length 64 --data-cache-path ${DATA_CACHE_PATH}
--data-path ${DATA_PATH}/text/the_pile/shard00/my-gpt3_00_text_document
--vocab-file ${DATA_PATH}/text/the_pile/shard00/bpe/vocab.json
--merge-file ${DATA_PATH}/text/the_pile/shard00/bpe/merges.txt --split 949,50,1 --hidden-size 64
--ffn-hidden-size 128 --num-attention-heads 4 --kv-channels 16 --max-position-embeddings 64
--position-embedding-type rope --rotary-base 10000 --make-vocab-size-divisible-by 64 --normalization RMSNorm
--norm-epsilon 1e-6 --swiglu --untie-embeddings-and-output-weights --multi-latent-attention --attention-dropout 0.0
--hidden-dropout 0.0 --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm --lr-warmup-fraction .01 --lr 0.00015
--min-lr 1.0e-5 --lr-decay-style cosine --adam-beta1 0.9 --adam-beta2 0.95 --num-experts 8
--moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 32 --moe-router-load-balancing-type seq_aux_loss
--moe-router-topk 4 --moe-token-dispatcher-type alltoall --moe-router-pre-softmax --moe-grouped-gemm
--moe-aux-loss-coeff 1e-4 --moe-router-group-topk 2 --moe-router-num-groups 4 --moe-router-topk-scaling-factor 2.0
--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3
--moe-router-dtype fp32 --moe-permute-fusion --q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 16
--qk-pos-emb-head-dim 8 --v-head-dim 16 --rotary-scaling-factor 1.0 --mscale 1.0 --mscale-all-dim 1.0
--eval-iters 1 --eval-interval 200 --save-interval 10000 --init-method-std 0.02 --log-timers-to-tensorboard
--log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard
--log-throughput --log-interval 1 --logging-level 10 --tensorboard-dir ${TENSORBOARD_PATH} --exit-interval 3
"""

# The MLA/MTP proxy model of the tp2_pp2_ep4 functional tests (shrunk as the lines around them are): its sizes and
# attention, then its MoE and routing, the same words in each of those lines.
MLA_PROXY_MODEL = """--hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --kv-channels 16
           --max-position-embeddings 64 --position-embedding-type rope --rotary-base 10000
           --make-vocab-size-divisible-by 3232 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
           --untie-embeddings-and-output-weights --multi-latent-attention """
MLA_PROXY_MOE = """--moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 32
           --moe-router-load-balancing-type seq_aux_loss --moe-router-topk 4 --moe-token-dispatcher-type alltoall
           --moe-router-pre-softmax --moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 2
           --moe-router-num-groups 4 --moe-router-topk-scaling-factor 2.0 --moe-router-score-function sigmoid
           --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32
           --moe-permute-fusion --q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8
           --v-head-dim 16 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0 --eval-iters 1 --eval-interval
           200 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH} --save-interval 10000 """

# Megatron FSDP trains on the CPU only for now: with --on-gpu these lines are skipped, saying so.
FSDP_CPU_ONLY = "--use-megatron-fsdp is refused on the GPU (train/config/device_support.cpp)"
FP16_CPU_ONLY = "--fp16 is refused on the GPU (train/config/device_support.cpp)"
FP8_CPU_ONLY = "--fp8-format is refused on the GPU (train/config/device_support.cpp)"
COMBINED_1F1B_CPU_ONLY = ("--overlap-moe-expert-parallel-comm without --delay-wgrad-compute (the combined 1F1B "
                          "schedule) is refused on the GPU (train/config/device_support.cpp)")

CONFIGS = [
    dict(name="tp2_ep2_sinkhorn_dist_optimizer", np=4,
         source="moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer",
         args=GPT3_MOE_COMMON + """--save-interval 10000 --tensor-model-parallel-size 2
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --sequence-parallel --num-experts 8
           --use-distributed-optimizer --moe-router-load-balancing-type sinkhorn --moe-router-topk 1
           --ckpt-fully-parallel-load --dist-ckpt-strictness log_all --attention-backend unfused
           --disable-bias-linear --no-bias-gelu-fusion --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_ep4_etp1_aux_loss", np=4, source="moe/gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4",
         args=GPT3_MOE_COMMON + """--save-interval 10000 --tensor-model-parallel-size 2
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 4 --expert-tensor-parallel-size 1
           --disable-bias-linear --sequence-parallel --num-experts 8 --moe-router-load-balancing-type aux_loss
           --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm --dist-ckpt-optim-fully-reshardable
           --dist-ckpt-strictness log_all --attention-backend unfused --no-bias-gelu-fusion --async-save
           --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_ep2_top2router", np=4, source="moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_top2router",
         args=GPT3_MOE_COMMON + """--save-interval 10000 --tensor-model-parallel-size 2
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --disable-bias-linear --sequence-parallel
           --num-experts 8 --moe-router-load-balancing-type aux_loss --moe-router-topk 2 --moe-aux-loss-coeff 1e-2
           --moe-grouped-gemm --dist-ckpt-strictness log_all --attention-backend unfused --no-bias-gelu-fusion
           --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_ep2_overlap_grad_reduce_param_gather", np=4,
         source="moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_overlap_grad_reduce_param_gather_groupedGEMM",
         args=GPT3_MOE_COMMON + """--save-interval 10000 --tensor-model-parallel-size 2
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --no-ckpt-fully-parallel-save
           --moe-grouped-gemm --disable-bias-linear --sequence-parallel --num-experts 8 --use-distributed-optimizer
           --moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --overlap-grad-reduce
           --overlap-param-gather --dist-ckpt-strictness log_all --attention-backend unfused --no-bias-gelu-fusion
           --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_ep2_ddp_average_in_collective", np=4,
         source="moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_ddp_average_in_collective",
         args=GPT3_MOE_COMMON + """--save-interval 10000 --tensor-model-parallel-size 2
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --no-ckpt-fully-parallel-save
           --moe-grouped-gemm --disable-bias-linear --sequence-parallel --num-experts 8 --use-distributed-optimizer
           --moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --overlap-grad-reduce
           --overlap-param-gather --ddp-average-in-collective --dist-ckpt-strictness log_all
           --attention-backend unfused --no-bias-gelu-fusion --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_ep2_multi_dist_optimizer_instances", np=8,  # 8 GPUs in Megatron's CI: EDP 2 for 2 instances
         source="moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_multi_dist_optimizer_instances",
         args=GPT3_MOE_COMMON + """--save-interval 50 --tensor-model-parallel-size 2
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --sequence-parallel --num-experts 8
           --use-distributed-optimizer --moe-router-load-balancing-type sinkhorn --moe-router-topk 1
           --ckpt-fully-parallel-load --use-checkpoint-opt_param-scheduler --dist-ckpt-strictness log_all
           --ckpt-assume-constant-structure --disable-bias-linear --no-bias-gelu-fusion
           --num-distributed-optimizer-instances 2 --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="ep8_allgather_muon", np=8, source="moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_muon",
         args=GPT3_MOE_COMMON + """--disable-bias-linear --save-interval 50 --tensor-model-parallel-size 1
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 8 --num-experts 8
           --moe-token-dispatcher-type allgather --moe-router-load-balancing-type aux_loss --moe-router-topk 2
           --moe-router-dtype fp32 --moe-ffn-hidden-size 128 --moe-grouped-gemm --ckpt-fully-parallel-load
           --use-checkpoint-opt_param-scheduler --ckpt-assume-constant-structure --no-bias-gelu-fusion
           --optimizer muon --muon-momentum 0.9 --muon-extra-scale-factor 0.2 --muon-scale-mode spectral
           --check-weight-hash-across-dp-replicas-interval 1 --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="ep8_allgather_dist_muon", np=8, source="moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon",
         args=GPT3_MOE_COMMON + """--disable-bias-linear --save-interval 50 --tensor-model-parallel-size 1
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 8 --num-experts 8
           --moe-token-dispatcher-type allgather --moe-router-load-balancing-type aux_loss --moe-router-topk 2
           --moe-router-dtype fp32 --moe-ffn-hidden-size 128 --moe-grouped-gemm --ckpt-fully-parallel-load
           --use-checkpoint-opt_param-scheduler --ckpt-assume-constant-structure --no-bias-gelu-fusion
           --optimizer dist_muon --muon-momentum 0.9 --muon-extra-scale-factor 0.2 --muon-scale-mode spectral
           --use-distributed-optimizer --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp1_4experts_swiglu_sinkhorn", np=2,
         source="moe/gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser",
         args=GPT3_MOE_COMMON.replace("--save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}", "") +
         """--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --expert-model-parallel-size 1
           --moe-grouped-gemm --use-transformer-engine-op-fuser --disable-bias-linear --num-experts 4
           --moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --swiglu""",
         refused=[]),
    dict(name="qwen3_30b_a3b", np=4,
         source="model flags of examples/rl/model_configs/qwen3_30b_a3b_moe.sh (48 layers, 128 experts top-8), "
                "pretraining flags of the functional tests",
         args="""--bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --expert-model-parallel-size 2
           --sequence-parallel --attention-backend flash --transformer-impl transformer_engine
           --tokenizer-type GPT2BPETokenizer --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json
           --merge-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt
           --untie-embeddings-and-output-weights --num-layers 2 --hidden-size 64 --ffn-hidden-size 192
           --num-attention-heads 4 --kv-channels 16 --max-position-embeddings 64 --group-query-attention
           --num-query-groups 2 --normalization RMSNorm --norm-epsilon 1e-6 --position-embedding-type rope
           --rotary-percent 1.0 --rotary-base 1000000 --use-rotary-position-embeddings --swiglu
           --disable-bias-linear --num-experts 16 --moe-router-topk 8 --moe-ffn-hidden-size 32
           --moe-aux-loss-coeff 0.001 --moe-router-load-balancing-type aux_loss --attention-dropout 0.0
           --hidden-dropout 0.0 --no-masked-softmax-fusion --attention-softmax-in-fp32
           --make-vocab-size-divisible-by 128 --qk-layernorm --moe-token-dispatcher-type alltoall
           --moe-layer-freq 1 --optimizer adam --adam-beta1 0.9 --adam-beta2 0.999 --adam-eps 1e-8 --lr 1e-6
           --min-lr 1e-7 --lr-warmup-samples 0 --clip-grad 1.0 --seq-length 64 --micro-batch-size 2
           --global-batch-size 8 --train-samples 24 --lr-decay-style cosine --lr-decay-samples 24
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --split 99,1,0
           --eval-iters 1 --eval-interval 1000 --log-interval 1 --log-throughput""",
         refused=[]),
    dict(name="deepseek_v3_recipe", np=4,
         source="the DeepSeek-V3 recipe of Megatron's MoE model zoo (MLA with YaRN, sigmoid group-limited routing "
                "with expert bias, shared expert, dense first layer, seq_aux_loss, MTP on the last stage, recompute "
                "mla_up_proj mlp, bf16 Adam states), shrunk to 2 layers",
         args="""--bf16 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
           --pipeline-model-parallel-layout Et|tmL --use-distributed-optimizer --transformer-impl transformer_engine
           --tokenizer-type GPT2BPETokenizer --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json
           --merge-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt
           --untie-embeddings-and-output-weights --num-layers 2 --hidden-size 64 --ffn-hidden-size 128
           --num-attention-heads 4 --max-position-embeddings 64 --multi-latent-attention --q-lora-rank 32
           --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16 --qk-layernorm
           --rotary-base 10000 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0
           --normalization RMSNorm --norm-epsilon 1e-6 --position-embedding-type rope --swiglu --disable-bias-linear
           --num-experts 8 --moe-layer-freq ([0]*1+[1]*1) --moe-ffn-hidden-size 32
           --moe-shared-expert-intermediate-size 32 --moe-router-score-function sigmoid
           --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3 --moe-router-topk 4
           --moe-router-topk-scaling-factor 2.5 --moe-router-num-groups 4 --moe-router-group-topk 2
           --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4 --moe-router-dtype fp32
           --moe-grouped-gemm --moe-permute-fusion --moe-token-dispatcher-type alltoall --mtp-num-layers 1
           --mtp-loss-scaling-factor 0.1 --recompute-granularity selective --recompute-modules mla_up_proj mlp
           --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16
           --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 128 --optimizer adam
           --adam-beta1 0.9 --adam-beta2 0.95 --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine --clip-grad 1.0
           --weight-decay 0.1 --seq-length 64 --micro-batch-size 1 --global-batch-size 8 --train-iters 3
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --split 99,1,0
           --eval-iters 1 --eval-interval 1000 --log-interval 1 --log-throughput""",
         refused=[]),
    dict(name="tp2_pp2_fp16_2experts_sinkhorn", np=4, cpu_only=FP16_CPU_ONLY,
         source="moe/gpt3_mcore_tp2_pp2_resume_torch_dist_te_2experts",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
           --timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
           --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json
           --merge-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1
           --distributed-backend nccl --lr 0.00015 --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 1e-2
           --clip-grad 1.0 --lr-warmup-fraction .01 --log-interval 1 --save-interval 50 --eval-interval 1000
           --eval-iters 1 --transformer-impl local --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
           --num-experts 2 --sequence-parallel --moe-router-load-balancing-type sinkhorn --moe-router-topk 1
           --deterministic-mode --no-gradient-accumulation-fusion --use-checkpoint-opt_param-scheduler
           --use-mcore-models --ckpt-format torch_dist --dist-ckpt-strictness log_all
           --data-cache-path ${DATA_CACHE_PATH} --fp16 --apply-query-key-layer-scaling --disable-bias-linear
           --no-bias-gelu-fusion --log-memory-to-tensorboard --async-save --use-persistent-ckpt-worker""",
         # fp16 main gradients (no --accumulate-allreduce-grads-in-fp32), as Megatron's.
         refused=[]),
    dict(name="kimi_k2_instruct", np=1,
         source="MODEL_ARGS of examples/post_training/modelopt/conf/moonshotai/Kimi-K2-Instruct.sh (61 layers, MLA, "
                "384 experts top-8, --padded-vocab-size 163840), pretraining flags of the functional tests",
         args="""--save-interval 100000 --micro-batch-size 1 --bf16 --no-masked-softmax-fusion --disable-bias-linear
           --untie-embeddings-and-output-weights --position-embedding-type rope --no-rope-fusion
           --normalization RMSNorm --swiglu --num-layers 2 --hidden-size 64 --ffn-hidden-size 128
           --num-attention-heads 4 --kv-channels 16 --multi-latent-attention --kv-lora-rank 16 --v-head-dim 16
           --q-lora-rank 32 --qk-head-dim 16 --qk-layernorm --qk-pos-emb-head-dim 8 --num-experts 8
           --moe-layer-freq [0]*1+[1]*1 --moe-ffn-hidden-size 32 --moe-router-dtype fp32
           --moe-router-score-function sigmoid --moe-router-bias-update-rate 1e-3 --moe-router-enable-expert-bias
           --moe-router-topk 2 --moe-router-pre-softmax --moe-router-topk-scaling-factor 2.827
           --moe-shared-expert-overlap --moe-shared-expert-intermediate-size 32 --moe-aux-loss-coeff 1e-4
           --moe-router-load-balancing-type seq_aux_loss --moe-token-dispatcher-type alltoall
           --moe-token-drop-policy probs --seq-length 64 --max-position-embeddings 256
           --tokenizer-type HuggingFaceTokenizer --tokenizer-model ${TOKENIZER_MODEL} --make-vocab-size-divisible-by 1
           --use-mcore-models --rotary-base 50000 --rotary-percent 1.0 --rotary-scaling-factor 32 --mscale 1.0
           --mscale-all-dim 1.0 --padded-vocab-size 1024 --recompute-activations --moe-layer-recompute
           --sequence-parallel --trust-remote-code
           --global-batch-size 4 --train-iters 3 --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --split 99,1,0
           --eval-iters 1 --eval-interval 1000 --log-interval 1""",
         refused=[]),
    # Megatron FSDP's MoE lines (--use-megatron-fsdp): ZeRO-3 with TP2 x EP2, and the DeepSeek proxies (MLA, sigmoid
    # group-limited routing with expert bias, shared experts) under EP2 x FSDP, their data where Megatron's CI keeps
    # the Pile shard (the same scratch dataset).
    dict(name="tp2_ep2_fsdp_zero3_top2router", np=4, cpu_only=FSDP_CPU_ONLY,
         source="moe/gpt3_mcore_te_tp2_zp_z3_resume_torch_dist_te_8experts2parallel_top2router",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --log-memory-to-tensorboard
           --tensorboard-dir ${TENSORBOARD_PATH} --micro-batch-size 4 --global-batch-size 32 --seq-length 64
           --max-position-embeddings 64 --train-iters 3 --timing-log-level 0 --lr-decay-iters 320000
           --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
           --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json
           --merge-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1
           --distributed-backend nccl --lr 0.00015 --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 1e-2
           --clip-grad 1.0 --lr-warmup-fraction .01 --log-interval 1 --save-interval 50 --eval-interval 1000
           --eval-iters 1 --transformer-impl transformer_engine --tensor-model-parallel-size 2
           --pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --disable-bias-linear --sequence-parallel
           --num-experts 8 --moe-router-load-balancing-type aux_loss --moe-router-topk 2 --moe-aux-loss-coeff 1e-2
           --use-megatron-fsdp --calculate-per-token-loss --data-parallel-sharding-strategy optim_grads_params
           --use-distributed-optimizer --deterministic-mode --no-gradient-accumulation-fusion --moe-grouped-gemm
           --attention-softmax-in-fp32 --use-checkpoint-opt_param-scheduler --use-mcore-models
           --ckpt-format fsdp_dtensor --dist-ckpt-optim-fully-reshardable --dist-ckpt-strictness log_all
           --data-cache-path ${DATA_CACHE_PATH} --bf16 --no-bias-gelu-fusion""",
         refused=[]),
    dict(name="deepseek_proxy_fsdp_ep2_fsdp2", np=4, cpu_only=FSDP_CPU_ONLY,
         source="moe/deepseek_proxy_fsdp_ep2_fsdp2",
         args=DEEPSEEK_PROXY_FSDP + """--num-layers 4 --moe-layer-freq ([0]*1+[1]*3) --micro-batch-size 4
           --global-batch-size 32 --fp8-format e4m3 --fp8-recipe tensorwise --fp8-param-gather""",
         refused=[]),
    dict(name="deepseek_proxy_fsdp_ep2_fsdp2_1node", np=4, cpu_only=FSDP_CPU_ONLY,
         source="moe/deepseek_proxy_fsdp_ep2_fsdp2_1node",
         args=DEEPSEEK_PROXY_FSDP + """--num-layers 2 --moe-layer-freq ([0]*1+[1]*1) --micro-batch-size 4
           --global-batch-size 32 --fp8-format e4m3 --fp8-recipe tensorwise --fp8-param-gather""",
         refused=[]),
    dict(name="deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap", np=4, cpu_only=FSDP_CPU_ONLY,
         source="moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap",
         args=DEEPSEEK_PROXY_FSDP + """--num-layers 2 --moe-layer-freq ([0]*1+[1]*1) --micro-batch-size 4
           --global-batch-size 32 --bf16 --overlap-moe-expert-parallel-comm --delay-wgrad-compute
           --megatron-fsdp-main-params-dtype fp32 --megatron-fsdp-main-grads-dtype fp32
           --megatron-fsdp-grad-comm-dtype fp32""",
         refused=[]),
    dict(name="megatron_fsdp_deepseek_v3_example", np=4, cpu_only=FSDP_CPU_ONLY,
         source="examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh "
         "(USE_MEGATRON_FSDP=1, TP 1, EP 8 -> 2, MBS 4, GBS 2048 -> 32, 61 layers -> 4 with the dense first three "
         "-> one, 256 experts -> 8 top-8 -> top-4 in 8 -> 4 groups, train samples 585937500 -> 96)",
         args="""--distributed-timeout-minutes 60 --tensor-model-parallel-size 1 --expert-model-parallel-size 2
           --expert-tensor-parallel-size 1 --context-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce
           --overlap-param-gather --use-mcore-models --sequence-parallel --use-flash-attn --disable-bias-linear
           --micro-batch-size 4 --global-batch-size 32 --train-samples 96 --exit-duration-in-mins 220
           --no-check-for-nan-in-loss-and-grad --manual-gc --manual-gc-interval 10 --recompute-granularity selective
           --recompute-modules mlp moe mla_up_proj layernorm --transformer-impl transformer_engine --seq-length 64
           --data-cache-path ${DATA_CACHE_PATH} --tokenizer-type HuggingFaceTokenizer
           --tokenizer-model deepseek-ai/DeepSeek-V3
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --split 99,1,0
           --no-mmap-bin-files --no-create-attention-mask-in-dataloader --num-workers 6 --num-layers 4
           --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --kv-channels 16
           --max-position-embeddings 64 --position-embedding-type rope --rotary-base 10000
           --make-vocab-size-divisible-by 3232 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
           --untie-embeddings-and-output-weights --multi-latent-attention --attention-dropout 0.0 --hidden-dropout 0.0
           --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm --lr-decay-samples 96 --lr-warmup-samples 32
           --lr-warmup-init 3.9e-7 --lr 3.9e-6 --min-lr 3.9e-7 --lr-decay-style cosine --adam-beta1 0.9
           --adam-beta2 0.95 --num-experts 8 --moe-layer-freq [0]*1+[1]*3 --moe-ffn-hidden-size 32
           --moe-shared-expert-intermediate-size 32 --moe-router-load-balancing-type seq_aux_loss --moe-router-topk 4
           --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-router-pre-softmax
           --moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 2 --moe-router-num-groups 4
           --moe-router-topk-scaling-factor 2.5 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
           --moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32 --moe-permute-fusion
           --moe-router-force-load-balancing --q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 16
           --qk-pos-emb-head-dim 8 --v-head-dim 16 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0
           --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 --eval-iters 1 --eval-interval 100
           --auto-detect-ckpt-format --load ${CHECKPOINT_LOAD_PATH} --save ${CHECKPOINT_SAVE_PATH}
           --save-interval 100 --dist-ckpt-strictness log_all --init-method-std 0.02 --log-timers-to-tensorboard
           --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard
           --log-throughput --log-interval 1 --logging-level 40 --tensorboard-dir ${TENSORBOARD_PATH} --bf16
           --enable-experimental --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
           --no-gradient-accumulation-fusion --use-distributed-optimizer --calculate-per-token-loss
           --init-model-with-meta-device --ckpt-format fsdp_dtensor --fsdp-double-buffer --use-nccl-ub
           --megatron-fsdp-grad-comm-dtype bf16 --megatron-fsdp-main-grads-dtype bf16""",
         # Everything on it trains; only the tokenizer, a HuggingFace hub name, is not on this offline machine.
         refused=[("--tokenizer-type", "--tokenizer-model deepseek-ai/DeepSeek-V3 does not exist",
                   "--tokenizer-type GPT2BPETokenizer "
                   "--vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json "
                   "--merge-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt"),
                  ("--tokenizer-model", "", "")]),
    dict(name="mixtral_8x7b_example", np=8, source="examples/mixtral/train_mixtral_8x7b_distributed.sh",
         args="""--use-mcore-models --disable-bias-linear --seq-length 64 --max-position-embeddings 256
           --num-layers 4 --hidden-size 64 --ffn-hidden-size 224 --num-attention-heads 4 --init-method-std 0.01
           --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope
           --swiglu --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2
           --no-masked-softmax-fusion --no-position-embedding --rotary-base 1000000 --num-experts 8
           --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
           --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce
           --tokenizer-type Llama2Tokenizer --tokenizer-model ${DATA_PATH}/tokenizer.model
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
           --split 99990,8,2 --micro-batch-size 1 --global-batch-size 8 --lr 1e-4 --train-iters 3
           --lr-decay-iters 320000 --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1
           --lr-warmup-iters 500 --clip-grad 1.0 --bf16 --tensor-model-parallel-size 1
           --pipeline-model-parallel-size 4 --expert-model-parallel-size 8 --use-distributed-optimizer
           --sequence-parallel --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1
           --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_SAVE_PATH} --tensorboard-dir ${TENSORBOARD_PATH}
           --no-load-optim --no-load-rng""",
         refused=[("--pipeline-model-parallel-size", "pipeline", "--pipeline-model-parallel-size 1"),
                  ("--tokenizer-type", "Llama2Tokenizer",
                   "--tokenizer-type GPT2BPETokenizer "
                   "--vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json "
                   "--merge-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt"),
                  ("--tokenizer-model", "", "")]),
    dict(name="deepseek_v2_lite", np=1,
         source="MODEL_ARGS of examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-V2-Lite.sh (27 layers, MLA "
                "without q-LoRA, 64 experts top-6 with shared experts), pretraining flags of the functional tests",
         args="""--save-interval 100000 --attention-dropout 0.0 --hidden-dropout 0.0 --micro-batch-size 1 --bf16
           --no-masked-softmax-fusion --disable-bias-linear --untie-embeddings-and-output-weights
           --position-embedding-type rope --no-rope-fusion --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
           --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --kv-channels 16
           --multi-latent-attention --kv-lora-rank 16 --v-head-dim 16 --qk-head-dim 16 --qk-layernorm
           --qk-pos-emb-head-dim 8 --num-experts 8 --moe-layer-freq ([0]+[1]*1) --moe-ffn-hidden-size 32
           --moe-grouped-gemm --moe-router-score-function softmax --moe-router-topk 6
           --moe-router-topk-scaling-factor 1.0 --moe-router-pre-softmax --moe-shared-expert-intermediate-size 64
           --moe-aux-loss-coeff 1e-3 --moe-token-dispatcher-type alltoall --moe-token-drop-policy probs
           --moe-router-load-balancing-type seq_aux_loss --seq-length 64 --max-position-embeddings 64
           --tokenizer-type HuggingFaceTokenizer --tokenizer-model ${TOKENIZER_MODEL}
           --make-vocab-size-divisible-by 3200
           --attention-softmax-in-fp32 --use-mcore-models --rotary-percent 1.0 --rotary-base 10000
           --rotary-scaling-factor 40 --mscale 0.707 --mscale-all-dim 0.707 --sequence-parallel
           --global-batch-size 4 --train-iters 3 --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --split 99,1,0
           --eval-iters 1 --eval-interval 1000 --log-interval 1""",
         refused=[]),
    dict(name="qwen3_235b_a22b", np=1,
         source="MODEL_ARGS of examples/post_training/modelopt/conf/Qwen/Qwen3-235B-A22B.sh (94 layers, 128 experts "
                "top-8, --moe-layer-recompute), pretraining flags of the functional tests",
         args="""--save-interval 100000 --micro-batch-size 1 --bf16 --no-masked-softmax-fusion --disable-bias-linear
           --untie-embeddings-and-output-weights --position-embedding-type rope --no-rope-fusion --normalization RMSNorm
           --swiglu --num-layers 2 --hidden-size 64 --ffn-hidden-size 192 --num-attention-heads 8
           --group-query-attention --num-query-groups 2 --kv-channels 16 --qk-layernorm --num-experts 16
           --moe-ffn-hidden-size 32 --moe-router-topk 8 --moe-router-dtype fp32 --moe-aux-loss-coeff 1e-3
           --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type aux_loss --moe-layer-recompute
           --seq-length 64 --max-position-embeddings 256 --tokenizer-type HuggingFaceTokenizer
           --tokenizer-model ${TOKENIZER_MODEL} --make-vocab-size-divisible-by 1187 --use-mcore-models
           --rotary-percent 1.0 --rotary-base 1000000 --rotary-seq-len-interpolation-factor 1
           --no-bias-swiglu-fusion --attention-dropout 0.0 --hidden-dropout 0.0 --sequence-parallel
           --global-batch-size 4 --train-iters 3 --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --split 99,1,0
           --eval-iters 1 --eval-interval 1000 --log-interval 1""",
         refused=[]),
    # The rest of Megatron's MoE functional tests (docs/launch-lines.md lists all 65 with their outcome), generated
    # from their model_config.yaml with the sizes shrunk as above (12 layers -> one per pipeline stage, VPP 4 -> 8
    # layers, the Et*3|(tt|)*6... layouts -> Et|(tt|)*2..., with --moe-layer-freq keeping one dense layer first).
    dict(name="cp2_pp2_ep2_sinkhorn_nondeterministic", np=4,
         source="moe/gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
           --timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1 --transformer-impl
           transformer_engine --context-parallel-size 2 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
           --sequence-parallel --hidden-dropout 0.0 --attention-dropout 0.0 --num-experts 4
           --moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --no-gradient-accumulation-fusion
           --use-mcore-models --ckpt-format torch_dist --dist-ckpt-strictness log_all --data-cache-path
           ${DATA_CACHE_PATH} --bf16 --attention-backend flash --disable-bias-linear --no-bias-gelu-fusion
           --log-memory-to-tensorboard --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="cp2_pp2_ep2_tp_pp_dp_mapping", np=4,
         source="moe/gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic_dp_last",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
           --timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1 --transformer-impl
           transformer_engine --context-parallel-size 2 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
           --sequence-parallel --hidden-dropout 0.0 --attention-dropout 0.0 --num-experts 4
           --moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --no-gradient-accumulation-fusion
           --use-mcore-models --ckpt-format torch_dist --dist-ckpt-optim-fully-reshardable --dist-ckpt-strictness
           log_all --data-cache-path ${DATA_CACHE_PATH} --bf16 --attention-backend flash --disable-bias-linear
           --no-bias-gelu-fusion --log-memory-to-tensorboard --use-tp-pp-dp-mapping --async-save
           --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp1_pp2_ep2_verify_integrity", np=4,
         source="moe/gpt3_mcore_te_tp1_pp2_resume_torch_dist_reshard_2x1x4_te_8experts2parallel_dist_optimizer",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
           --timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1 --transformer-impl
           transformer_engine --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2
           --expert-model-parallel-size 2 --sequence-parallel --num-experts 8 --use-distributed-optimizer
           --moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --ckpt-fully-parallel-save
           --ckpt-fully-parallel-load --no-gradient-accumulation-fusion --attention-softmax-in-fp32
           --use-checkpoint-opt_param-scheduler --use-mcore-models --ckpt-format torch_dist --dist-ckpt-strictness
           log_all --data-cache-path ${DATA_CACHE_PATH} --bf16 --disable-bias-linear --no-bias-gelu-fusion
           --log-memory-to-tensorboard --verify-integrity""",
         refused=[]),
    dict(name="tp2_ep4_etp1_a2a_overlap", np=4, cpu_only=COMBINED_1F1B_CPU_ONLY,
         source="moe/gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
           --timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1 --transformer-impl
           transformer_engine --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1
           --expert-model-parallel-size 4 --expert-tensor-parallel-size 1 --disable-bias-linear --sequence-parallel
           --num-experts 8 --moe-router-load-balancing-type aux_loss --moe-router-topk 2 --moe-aux-loss-coeff 1e-2
           --deterministic-mode --no-gradient-accumulation-fusion --moe-grouped-gemm --moe-token-dispatcher-type
           alltoall --overlap-moe-expert-parallel-comm --attention-softmax-in-fp32 --use-mcore-models --ckpt-format
           torch_dist --dist-ckpt-strictness log_all --data-cache-path ${DATA_CACHE_PATH} --bf16 --attention-backend
           unfused --no-bias-gelu-fusion --log-memory-to-tensorboard --exit-interval 3 --async-save
           --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_pp2_vpp4_ep4_mla_mtp", np=8,
         source="moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed",
         args="""--distributed-timeout-minutes 60 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
           --num-virtual-stages-per-pipeline-rank 4 --expert-model-parallel-size 4 --context-parallel-size 1
           --expert-tensor-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
           --attention-backend unfused --use-mcore-models --sequence-parallel --disable-bias-linear --micro-batch-size
           4 --global-batch-size 32 --train-iters 3 --exit-duration-in-mins 230 --no-check-for-nan-in-loss-and-grad
           --no-rope-fusion --cross-entropy-loss-fusion --cross-entropy-fusion-impl native --manual-gc
           --manual-gc-interval 100 --transformer-impl transformer_engine --seq-length 64 --data-cache-path
           ${DATA_CACHE_PATH} --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
           --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --num-layers 8
           """ + MLA_PROXY_MODEL + """ --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 --attention-dropout 0.0
           --hidden-dropout 0.0 --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm --lr-warmup-fraction 0.01 --lr
           0.00015 --min-lr 1e-05 --lr-decay-style cosine --adam-beta1 0.9 --adam-beta2 0.95 --num-experts 32
           --moe-layer-freq ([0]*1+[1]*7) """ + MLA_PROXY_MOE + """ --init-method-std 0.02 --log-timers-to-tensorboard
           --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard
           --log-throughput --log-interval 1 --logging-level 40 --tensorboard-dir ${TENSORBOARD_PATH} --bf16
           --exit-interval 3 --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_pp2_vpp4_ep4_mla_mtp_fp8", np=8, cpu_only=FP8_CPU_ONLY,
         source="moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8",
         args="""--distributed-timeout-minutes 60 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
           --num-virtual-stages-per-pipeline-rank 4 --expert-model-parallel-size 4 --context-parallel-size 1
           --expert-tensor-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
           --attention-backend unfused --use-mcore-models --sequence-parallel --disable-bias-linear --micro-batch-size
           4 --global-batch-size 32 --train-iters 3 --exit-duration-in-mins 230 --no-check-for-nan-in-loss-and-grad
           --no-rope-fusion --cross-entropy-loss-fusion --cross-entropy-fusion-impl native --manual-gc
           --manual-gc-interval 100 --transformer-impl transformer_engine --seq-length 64 --data-cache-path
           ${DATA_CACHE_PATH} --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
           --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --num-layers 8
           """ + MLA_PROXY_MODEL + """ --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 --attention-dropout 0.0
           --hidden-dropout 0.0 --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm --lr-warmup-fraction 0.01 --lr
           0.00015 --min-lr 1e-05 --lr-decay-style cosine --adam-beta1 0.9 --adam-beta2 0.95 --num-experts 32
           --moe-layer-freq ([0]*1+[1]*7) """ + MLA_PROXY_MOE + """ --init-method-std 0.02 --log-timers-to-tensorboard
           --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard
           --log-throughput --log-interval 1 --logging-level 40 --tensorboard-dir ${TENSORBOARD_PATH} --bf16
           --fp8-format hybrid --fp8-recipe tensorwise --exit-interval 3 --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_pp2_vpp4_ep4_attn_cudagraph", np=8, cpu_only=FP8_CPU_ONLY,
         source="moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_resume_torch_dist_attn_cudagraph",
         args="""--distributed-timeout-minutes 60 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
           --num-virtual-stages-per-pipeline-rank 4 --expert-model-parallel-size 4 --context-parallel-size 1
           --expert-tensor-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
           --attention-backend unfused --use-mcore-models --sequence-parallel --disable-bias-linear --micro-batch-size
           4 --global-batch-size 32 --train-iters 3 --exit-duration-in-mins 230 --no-check-for-nan-in-loss-and-grad
           --no-rope-fusion --cross-entropy-loss-fusion --cross-entropy-fusion-impl native --manual-gc
           --manual-gc-interval 100 --transformer-impl transformer_engine --seq-length 64 --data-cache-path
           ${DATA_CACHE_PATH} --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
           --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --num-layers 8
           """ + MLA_PROXY_MODEL + """ --attention-dropout 0.0 --hidden-dropout 0.0 --clip-grad 1.0 --weight-decay 0.1
           --qk-layernorm --lr-warmup-fraction 0.01 --lr 0.00015 --min-lr 1e-05 --lr-decay-style cosine --adam-beta1
           0.9 --adam-beta2 0.95 --num-experts 32 --moe-layer-freq ([0]*1+[1]*7) """ + MLA_PROXY_MOE + """
           --dist-ckpt-optim-fully-reshardable --init-method-std 0.02 --log-timers-to-tensorboard
           --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard
           --log-throughput --log-interval 1 --logging-level 40 --tensorboard-dir ${TENSORBOARD_PATH}
           --cuda-graph-impl transformer_engine --cuda-graph-modules attn --cuda-graph-warmup-steps 0 --te-rng-tracker
           --bf16 --fp8-format hybrid --fp8-recipe tensorwise --exit-interval 3 --async-save
           --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_pp2_ep4_layout_selective_recompute", np=8,
         source="moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental",
         args="""--distributed-timeout-minutes 60 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
           --expert-model-parallel-size 4 --context-parallel-size 1 --expert-tensor-parallel-size 1
           --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --attention-backend unfused
           --use-mcore-models --sequence-parallel --disable-bias-linear --micro-batch-size 4 --global-batch-size 32
           --train-iters 3 --exit-duration-in-mins 230 --no-check-for-nan-in-loss-and-grad --no-rope-fusion
           --cross-entropy-loss-fusion --cross-entropy-fusion-impl native --manual-gc --manual-gc-interval 100
           --recompute-granularity selective --recompute-modules layernorm mla_up_proj mlp moe_act --transformer-impl
           transformer_engine --seq-length 64 --data-cache-path ${DATA_CACHE_PATH} --data-path
           ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --num-layers 6
           --moe-layer-freq ([0]*1+[1]*5) --pipeline-model-parallel-layout Et|(tt|)*2tmL """ + MLA_PROXY_MODEL + """
           --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 --attention-dropout 0.0 --hidden-dropout 0.0 --clip-grad
           1.0 --weight-decay 0.1 --qk-layernorm --lr-warmup-fraction 0.01 --lr 0.00015 --min-lr 1e-05
           --lr-decay-style cosine --adam-beta1 0.9 --adam-beta2 0.95 --num-experts 32 """ + MLA_PROXY_MOE + """
           --init-method-std 0.02 --log-timers-to-tensorboard --log-memory-to-tensorboard --log-num-zeros-in-grad
           --log-params-norm --log-validation-ppl-to-tensorboard --log-throughput --log-interval 1 --logging-level 40
           --tensorboard-dir ${TENSORBOARD_PATH} --bf16 --exit-interval 3 --overlap-moe-expert-parallel-comm
           --async-save --use-persistent-ckpt-worker""",
         # Megatron's combined 1F1B schedule inside the interleaved pipeline (the layout's 4 stages on PP 2).
         cpu_only=COMBINED_1F1B_CPU_ONLY, refused=[]),
    dict(name="tp2_pp2_ep4_layout_fine_grained_offloading", np=8,
         source="moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading",
         args="""--distributed-timeout-minutes 60 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
           --expert-model-parallel-size 4 --context-parallel-size 1 --expert-tensor-parallel-size 1
           --use-distributed-optimizer --attention-backend unfused --use-mcore-models --sequence-parallel
           --disable-bias-linear --micro-batch-size 1 --global-batch-size 8 --train-iters 3 --exit-duration-in-mins
           230 --no-check-for-nan-in-loss-and-grad --no-rope-fusion --manual-gc --manual-gc-interval 100
           --recompute-granularity selective --recompute-modules layernorm mla_up_proj mlp moe_act
           --fine-grained-activation-offloading --offload-modules expert_fc1 moe_act attn_norm mlp_norm qkv_linear
           core_attn attn_proj --transformer-impl transformer_engine --seq-length 64 --data-cache-path
           ${DATA_CACHE_PATH} --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document
           --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --num-layers 5
           --moe-layer-freq ([0]*1+[1]*4) --pipeline-model-parallel-layout Et|(tt|)*2L """ + MLA_PROXY_MODEL + """
           --attention-dropout 0.0 --hidden-dropout 0.0 --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm
           --lr-warmup-fraction 0.01 --lr 0.00015 --min-lr 1e-05 --lr-decay-style cosine --adam-beta1 0.9 --adam-beta2
           0.95 --num-experts 32 """ + MLA_PROXY_MOE + """ --init-method-std 0.02 --log-timers-to-tensorboard
           --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard
           --log-throughput --log-interval 1 --logging-level 40 --tensorboard-dir ${TENSORBOARD_PATH} --bf16
           --exit-interval 3 --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp2_cp2_pp2_ep2_local", np=8,
         source="moe/gpt3_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
           --timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1 --transformer-impl
           transformer_engine --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --context-parallel-size 2
           --expert-model-parallel-size 2 --sequence-parallel --num-experts 4 --moe-router-load-balancing-type sinkhorn
           --moe-router-topk 1 --deterministic-mode --no-gradient-accumulation-fusion --use-mcore-models --ckpt-format
           torch_dist --dist-ckpt-optim-fully-reshardable --dist-ckpt-strictness log_all --data-cache-path
           ${DATA_CACHE_PATH} --bf16 --attention-backend flash --disable-bias-linear --no-bias-gelu-fusion
           --log-memory-to-tensorboard --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp4_etp2_pp2_ep2_4experts", np=8,
         source="moe/gpt3_mcore_tp2_pp2_ep2_etp2_te_4experts2parallel",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --train-iters 3
           --timing-log-level 0 --lr-decay-iters 320000 --save ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH}
           --data-path ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1 --transformer-impl local
           --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
           --expert-tensor-parallel-size 2 --sequence-parallel --num-experts 4 --moe-router-load-balancing-type
           sinkhorn --moe-router-topk 1 --deterministic-mode --no-gradient-accumulation-fusion --use-mcore-models
           --ckpt-format torch_dist --dist-ckpt-strictness log_all --data-cache-path ${DATA_CACHE_PATH} --bf16
           --attention-backend unfused --disable-bias-linear --no-bias-gelu-fusion --log-memory-to-tensorboard
           --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="tp4_etp2_pp2_ep2_scoped_cudagraph_fp8_blockwise", np=8, cpu_only=FP8_CPU_ONLY,
         source="moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph",
         args="""--num-layers 5 --hidden-size 64 --num-attention-heads 4 --mtp-num-layers 1 --micro-batch-size 2
           --global-batch-size 32 --seq-length 64 --max-position-embeddings 64 --position-embedding-type rope
           --rotary-base 10000 --untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0.0
           --hidden-dropout 0.0 --train-iters 3 --lr-decay-iters 320000 --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --transformer-impl transformer_engine --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2
           --expert-model-parallel-size 2 --expert-tensor-parallel-size 2 --pipeline-model-parallel-layout Et|(tt|)*2mL
           --sequence-parallel --num-experts 8 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
           --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type global_aux_loss --moe-router-topk 2
           --moe-router-dtype fp32 --moe-router-fusion --moe-router-enable-expert-bias --moe-router-score-function
           sigmoid --moe-router-pre-softmax --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 32
           --moe-grouped-gemm --moe-layer-freq ([0]*1+[1]*4) --moe-permute-fusion --deterministic-mode
           --no-gradient-accumulation-fusion --attention-softmax-in-fp32 --use-checkpoint-opt_param-scheduler
           --use-mcore-models --bf16 --fp8-format hybrid --fp8-recipe blockwise --first-last-layers-bf16
           --no-bias-gelu-fusion --recompute-granularity selective --recompute-modules moe_act --cuda-graph-impl
           transformer_engine --cuda-graph-modules attn mlp moe_router moe_preprocess --log-memory-to-tensorboard
           --log-params-norm --log-num-zeros-in-grad --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard
           --tensorboard-dir ${TENSORBOARD_PATH} --log-interval 1 --timing-log-level 0 --save-interval 10000
           --eval-interval 1000 --eval-iters 1 --data-path
           ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --data-cache-path
           ${DATA_CACHE_PATH} --vocab-file ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --save ${CHECKPOINT_SAVE_PATH} --load
           ${CHECKPOINT_LOAD_PATH} --ckpt-fully-parallel-load --ckpt-format torch_dist --ckpt-assume-constant-structure
           --async-save --use-persistent-ckpt-worker""",
         refused=[]),
    dict(name="ep8_alltoall_dist_optimizer", np=8,
         source="moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_optimizer",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --log-params-norm --log-num-zeros-in-grad
           --log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --tensorboard-dir ${TENSORBOARD_PATH}
           --micro-batch-size 4 --global-batch-size 32 --seq-length 64 --max-position-embeddings 64
           --disable-bias-linear --train-iters 3 --timing-log-level 0 --lr-decay-iters 320000 --save
           ${CHECKPOINT_SAVE_PATH} --load ${CHECKPOINT_LOAD_PATH} --data-path
           ${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document --vocab-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json --merge-file
           ${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt --split 949,50,1 --distributed-backend nccl
           --lr 0.00015 --lr-decay-style cosine --min-lr 1e-05 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction
           0.01 --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 1 --transformer-impl
           transformer_engine --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
           --expert-model-parallel-size 8 --num-experts 8 --use-distributed-optimizer --moe-token-dispatcher-type
           allgather --moe-router-load-balancing-type aux_loss --moe-router-topk 2 --moe-router-dtype fp32
           --moe-ffn-hidden-size 32 --moe-grouped-gemm --ckpt-fully-parallel-load --deterministic-mode
           --no-gradient-accumulation-fusion --attention-softmax-in-fp32 --use-checkpoint-opt_param-scheduler
           --use-mcore-models --ckpt-format torch_dist --ckpt-assume-constant-structure --data-cache-path
           ${DATA_CACHE_PATH} --bf16 --no-bias-gelu-fusion --log-memory-to-tensorboard --async-save --async-strategy
           mcore --use-persistent-ckpt-worker""",
         refused=[]),

]

# Lines refused whole: Megatron's MoE inference and RL functional tests (MODE inference or rl) run its inference
# scripts or its RL loop, not pretrain_gpt.py; GPT-OSS (ModelOpt's flags, then attention sinks, sliding windows and
# the clamped quick-GeGLU) is not built. Each must be refused before any work, naming the first flag it cannot take.
NOT_TRAINING = [
    dict(name="static_inference_16b_logitsmatch", np=1,
         source="moe/gpt_static_inference_tp1_pp1_ep1_16B_logitsmatch (its MODEL_ARGS' inference flags)",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
           --micro-batch-size 1 --bf16 --num-experts 4 --moe-router-topk 2 --temperature 1.0 --top_k 1
           --return-log-probs --num-tokens-to-generate 30 --output-path ${TENSORBOARD_PATH}/out.json
           --prompts "Time travel to 2008" --incoming-requests-per-sec -1""",
         refused="--temperature is a flag of Megatron's inference scripts"),
    dict(name="gpt_oss_20b", np=1,
         source="MODEL_ARGS of examples/post_training/modelopt/conf/openai/gpt-oss-20b.sh (ModelOpt's GPT-OSS mode)",
         args="""--micro-batch-size 1 --bf16 --normalization RMSNorm --num-layers 2 --hidden-size 64
           --ffn-hidden-size 64 --num-attention-heads 8 --group-query-attention --num-query-groups 2 --kv-channels 16
           --num-experts 8 --moe-ffn-hidden-size 64 --moe-router-topk 4 --seq-length 64 --max-position-embeddings 256
           --export-force-local-attention --quick-geglu --glu-linear-offset 1.0 --softmax-type learnable
           --window-attn-skip-freq 2 --enable-gpt-oss --activation-func-clamp-value 7.0 --window-size 127,0""",
         refused="--export-force-local-attention is a flag of NVIDIA ModelOpt"),
    dict(name="grpo_throughput", np=1,
         source="moe/gpt_grpo_tp8tp4_pp1_ep8ep2_dp8_throughputtest (its RL flags)",
         args="""--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
           --micro-batch-size 1 --global-batch-size 4 --mock-data --rl-use-sequence-packing
           --rl-sequence-packing-algo fifo --rl-offload-optimizer-during-inference --rl-generation-lag 0
           --grpo-group-size 2 --grpo-prompts-per-step 2 --perform-rl-step --rl-partial-rollouts""",
         refused="reinforcement learning"),
]


def expand(s, paths):
    for k, v in paths.items():
        s = s.replace("${" + k + "}", v)
    return s


def replace_flag(args, flag, replacement):
    """args without `flag` and its values, `replacement` (already split) put where it was."""
    out, i = [], 0
    while i < len(args):
        if args[i] == flag:
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                i += 1
            out += replacement
            continue
        out.append(args[i])
        i += 1
    return out


def run(cfg, args, log):
    cmd = MPIRUN + ["-np", str(cfg["np"]), MOECORE, "train"] + args
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    with open(log, "w") as f:
        f.write(" ".join(shlex.quote(a) for a in cmd) + "\n\n" + p.stdout)
    return p.returncode, p.stdout, time.time() - t0


def losses(out):
    return [float(x) for x in re.findall(r"lm loss: ([0-9.eE+-]+)", out)]


def compare_devices(cfg, args, d):
    """'' when the line trains on the GPU as on the CPU (bf16: within 1e-2) and reruns identically there."""
    runs = {}
    for tag, device in (("cpu", "cpu"), ("gpu", "cuda"), ("gpu_rerun", "cuda")):
        # Each run its own checkpoint directory, so no run resumes from another (a repeated flag takes the last value).
        ckpt = os.path.join(d, "checkpoints_" + tag)
        rc, out, _ = run(cfg, args + ["--device", device, "--save", ckpt, "--load", ckpt], os.path.join(d, tag + ".log"))
        if rc != 0 or not losses(out):
            return f"--device {device} did not train (rc {rc}); see {d}/{tag}.log"
        runs[tag] = losses(out)
    cpu, gpu, again = runs["cpu"], runs["gpu"], runs["gpu_rerun"]
    if len(cpu) != len(gpu):
        return f"{len(cpu)} losses on the CPU, {len(gpu)} on the GPU"
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, gpu))
    if worst > 1e-2:
        return f"the GPU's losses {gpu} differ from the CPU's {cpu} by {worst:.2e} (above 1e-2)"
    if gpu != again:
        return f"the GPU's rerun gave {again}, its first run {gpu}"
    return ""


def gpu_visible():
    try:
        return subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True).stdout.startswith("GPU")
    except OSError:
        return False


def make_data(work):
    """The dataset and GPT-2 vocabulary files, where Megatron's CI keeps them."""
    base = os.path.join(work, "data/text/common_pile/v01_filtered_data")
    os.makedirs(os.path.join(base, "bpe"))
    # Where Megatron FSDP's DeepSeek proxy tests read their data: the same files.
    os.makedirs(os.path.join(work, "data/text/the_pile"))
    os.symlink(base, os.path.join(work, "data/text/the_pile/shard00"))
    # FORTUNES_DIR: the fortunes where Debian's package is not installed (a GPU machine's pack, scripts/gpu-pack.sh).
    source = ["--source-dir", os.environ["FORTUNES_DIR"]] if os.environ.get("FORTUNES_DIR") else []
    subprocess.run([MOECORE, "corpus", "fortunes", "--output", os.path.join(work, "all.jsonl")] + source, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(work, "all.jsonl")) as f, open(os.path.join(work, "docs.jsonl"), "w") as g:
        g.writelines(f.readlines()[:3000])  # the vocabulary from a part; the dataset all (--split 99990,8,2)
    subprocess.run([MOECORE, "train-tokenizer", "--input", os.path.join(work, "docs.jsonl"), "--json-keys", "text",
                    "--vocab-size", "512", "--output", os.path.join(work, "tok")], check=True,
                   stdout=subprocess.DEVNULL)
    tok = json.load(open(os.path.join(work, "tok/tokenizer.json")))
    vocab = dict(tok["model"]["vocab"])
    for a in tok["added_tokens"]:
        vocab[a["content"]] = a["id"]
    json.dump(vocab, open(os.path.join(base, "bpe/vocab.json"), "w"))
    with open(os.path.join(base, "bpe/merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
        for m in tok["model"]["merges"]:
            f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
    subprocess.run([MOECORE, "preprocess", "--input", os.path.join(work, "all.jsonl"), "--output-prefix",
                    os.path.join(base, "my-gpt3_00"), "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                    os.path.join(base, "bpe/vocab.json"), "--merge-file", os.path.join(base, "bpe/merges.txt"),
                    "--append-eod", "--workers", "1"], check=True, stdout=subprocess.DEVNULL)


def main():
    if ON_GPU and not gpu_visible():
        print("megatron_configs: skipped, no GPU visible (--on-gpu)")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="moecore_megatron_configs_")
    make_data(work)
    failures = []
    k, n = (int(x) for x in PART.split("/"))
    for i, cfg in enumerate(CONFIGS + ([] if ON_GPU else NOT_TRAINING)):
        if (ONLY and cfg["name"] not in ONLY) or i % n != k - 1:
            continue
        if ON_GPU and cfg.get("cpu_only"):
            print(f"skip {cfg['name']:<42} {cfg['cpu_only']}", flush=True)
            continue
        d = os.path.join(work, cfg["name"])
        paths = {"DATA_PATH": os.path.join(work, "data"), "TOKENIZER_MODEL": os.path.join(work, "tok"),
                 "TENSORBOARD_PATH": os.path.join(d, "tensorboard"),
                 "CHECKPOINT_SAVE_PATH": os.path.join(d, "checkpoints"),
                 "CHECKPOINT_LOAD_PATH": os.path.join(d, "checkpoints"), "DATA_CACHE_PATH": os.path.join(d, "cache")}
        os.makedirs(d)
        args = shlex.split(expand(cfg["args"], paths))
        verdict = []
        if cfg in NOT_TRAINING:
            rc, out, secs = run(cfg, args, os.path.join(d, "unmodified.log"))
            if rc == 0 or cfg["refused"] not in out or re.search(r"iteration +\d+/", out):
                failures.append(f"{cfg['name']}: not refused before any work naming '{cfg['refused']}' (rc {rc}); "
                                f"see {d}/unmodified.log")
                print(f"FAIL {cfg['name']} (not training)\n" + out[-3000:], flush=True)
            else:
                print(f"ok   {cfg['name']:<42} {cfg['source']}\n     refused naming '{cfg['refused']}' ({secs:.1f} s)",
                      flush=True)
            continue
        if cfg["refused"] and ON_GPU:  # the refusals are the CPU run's business; the GPU runs the replaced line
            for flag, _, replacement in cfg["refused"]:
                args = replace_flag(args, flag, shlex.split(expand(replacement, paths)))
        elif cfg["refused"]:
            rc, out, secs = run(cfg, args, os.path.join(d, "unmodified.log"))
            named = [r for r in cfg["refused"] if r[1] and re.search(re.escape(r[1]), out)]
            if rc == 0 or not named:
                failures.append(f"{cfg['name']}: the unmodified line was not refused naming one of "
                                f"{[r[1] for r in cfg['refused'] if r[1]]} (rc {rc}); see {d}/unmodified.log")
                print(f"FAIL {cfg['name']} (unmodified)\n" + out[-3000:], flush=True)
                continue
            verdict.append(f"refused naming '{named[0][1]}' ({secs:.1f} s)")
            for flag, _, replacement in cfg["refused"]:
                args = replace_flag(args, flag, shlex.split(expand(replacement, paths)))
        if ON_GPU:
            problem = compare_devices(cfg, args, d)
            if problem:
                failures.append(f"{cfg['name']}: {problem}")
                print(f"FAIL {cfg['name']}: {problem}", flush=True)
            else:
                print(f"ok   {cfg['name']:<42} the GPU's losses equal the CPU's within 1e-2, rerun identical",
                      flush=True)
            continue
        rc, out, secs = run(cfg, args, os.path.join(d, "run.log"))
        iters = re.findall(r"iteration +(\d+)/ +(\d+)", out)
        if rc != 0 or not iters or iters[-1][0] != iters[-1][1]:
            failures.append(f"{cfg['name']}: did not finish (rc {rc}); see {d}/run.log")
            print(f"FAIL {cfg['name']}\n" + out[-4000:], flush=True)
            continue
        if "torch_dist" in args and OWN_FORMAT not in out:
            failures.append(f"{cfg['name']}: --ckpt-format torch_dist not listed as without effect; see {d}/run.log")
            print(f"FAIL {cfg['name']} (no-effect listing)\n" + out[-3000:], flush=True)
            continue
        if "--cuda-graph-impl" in args and CUDA_GRAPHS not in out:
            failures.append(f"{cfg['name']}: --cuda-graph-impl not listed as without effect; see {d}/run.log")
            print(f"FAIL {cfg['name']} (no-effect listing)\n" + out[-3000:], flush=True)
            continue
        verdict.append(f"trained {iters[-1][0]} iterations on {cfg['np']} ranks ({secs:.1f} s)")
        print(f"ok   {cfg['name']:<42} {cfg['source']}\n     " + "; then ".join(verdict), flush=True)
    if failures:
        print("\n".join(["FAILED:"] + failures))
        sys.exit(1)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()

export FI_EFA_FORK_SAFE=1
export FI_EFA_USE_DEVICE_RDMA=1
export FI_PROVIDER=efa
export MALLOC_ARENA_MAX=128
export NEURON_CC_FLAGS='--model-type=transformer --cache_dir=results/neuron-compile-cache'
export NEURON_FUSE_SOFTMAX=1
export NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=7
export PYTHONPATH=neuronx-distributed/examples/training/llama/tp_pp_llama_hf_pretrain:neuronx-distributed/examples/training/llama
export XLA_DISABLE_FUNCTIONALIZATION=0
export XLA_DOWNCAST_BF16=1
srun --overlap --kill-on-bad-exit=1 --nodes=16 --ntasks=16 --ntasks-per-node=1 --cpus-per-task=128 python -m llmpipe launch --node-task --nnodes 16 --nproc-per-node 64 --master trn1-1:44000 -- neuronx-distributed/examples/training/llama/tp_pp_llama_hf_pretrain/run_llama_nxd.py --training_dir results/default/data/views/hf/train --training_config results/default/checkpoints/init --tensor_parallel_size 32 --pipeline_parallel_size 8 --virtual_pipeline_size 1 --kv_replicator 4 --qkv_linear 1 --fuse_qkv 1 --num_microbatches 256 --train_batch_size 256 --seq_len 8192 --max_steps 30000 --lr 1.5e-05 --min_lr 1e-06 --warmup_steps 2000 --constant_steps 0 --beta1 0.9 --beta2 0.95 --weight_decay 0.01 --seed 1234 --use_zero1_optimizer 1 --use_fp32_optimizer 0 --use_meta_device_init 1 --use_selective_checkpoint 1 --use_sequence_parallel 1 --use_flash_attention 1 --checkpoint_dir results/default/checkpoints/neuron/nxd --checkpoint_freq 1000 --num_kept_checkpoint 2 --loading_step latest_if_exists --pretrained_weight 1 --save_load_xser 1 --tb_dir results/default/train/tensorboard --metrics_file results/default/train/nxd_metrics.json --logging_interval 10

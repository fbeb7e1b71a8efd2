export FI_EFA_FORK_SAFE=1
export FI_EFA_USE_DEVICE_RDMA=1
export FI_PROVIDER=efa
export MALLOC_ARENA_MAX=64
export NEURON_CC_FLAGS='--model-type=transformer --cache_dir=results/neuron-compile-cache'
export NEURON_FUSE_SOFTMAX=1
export NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=3
export PYTHONPATH=neuronx-distributed/examples/training/llama/tp_zero1_llama_hf_pretrain:neuronx-distributed/examples/training/llama
export XLA_DISABLE_FUNCTIONALIZATION=0
srun --overlap --kill-on-bad-exit=1 --nodes=4 --ntasks=4 --ntasks-per-node=1 --cpus-per-task=128 neuron_parallel_compile python -m llmpipe launch --node-task --nnodes 4 --nproc-per-node 32 --master trn1-1:44000 -- neuronx-distributed/examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py --model_path results/default/checkpoints/init --data_dir results/default/data/views/hf/train --output_dir results/default/train/tensorboard --metrics_file results/default/train/nxd_metrics.json --tensor_parallel_size 8 --kv_replicator 1 --fuse_qkv 1 --use_flash_attention 1 --batch_size 1 --grad_accum_usteps 64 --seq_len 4096 --max_steps 10000 --steps_this_run 10 --lr 0.0003 --warmup_steps 100 --beta1 0.9 --beta2 0.999 --weight_decay 0.01 --seed 1234 --checkpoint_dir results/default/checkpoints/neuron/nxd --checkpoint_freq -1 --num_kept_checkpoint 2 --loading_step latest_if_exists --logging_interval 10 --use_mix_precision --use_zero_1 --sequence_parallel_enabled --selective_checkpoint_enabled --pretrained_weight --print_grad_norm

"""AWS Trainium backend: neuronx-distributed (NxD) Llama trainer (run_llama_nxd.py, tp/pp family).

layout   NxD layout (tp, pp, kv replication, QKV module choice) checked against the model
shard    HF checkpoint -> NxD pretrained_weight rank files (streaming, one rank file at a time)
xser     reader of NxD training checkpoints (xser reference file + .tensors folder, or torch.save)
merge    NxD rank files (a training step or the pretrained shards) -> HF safetensors + config + tokenizer
commands the precompile (neuron_parallel_compile) and training commands: env, flags, srun + torchrun
"""

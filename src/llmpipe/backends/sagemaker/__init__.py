"""Backend "sagemaker": train on Amazon SageMaker with plain boto3 (no SageMaker SDK).

Mode "algorithm" (A): a marketplace pre-training algorithm (AlgorithmName ARN) reading the lit-gpt
packed view; mode "image" (B): a PyTorch container image running this package's torch trainer on the
hf view. Modules: aws (clients, S3 URIs), validate (AWS limits from botocore's model, checked before
any call), hyperparameters (mode A mapping, job names), upload (view -> S3, skip same sha256), jobs
(create or attach, wait + tail logs, stop, download), entry (mode B, inside the container), litgpt
(lit-gpt checkpoint -> HF Llama).
"""

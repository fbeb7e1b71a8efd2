"""Backend views, each built from the token store by one module: `hf` (Arrow, for torch / NxD /
ColossalAI), `litgpt` (PackedDataset .bin files, for the SageMaker marketplace algorithm) and
`megatron` (indexed .bin/.idx documents, for Megatron-LM / NeMo)."""

FORMATS = ("hf", "litgpt", "megatron")
